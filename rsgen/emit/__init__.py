"""Emit: the dataset splits in the seed card's schema, TRL-ready SFT and DPO views, stats.json, the dataset card
and the push to the Hub. See rsgen/emit/stage.py for the flow."""

from rsgen.emit.splits import EmitError
from rsgen.emit.stage import render_card, run_emit

__all__ = ["EmitError", "render_card", "run_emit"]
