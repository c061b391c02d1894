"""The verify stage: every response generate stored, decided again by the family's verifier, without the model.

(`rsgen.verify` is the verifiers themselves; this package runs them over the work of a run.)
"""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(
    __name__,
    "verify",
    help="decide every stored response with the recipe's verifiers, without the model (seconds; resumable)",
    work=lambda layout: layout.verify_work,
    every_process=True,  # data-parallel like the model stages: each rank decides its stripe of the keys
    checked=False,
)

__getattr__ = lazy_exports(__name__, {"run_verify": "rsgen.verification.stage"})
__all__ = ["STAGE", "run_verify"]  # noqa: F822 (loaded on first use)
