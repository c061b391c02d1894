"""Known-wrong calibration pairs: questions of the run paired with answers that are certainly wrong.

The judge is calibrated on both sides: verifier-accepted pairs (it should say CORRECT) and these pairs (it should
say WRONG). A judge that says CORRECT to everything passes the first side and fails this one, and the leniency
gate (`rsgen.routing.withheld_families`) then withholds its promotions.

Every pair is built from the run's own prepared pool with a fixed seed, for each family up to
`judge_calibration_size` questions (the gate decides per family, so each family needs its own measurement).
The candidate is a near miss where one can be made, else an unrelated answer, in a fixed rotation:

- `near_number`: the reference's number moved just beyond the verifier's tolerance (9 -> 10 under `relaxed`);
- `neighbour_letter`: the option letter next to the reference's (`mc`);
- `other_reference`: another question's reference in the same family, of the same kind (a number for a number,
  a word for a word, a letter for a letter): "fig" for "lime";
- `unrelated`: a reference of another family, or a fixed unrelated answer.

Each candidate is kept only when its verifier rejects it, and a word candidate only when it neither equals nor
contains a reference (nor is contained in one) after the verifiers' normalisation: a known-wrong pair must be
wrong, not merely phrased differently.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

from rsgen.verify import compare
from rsgen.verify.decision import Decision
from rsgen.verify.inputs import check_inputs
from rsgen.verify.mc import reference_letter
from rsgen.verify.normalize import Number, text_info
from rsgen.verify.numeric import DEFAULT_TOLERANCE
from rsgen.verify.relaxed import RELATIVE_TOLERANCE

NEAR_NUMBER = "near_number"
NEIGHBOUR_LETTER = "neighbour_letter"
OTHER_REFERENCE = "other_reference"
UNRELATED = "unrelated"
MISSES = (NEAR_NUMBER, NEIGHBOUR_LETTER, OTHER_REFERENCE, UNRELATED)

# Which kind of candidate the i-th question of a family gets (i modulo 4): three near misses for one unrelated.
ROTATION = ("near", OTHER_REFERENCE, "near", UNRELATED)
# Answers unrelated to any question of a VQA pool, for when the run has a single family.
UNRELATED_ANSWERS = ("purple elephant", "Paris", "a red umbrella", "the second one from the left",
                     "-273.15", "banana bread")


@dataclass(frozen=True)
class KnownWrongPair:
    id: str  # the QA id whose question and reference are used
    family: str
    miss: str  # one of MISSES
    candidate: str


def _pick(rng: random.Random, choices: list[str], exclude: Collection[str], tries: int = 8) -> str | None:
    """A random element of `choices` not in `exclude`, or None after `tries` draws (pools can be large)."""
    for _ in range(tries if choices else 0):
        choice = rng.choice(choices)
        if choice not in exclude:
            return choice
    return None


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def _kind(text: str, letters: bool) -> str:
    """What kind of answer `text` is, for choosing a near miss of the same kind: letter, number or word."""
    if letters and reference_letter(text) is not None:
        return "letter"
    return "number" if text_info(text)[1] is not None else "word"


def _format_number(value: float, like: Number) -> str:
    text = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
    if like.percent:
        text += "%"
    if like.currency:
        text = like.currency + text
    if like.unit:
        text += " " + like.unit
    return text


def near_number(reference: str, verifier: str, tolerance: float | None, rng: random.Random) -> str | None:
    """The reference's number moved just beyond the verifier's tolerance, in the same form (integer, %, unit)."""
    number = text_info(reference)[1]
    if number is None:
        return None
    value = number.value
    if verifier == "numeric":
        bound = (DEFAULT_TOLERANCE if tolerance is None else tolerance) * max(1.0, abs(value))
    else:  # relaxed and the rest: relative to the reference; a reference of 0 needs exactly 0
        bound = RELATIVE_TOLERANCE * abs(value)
    if value.is_integer():
        step = math.floor(bound) + 1
    else:
        step = max(bound * 1.5, abs(value) * 1e-6, 1e-9)
    sign = rng.choice((-1, 1))
    if value >= 0 and value - step < 0:
        sign = 1  # a count or an amount stays non-negative
    return _format_number(value + sign * step, number)


def neighbour_letter(reference: str, options: list[str] | None, rng: random.Random) -> str | None:
    """The option letter next to the reference's letter (within the options when they are known)."""
    letter = reference_letter(reference, options)
    if letter is None:
        return None
    last = chr(64 + len(options)) if options and len(options) <= 26 else "Z"
    neighbours = [chr(ord(letter) + d) for d in (-1, 1) if "A" <= chr(ord(letter) + d) <= last]
    return rng.choice(neighbours) if neighbours else None


