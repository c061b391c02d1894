"""Blind check: every accepted QA pair asked again without its image (same model, same question, same chat
template arguments); a pair whose blind answer also verifies is blind-solvable: flagged or dropped at emit
(`blind_check: off | flag | drop`)."""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(
    __name__,
    "blind",
    help="ask every accepted pair again without its image (resumable)",
    work=lambda layout: layout.blind_work,
    every_process=True,  # data-parallel: every rank takes its stripe of the keys
    enabled=lambda recipe: recipe.blind_check != "off",
)

__getattr__ = lazy_exports(__name__, {"run_blind": "rsgen.blind.stage"})
__all__ = ["STAGE", "run_blind"]  # noqa: F822 (loaded on first use)
