"""`exact` -- equal after the relaxed verifier's normalisation (lowercase, trim, drop a trailing period), no
numeric tolerance: "1,000" does not match "1000" and "5.0" does not match "5". Any reference of a list counts."""

from __future__ import annotations

from rsgen.verify.decision import WRONG_ANSWER, Decision
from rsgen.verify.inputs import check_inputs
from rsgen.verify.normalize import text_info

# Decision(...) without its Python-level __new__: half the cost on the hot path.
_new = tuple.__new__


def exact(
    prediction: str | None,
    references: str | list[str],
    *,
    options: list[str] | None = None,
    numeric_tolerance: float | None = None,
    timeout_seconds: float | None = None,
) -> Decision:
    """Normalised string equality of an extracted answer with any reference."""
    refs = check_inputs(prediction, references)
    if type(refs) is Decision:
        return refs
    pred = text_info(prediction)[0]
    for ref in refs:
        if pred == text_info(ref)[0]:
            return _new(Decision, (True, None, prediction))
    return _new(Decision, (False, WRONG_ANSWER, prediction))
