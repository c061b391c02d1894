"""The embedded default: a procedurally drawn CLEVR-Math-like pool and the small VLM that ships with the package."""

from __future__ import annotations

from pathlib import Path

from rsgen.demo.pool import answer_from_scene, make_demo_rows, mc_option_texts, write_demo_pool

__all__ = ["answer_from_scene", "demo_model_path", "make_demo_rows", "mc_option_texts", "write_demo_pool"]


def demo_model_path() -> Path:
    """Directory of the demo VLM shipped inside the package (trained by `scripts/train_demo_model.py`)."""
    return Path(__file__).resolve().parent / "model"
