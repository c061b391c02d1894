"""`relaxed` -- ChartQA relaxed accuracy, with the cases the official code leaves open decided.

The official rule: if prediction and reference both parse as numbers, the prediction is correct within 5%
relative tolerance of the reference; otherwise the two strings must be equal after lowercasing, trimming
and dropping a trailing period (`rsgen.verify.normalize.normalize_text`).

Decisions where the official code (`float()` plus a '%' -> /100 rule) is silent or accidental:

- Numbers are read by `rsgen.verify.normalize.parse_number`: thousands separators ("1,000" = 1000), a
  leading '+' ("+5" = 5), currency signs, exponents. "nan"/"inf" are text, not numbers.
- Tolerance is relative to the reference and inclusive: |pred - ref| <= 0.05 * |ref|.
- Reference 0: a relative tolerance of 0 is empty, so the prediction must be exactly 0 ("0", "0.0", "-0",
  "0%"). (The official code falls back to string equality there, so "0.0" failed against "0".)
- Percent: when exactly one side has a percent sign, the same-scale reading ("45%" vs "45") and the
  fraction reading ("45%" vs "0.45") both count. When both or neither have one, values compare as written.
  (The official code divides only the side with the sign by 100, so "45%" failed against "45".)
- Trailing units ("12 kg", "5 million", "30 years") and currency signs: a side that omits the unit matches
  on the number; when both sides state a unit (or currency), the units must be equal, else the pair is
  compared as strings. A unit is at most three short words; "5 apples, not 6" is not a number.
- Several references (a list): the prediction matches if it matches any of them.
"""

from __future__ import annotations

from rsgen.verify.decision import WRONG_ANSWER, Decision
from rsgen.verify.inputs import check_inputs
from rsgen.verify.normalize import Number, text_info, units_compatible, value_pairs

RELATIVE_TOLERANCE = 0.05
_FLOAT_SLACK = 1e-9  # so that 105 vs 100 is inside 5% despite binary floating point


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


def relaxed(
    prediction: str | None,
    references: str | list[str],
    *,
    options: list[str] | None = None,
    numeric_tolerance: float | None = None,
    timeout_seconds: float | None = None,
) -> Decision:
    """ChartQA relaxed accuracy of an extracted answer against one or several references.

    `options`, `numeric_tolerance` and `timeout_seconds` are accepted so every verifier takes the same
    keywords; relaxed accuracy's tolerance is fixed at 5% by definition.
    """
    refs = check_inputs(prediction, references)
    if type(refs) is Decision:
        return refs
    pred_text, pred_number = text_info(prediction)
    for ref in refs:
        ref_text, ref_number = text_info(ref)
        if pred_text == ref_text:
            return Decision(True, None, prediction)
        # Units that disagree make a pair non-numeric: it then needs string equality, checked above.
        if ref_number is not None and pred_number is not None and within(pred_number, ref_number, RELATIVE_TOLERANCE):
            return Decision(True, None, prediction)
    return Decision(False, WRONG_ANSWER, prediction)
