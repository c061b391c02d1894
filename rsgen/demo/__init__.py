"""The embedded default: a procedurally drawn CLEVR-Math-like pool, and the small VLM that ships with the package
(its weights live in `model/`; `rsgen.engine.demo_model_path()` finds them)."""

from __future__ import annotations

from rsgen.demo.pool import answer_from_scene, make_demo_rows, mc_option_texts, write_demo_pool

__all__ = ["answer_from_scene", "make_demo_rows", "mc_option_texts", "write_demo_pool"]

