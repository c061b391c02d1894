"""The two small value types every verifier returns, and the closed set of reasons a non-match can carry."""

from __future__ import annotations

from typing import NamedTuple

NO_ANSWER = "no_answer"  # nothing extractable (unclosed reasoning, empty text)
WRONG_ANSWER = "wrong_answer"
MC_AMBIGUOUS = "mc_ambiguous"  # two different option letters in one answer
MC_NO_LETTER = "mc_no_letter"  # no option letter and no option text found
MATH_TIMEOUT = "math_timeout"  # math-verify ran past its time (or memory) limit for this item
BAD_INPUT = (
    "bad_input"  # a prediction/reference that is not usable text (None reference, number, empty list...)
)

REASONS: dict[str, str] = {  # every reason a verifier gives, and what it means (docs/reasons.md is made from it)
    NO_ANSWER: "nothing to compare: the reasoning never closed (cut off at the token limit) or the answer is blank",
    WRONG_ANSWER: "the answer does not match any reference",
    MC_AMBIGUOUS: "multiple choice: the answer names two different options",
    MC_NO_LETTER: "multiple choice: the answer names no option (no letter, no option's text)",
    MATH_TIMEOUT: "math: the equivalence check ran past math_timeout_seconds (or its memory limit)",
    BAD_INPUT: "the reference (or the options) cannot be used: not text, blank, or for a row with options not one "
               "option's letter or text; never judged, never a DPO pair",
}


class Extraction(NamedTuple):
    """The final answer pulled out of a raw response; `answer` is None exactly when `reason` is set.

    (Named tuples rather than dataclasses: a verifier makes one per QA pair, and tuples are built 2x faster.)
    """

    answer: str | None
    reason: str | None = None


class Decision(NamedTuple):
    """A verifier's verdict. `reason` is None when `match`, else one of `REASONS`.

    `extracted` is the answer that was compared (for `mc`, the option letter when one was found).
    """

    match: bool
    reason: str | None
    extracted: str | None


# Decision(...) goes through a Python-level __new__ that costs twice as much as tuple.__new__; verifiers build
# one per QA pair, so they use these two.
_new = tuple.__new__


def accepted(extracted: str) -> Decision:
    """A match on `extracted`."""
    return _new(Decision, (True, None, extracted))


def rejected(reason: str, extracted: str | None) -> Decision:
    """A non-match for `reason` (one of `REASONS`) on `extracted`."""
    return _new(Decision, (False, reason, extracted))
