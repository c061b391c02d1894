"""The generate stage: batched, data-parallel, resumable generation with a VLM, verified as it goes.

`run_generate(recipe, state)` is the stage (see `stage.py`); `engine.GenerationEngine` is the batched
generation engine the judge stage reuses; `models.load_model_and_processor` loads a model once per process.
"""

from rsgen.generate.stage import run_generate

__all__ = ["run_generate"]
