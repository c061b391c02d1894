"""Decisive mismatches: verifier rejections that no rephrasing can rescue, so the judge never sees them.

A rejection is decisive when the answer and the reference are both in a form the verifier fully understands:

- `relaxed`, `numeric`: the candidate and every reference parse as numbers and no reference is within the
  verifier's tolerance of the candidate (percent readings and units ignored: "12 kg" against "12 m" is not
  decisive, it is a question for the judge);
- a row with options (under every verifier: it is multiple choice, see `rsgen.verifiers.frame`), and `mc`: the
  candidate names one option -- its letter alone ("B", "(b)") or the whole text of one option -- every reference
  names one too, and they differ.

Anything else (words, a number against text, `exact`, `math`) is undecided: a differently phrased right answer
is possible, and that is what the judge is for. The numbers are read with the verifiers' own parser and
tolerances, and the verifier itself must reject the pair, so "decisive" can never overrule a match.
"""

from __future__ import annotations

from rsgen.verifiers.decision import Decision
from rsgen.verifiers.inputs import check_inputs
from rsgen.verifiers.mc import reference_letter
from rsgen.verifiers.normalize import Number, text_info, value_pairs
from rsgen.verifiers.numeric import DEFAULT_TOLERANCE
from rsgen.verifiers.registry import compare
from rsgen.verifiers.relaxed import RELATIVE_TOLERANCE, within

NUMERIC_VERIFIERS = ("relaxed", "numeric")
LETTER_VERIFIERS = ("mc",)


def decisive_mismatch(
    verifier: str,
    candidate: str | None,
    references: str | list[str],
    *,
    options: list[str] | None = None,
    numeric_tolerance: float | None = None,
) -> bool:
    """Whether verifier `verifier`'s rejection of `candidate` (the extracted answer) against `references` is final:
    see the module docstring. False for a match, for bad input and for every other verifier."""
    multiple_choice = bool(options) or verifier in LETTER_VERIFIERS
    if verifier not in NUMERIC_VERIFIERS and not multiple_choice:
        return False
    refs = check_inputs(candidate, references)
    if type(refs) is Decision:  # no answer or bad input: not a comparison at all
        return False
    if compare(verifier, candidate, list(refs), options=options, numeric_tolerance=numeric_tolerance).match:
        return False
    if multiple_choice:
        letter = reference_letter(candidate, options)  # a letter alone, or exactly one option's text
        ref_letters = [reference_letter(ref, options) for ref in refs]
        return letter is not None and None not in ref_letters and letter not in ref_letters
    number = text_info(candidate)[1]
    if number is None:
        return False
    for ref in refs:
        ref_number = text_info(ref)[1]
        if ref_number is None or _agree(verifier, number, ref_number, numeric_tolerance):
            return False
    return True


def _without_units(number: Number) -> Number:
    return number._replace(currency="", unit="")


def _agree(verifier: str, candidate: Number, reference: Number, numeric_tolerance: float | None) -> bool:
    """Whether the values agree within the verifier's tolerance, whatever units or currency either side states."""
    if verifier == "relaxed":
        return within(_without_units(candidate), _without_units(reference), RELATIVE_TOLERANCE)
    tolerance = DEFAULT_TOLERANCE if numeric_tolerance is None else numeric_tolerance
    return any(abs(p - r) <= tolerance * max(1.0, abs(r)) for p, r in value_pairs(candidate, reference))
