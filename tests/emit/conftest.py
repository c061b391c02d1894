"""Shared emit fixtures: one scripted output directory, emitted once per session and read by many tests."""

import pytest
from emit_helpers import scripted_recipe, write_scripted_run


@pytest.fixture(scope="session")
def emitted_run(tmp_path_factory):
    """(output_dir, recipe, scripted images) of the default scripted pool after one emit. Read-only."""
    from rsgen.emit import run_emit

    root = tmp_path_factory.mktemp("emitted")
    images = write_scripted_run(root)
    recipe = scripted_recipe(root, num_card_examples=2)
    run_emit(recipe)
    return root, recipe, images
