"""`exact` -- equal after the relaxed verifier's normalisation (lowercase, trim, drop a trailing period), no
numeric tolerance: "1,000" does not match "1000" and "5.0" does not match "5". Any reference of a list counts."""

from __future__ import annotations

from rsgen.verifiers.decision import WRONG_ANSWER, Decision, accepted, rejected
from rsgen.verifiers.frame import verifier
from rsgen.verifiers.normalize import text_info


@verifier
def exact(
    prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds
) -> Decision:
    """Normalised string equality of an extracted answer with any reference."""
    pred = text_info(prediction)[0]
    for ref in references:
        if pred == text_info(ref)[0]:
            return accepted(prediction)
    return rejected(WRONG_ANSWER, prediction)
