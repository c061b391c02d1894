"""The generate stage: the VLM answers every prepared question (batched, data-parallel, resumable), verified as it
goes. `run_generate(recipe, state)` is the stage (see `stage.py`); the engine it runs lives in `rsgen.engine`."""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(__name__, "generate", work=lambda layout: layout.generate_work, every_process=True,
                         help="answer every prepared question with the VLM (resumable)")

__getattr__ = lazy_exports(__name__, {"run_generate": "rsgen.generate.stage"})
__all__ = ["STAGE", "run_generate"]  # noqa: F822 (loaded on first use)
