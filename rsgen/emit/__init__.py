"""Emit: the dataset splits in the seed card's schema, TRL-ready SFT and DPO views, stats.json, the dataset card
and the push to the Hub. See rsgen/emit/stage.py for the flow."""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(
    __name__,
    "emit",
    help="write the dataset splits, TRL views, stats.json and the card",
    work=lambda layout: layout.dataset,
    every_process=False,  # one writer of dataset/ and stats.json
)

__getattr__ = lazy_exports(__name__, {"EmitError": "rsgen.emit.splits", "render_card": "rsgen.emit.stage",
                                      "push_progress_section": "rsgen.emit.push",
                                      "run_emit": "rsgen.emit.stage"})
__all__ = ["STAGE", "EmitError", "push_progress_section", "render_card", "run_emit"]  # noqa: F822 (loaded on first use)
