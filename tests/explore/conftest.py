"""Explore fixtures: the demo recipe (shipped demo model, a small demo pool) run end to end with an explore pass,
once per session; tests read it (copy it to change anything)."""

from __future__ import annotations

import pytest
from explore_helpers import demo_explore_recipe


@pytest.fixture(scope="session")
def explored_run(tmp_path_factory):
    """(output_dir, recipe) of the demo recipe with an explore pass, judge on, run to the end in this process."""
    from rsgen.pipeline import run_pipeline

    root = tmp_path_factory.mktemp("explored")
    recipe, _ = demo_explore_recipe(root / "out")
    run_pipeline(recipe)
    return root / "out", recipe
