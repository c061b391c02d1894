"""The demo model's base (`rsgen-demo-base`): shipped beside the demo model, as small, and saying what it is."""

from __future__ import annotations

import json
from pathlib import Path

from rsgen.engine import demo_model_path, resolve_model_path


def test_the_base_ships_beside_the_demo_model_as_small_and_says_what_it_is():
    base = Path(resolve_model_path("rsgen-demo-base"))
    assert base == demo_model_path().with_name("base_model")
    size = (base / "model.safetensors").stat().st_size
    assert size <= 1.05 * (demo_model_path() / "model.safetensors").stat().st_size
    record = json.loads((base / "rsgen_training.json").read_text())
    assert record["arguments"]["base"] and record["arguments"]["num_images"] == 1000
    assert "# rsgen demo VLM: the base" in (base / "README.md").read_text()
