"""`relaxed` -- ChartQA relaxed accuracy, with the cases the official code leaves open decided.

The official rule: if prediction and reference both parse as numbers, the prediction is correct within 5%
relative tolerance of the reference; otherwise the two strings must be equal after lowercasing, trimming
and dropping a trailing period (`rsgen.verifiers.normalize.normalize_text`).

Decisions where the official code (`float()` plus a '%' -> /100 rule) is silent or accidental:

- Numbers are read by `rsgen.verifiers.normalize.parse_number`: thousands separators ("1,000" = 1000), a
  leading '+' ("+5" = 5), currency signs, exponents. "nan"/"inf" are text, not numbers.
- Tolerance is relative to the reference and inclusive: |pred - ref| <= 0.05 * |ref|.
- Reference 0: a relative tolerance of 0 is empty, so the prediction must be exactly 0 ("0", "0.0", "-0",
  "0%"). (The official code falls back to string equality there, so "0.0" failed against "0".)
- Percent: when exactly one side has a percent sign, the same-scale reading ("45%" vs "45") and the
  fraction reading ("45%" vs "0.45") both count. When both or neither have one, values compare as written.
  (The official code divides only the side with the sign by 100, so "45%" failed against "45".)
- Trailing units ("12 kg", "5 million", "30 years") and currency signs: a side that omits the unit matches
  on the number; when both sides state a unit (or currency), the units must be equal, else the pair is
  compared as strings. A unit is at most three short words; "5 apples, not 6" is not a number, nor is a
  number with another answer glued on as its "unit" ("10twoCORRECT", "10 two": rejected for the reference 10).
- Several references (a list): the prediction matches if it matches any of them.
- Formatting around an answer is not part of it: markdown emphasis, `$...$`, a whole-answer `\\text{...}`,
  runs of whitespace (see `normalize_text`).
"""

from __future__ import annotations

from rsgen.verifiers.decision import WRONG_ANSWER, Decision, accepted, rejected
from rsgen.verifiers.frame import verifier
from rsgen.verifiers.normalize import Number, _info_cache, text_info, units_compatible, value_pairs

RELATIVE_TOLERANCE = 0.05
_FLOAT_SLACK = 1e-9  # so that 105 vs 100 is inside 5% despite binary floating point
_BOUND = RELATIVE_TOLERANCE + _FLOAT_SLACK


def within(prediction: Number, reference: Number, tolerance: float) -> bool:
    """Whether two parsed numbers agree within relative `tolerance` of the reference (see module docstring)."""
    if not units_compatible(prediction, reference):
        return False
    bound = tolerance + _FLOAT_SLACK
    for p, r in value_pairs(prediction, reference):
        if r == 0.0:
            if p == 0.0:
                return True
        elif abs(p - r) <= bound * abs(r):
            return True
    return False


@verifier
def relaxed(
    prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds
) -> Decision:
    """ChartQA relaxed accuracy of an extracted answer against one or several references.

    Relaxed accuracy's tolerance is fixed at 5% by definition: `numeric_tolerance` does not change it.
    """
    pred_text, pred_number, pred_plain = _info_cache.get(prediction) or text_info(prediction)
    for ref in references:
        ref_text, ref_number, ref_plain = _info_cache.get(ref) or text_info(ref)
        if pred_text == ref_text:
            return accepted(prediction)
        if ref_plain is not None and pred_plain is not None:  # the common case, inlined: two bare numbers
            if (
                pred_plain == 0.0
                if ref_plain == 0.0
                else abs(pred_plain - ref_plain) <= _BOUND * abs(ref_plain)
            ):
                return accepted(prediction)
        elif (
            ref_number is not None
            and pred_number is not None
            and within(pred_number, ref_number, RELATIVE_TOLERANCE)
        ):
            # Units that disagree make a pair non-numeric: it then needs the string equality checked above.
            return accepted(prediction)
    return rejected(WRONG_ANSWER, prediction)