# Words that may state a number: a word candidate for a numeric reference must not be one of these.
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion dozen half none no single once twice".split()
)


def plainly_different(candidate: str, references: list[str]) -> bool:
    """A word candidate that neither equals, contains nor is contained in any reference (normalised), and that
    names no number when a reference is a number ("ten" may well mean 10)."""
    text = text_info(candidate)[0]
    if any(text_info(ref)[1] is not None for ref in references):
        if NUMBER_WORDS & set(text.replace("-", " ").split()):
            return False
    for ref in references:
        ref_text = text_info(ref)[0]
        if not text or not ref_text or text in ref_text or ref_text in text:
            return False
    return True


def is_known_wrong(candidate: str, references: list[str], verifier: str, options: list[str] | None,
                   tolerance: float | None) -> bool:
    """The verifier rejects the candidate, and a word candidate is plainly different from every reference."""
    if type(check_inputs(candidate, references)) is Decision:
        return False
    if compare(verifier, candidate, references, options=options, numeric_tolerance=tolerance).match:
        return False
    if text_info(candidate)[1] is not None or reference_letter(candidate) is not None:
        return True  # a number outside the tolerance, or a different option letter: the verifier decides
    return plainly_different(candidate, references)


def known_wrong_pairs(
    prepared: dict[str, dict[str, Any]],
    verifier_for: Callable[[str], str],
    size: int,
    seed: int,
    numeric_tolerance: float | None = None,
) -> list[KnownWrongPair]:
    """Up to `size` known-wrong pairs per family, sorted by (family, id).

    `prepared`: QA id -> {"family", "answers", "options"} (the prepared pool); `verifier_for(family)` names the
    family's verifier. Depends only on the pool, the verifiers and the seed."""
    if size <= 0:
        return []
    by_family: dict[str, list[str]] = {}
    for qa_id, qa in prepared.items():
        by_family.setdefault(qa["family"], []).append(qa_id)
    references = {family: sorted({prepared[i]["answers"][0] for i in ids if prepared[i]["answers"]})
                  for family, ids in by_family.items()}
    every_reference = sorted({ref for refs in references.values() for ref in refs})
    pairs: list[KnownWrongPair] = []
    for family in sorted(by_family):
        verifier = verifier_for(family)
        # Rows with options are multiple choice under every verifier (rsgen.verify.frame): letters are near misses.
        letters = verifier == "mc" or any(prepared[i].get("options") for i in by_family[family])
        own = set(references[family])
        by_kind: dict[str, list[str]] = {}
        for ref in references[family]:
            by_kind.setdefault(_kind(ref, letters), []).append(ref)
        made = 0
        for qa_id in sorted(by_family[family], key=lambda i: _rank(seed, i)):
            if made >= size:
                break
            qa = prepared[qa_id]
            answers = list(qa["answers"])
            if not answers:
                continue
            options = list(qa.get("options") or []) or None
            rng = random.Random(_rank(seed, "known_wrong:" + qa_id))
            kind = _kind(answers[0], letters)
            first = ROTATION[made % len(ROTATION)]
            order = [NEAR_NUMBER, NEIGHBOUR_LETTER, OTHER_REFERENCE] if first == "near" else [first]
            order += [m for m in MISSES if m not in order]
            for miss in order:
                if miss == NEAR_NUMBER:
                    candidate = near_number(answers[0], verifier, numeric_tolerance, rng) if kind == "number" else None
                elif miss == NEIGHBOUR_LETTER:
                    candidate = neighbour_letter(answers[0], options, rng) if kind == "letter" else None
                elif miss == OTHER_REFERENCE:  # a reference of the same kind in this family
                    candidate = _pick(rng, by_kind.get(kind, []), answers)
                elif every_reference and rng.random() < 0.5:  # another family's reference
                    candidate = _pick(rng, every_reference, own)
                else:
                    candidate = rng.choice(UNRELATED_ANSWERS)
                if candidate is not None and is_known_wrong(candidate, answers, verifier, options, numeric_tolerance):
                    pairs.append(KnownWrongPair(qa_id, family, miss, candidate))
                    made += 1
                    break
    return sorted(pairs, key=lambda p: (p.family, p.id))
