"""Explore fixtures: the demo recipe (shipped demo model, a small demo pool) run end to end with an explore pass,
once per session; tests read it (copy it to change anything). One torch thread: tiny models on a busy machine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import yaml

from rsgen.config import recipe_from_dict
from rsgen.demo.run import RECIPE

EXPLORE = {"explore_samples": 4, "explore_temperature": 1.0}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    old_env = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(before)
    if old_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = old_env


def demo_explore_recipe(output_dir: Path, **overrides):
    """The demo recipe with `--explore_samples 4 --explore_temperature 1.0` on 10 images; also as a YAML file."""
    raw = yaml.safe_load(RECIPE.read_text())
    raw["sources"][0]["demo_num_images"] = 10
    raw.update(output_dir=str(output_dir), prepare_num_proc=1, checkpoint_every_items=8, **EXPLORE)
    raw.update(overrides)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir.parent / f"{output_dir.name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return recipe_from_dict(raw), path


@pytest.fixture(scope="session")
def explored_run(tmp_path_factory):
    """(output_dir, recipe) of the demo recipe with an explore pass, judge on, run to the end in this process."""
    from rsgen.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("explored")
    recipe, _ = demo_explore_recipe(root / "out")
    run_pipeline(recipe)
    return root / "out", recipe
