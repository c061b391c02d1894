"""Explore fixtures: the demo recipe (shipped demo model, a small demo pool) run end to end with an explore pass,
once per session; tests read it (copy it to change anything). One torch thread: tiny models on a busy machine."""

from __future__ import annotations

import os

import pytest
import torch
from explore_helpers import demo_explore_recipe


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


@pytest.fixture(scope="session")
def explored_run(tmp_path_factory):
    """(output_dir, recipe) of the demo recipe with an explore pass, judge on, run to the end in this process."""
    from rsgen.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("explored")
    recipe, _ = demo_explore_recipe(root / "out")
    run_pipeline(recipe)
    return root / "out", recipe
