"""`numeric` -- numbers equal within a configurable tolerance (`numeric_tolerance`, default 1e-6).

The tolerance is absolute for references up to 1 in magnitude and relative above:
|pred - ref| <= tolerance * max(1, |ref|). Numbers are read like `relaxed` reads them (thousands
separators, '+', currency, units, and the percent rule: with exactly one side carrying '%', the same-scale
and the fraction readings both count). A prediction that is not a number is a wrong answer. A reference that
is not a number falls back to `exact`'s normalised string equality, so a mostly numeric family with the odd
"yes"/"no" item still verifies.
"""

from __future__ import annotations

import math

from rsgen.verify.decision import WRONG_ANSWER, Decision
from rsgen.verify.inputs import check_inputs
from rsgen.verify.normalize import text_info, units_compatible, value_pairs

DEFAULT_TOLERANCE = 1e-6

# Decision(...) without its Python-level __new__: half the cost on the hot path.
_new = tuple.__new__


def numeric(
    prediction: str | None,
    references: str | list[str],
    *,
    options: list[str] | None = None,
    numeric_tolerance: float | None = None,
    timeout_seconds: float | None = None,
) -> Decision:
    """Numeric equality of an extracted answer with any reference, within `numeric_tolerance`."""
    refs = check_inputs(prediction, references)
    if type(refs) is Decision:
        return refs
    tolerance = DEFAULT_TOLERANCE if numeric_tolerance is None else numeric_tolerance
    if type(tolerance) not in (float, int) or not math.isfinite(tolerance) or tolerance < 0:
        raise ValueError(f"numeric_tolerance must be a finite number >= 0, got {tolerance!r}")
    pred_text, pred, _ = text_info(prediction)
    for ref_raw in refs:
        ref_text, ref, _ = text_info(ref_raw)
        if ref is None:
            if pred_text == ref_text:
                return _new(Decision, (True, None, prediction))
            continue
        if pred is None or not units_compatible(pred, ref):
            continue
        for p, r in value_pairs(pred, ref):
            if abs(p - r) <= tolerance * max(1.0, abs(r)):
                return _new(Decision, (True, None, prediction))
    return _new(Decision, (False, WRONG_ANSWER, prediction))
