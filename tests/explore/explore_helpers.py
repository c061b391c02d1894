"""Explore test helpers: the demo recipe with an explore pass."""

from __future__ import annotations

from pathlib import Path

import yaml

from rsgen.config import recipe_from_dict
from rsgen.demo_command import RECIPE

EXPLORE = {"explore_samples": 4, "explore_temperature": 1.0}


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
