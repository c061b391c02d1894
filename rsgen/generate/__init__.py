"""The generate stage: the VLM answers every prepared question (batched, data-parallel, resumable), verified as it
goes. `run_generate(recipe, state)` is the stage (see `stage.py`); the engine it runs lives in `rsgen.engine`."""

from rsgen.generate.stage import run_generate

__all__ = ["run_generate"]
