"""The explore stage: sampled responses beyond the greedy one, until each question has a verified-correct and a
verified-wrong response (`explore_stop: paired`) or `explore_samples` are drawn (`never`)."""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(__name__, "explore", work=lambda layout: layout.explore_work, every_process=True,
                         enabled=lambda recipe: recipe.explore_samples > 0,  # off by default: not run, not in run.json
                         help="sample beyond the greedy answer (explore_samples > 0): pass rates, on-policy pairs "
                              "(resumable)")

__getattr__ = lazy_exports(__name__, {"run_explore": "rsgen.explore.stage"})
__all__ = ["STAGE", "run_explore"]  # noqa: F822 (loaded on first use)
