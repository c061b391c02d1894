"""What the slow iterate tests share: a small `rsgen iterate` recipe with the shipped demo model (pool seed 11, a
quarter of the images held out), and running it in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml


def write_demo_iterate_recipe(tmp: Path, num_images: int = 16, **overrides) -> Path:
    """`tmp/recipe.yaml` for `rsgen iterate` on `num_images` demo images into `tmp/it`; `overrides` add or replace
    keys (every test names its own `iterate_rounds` and `iterate_train`)."""
    recipe = {
        "model_name_or_path": "rsgen-demo",
        "output_dir": str(tmp / "it"),
        "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": num_images, "demo_seed": 11,
                     "family_column": "family", "options_column": "options", "source_id_column": "source_id"}],
        "max_new_tokens": 96,
        "judge_max_new_tokens": 32,
        "verifier": "relaxed",
        "judge_calibration_size": 4,
        "prepare_num_proc": 1,
        "iterate_eval_fraction": 0.25,
        "iterate_stop_when_worse": False,  # the round count must not depend on a few held-out questions
        **overrides,
    }
    path = tmp / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def run_iterate(recipe: Path) -> subprocess.CompletedProcess:
    """`rsgen iterate --config recipe` to the end (one torch thread: tests share the machine); it must succeed."""
    proc = subprocess.run([sys.executable, "-m", "rsgen", "iterate", "--config", str(recipe)], cwd=recipe.parent,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    return proc
