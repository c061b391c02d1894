"""`numeric` -- numbers equal within a configurable tolerance (`numeric_tolerance`, default 1e-6).

The tolerance is absolute for references up to 1 in magnitude and relative above:
|pred - ref| <= tolerance * max(1, |ref|). Numbers are read like `relaxed` reads them (thousands
separators, '+', currency, units, and the percent rule: with exactly one side carrying '%', the same-scale
and the fraction readings both count). A prediction that is not a number is a wrong answer. A reference that
is not a number falls back to `exact`'s normalised string equality, so a mostly numeric family with the odd
"yes"/"no" item still verifies. "nan", "inf", "None" and "null" are not numbers here but text: such a reference
matches the same text ("NaN" matches "nan") and nothing else.
"""

from __future__ import annotations

from rsgen.verifiers.decision import WRONG_ANSWER, Decision, accepted, rejected
from rsgen.verifiers.frame import verifier
from rsgen.verifiers.normalize import text_info, units_compatible, value_pairs

DEFAULT_TOLERANCE = 1e-6


@verifier
def numeric(
    prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds
) -> Decision:
    """Numeric equality of an extracted answer with any reference, within `numeric_tolerance`."""
    tolerance = DEFAULT_TOLERANCE if numeric_tolerance is None else numeric_tolerance
    pred_text, pred, _ = text_info(prediction)
    for ref_raw in references:
        ref_text, ref, _ = text_info(ref_raw)
        if ref is None:
            if pred_text == ref_text:
                return accepted(prediction)
            continue
        if pred is None or not units_compatible(pred, ref):
            continue
        for p, r in value_pairs(pred, ref):
            if abs(p - r) <= tolerance * max(1.0, abs(r)):
                return accepted(prediction)
    return rejected(WRONG_ANSWER, prediction)
