"""`rsgen iterate` variants end to end with the shipped demo model on a few images: `iterate_stop_when_worse` (a
fine-tuning that breaks the model — a learning rate far too high — makes round 1's held-out rate fall, and the loop
stops there and says so in iterate.json, the printed table and the card) and `iterate_from: base` (ReST-EM)."""

from __future__ import annotations

import json

import pytest
from iterate_helpers import run_iterate, write_demo_iterate_recipe

from rsgen.layout import OutputLayout

pytestmark = pytest.mark.slow


def test_the_loop_stops_when_the_held_out_rate_falls(tmp_path):
    path = write_demo_iterate_recipe(
        tmp_path, max_new_tokens=64, judge=False, iterate_rounds=3, iterate_stop_when_worse=True,
        iterate_train={"learning_rate": 0.5, "num_train_epochs": 1, "per_device_train_batch_size": 4,
                       "save_strategy": "no", "gradient_checkpointing": False})
    proc = run_iterate(path)
    layout = OutputLayout(tmp_path / "it")
    data = json.loads(layout.iterate_json.read_text())
    rates = [r["held_out"]["verifier_rate"] for r in data["rounds"]]
    assert len(rates) == 2 and rates[1] < rates[0], rates  # round 0 > 0 and a broken model 1 below it
    assert data["stopped"].startswith("round 1's held-out verifier accept rate")
    assert "training" not in data["rounds"][1] and not layout.model_dir(2).exists()  # nothing after the stop
    assert f"stopped early: {data['stopped']}" in proc.stdout
    assert f"The loop stopped early: {data['stopped']}." in (layout.dataset / "README.md").read_text()


def test_iterate_from_base_fine_tunes_the_base_model_every_round(tmp_path):
    run_iterate(write_demo_iterate_recipe(
        tmp_path, max_new_tokens=64, judge=False, iterate_rounds=2, iterate_from="base",
        iterate_train={"learning_rate": 1.0e-4, "num_train_epochs": 1, "per_device_train_batch_size": 4,
                       "save_strategy": "no", "gradient_checkpointing": False}))
    layout = OutputLayout(tmp_path / "it")
    data = json.loads(layout.iterate_json.read_text())
    assert [r["model"] for r in data["rounds"]] == ["rsgen-demo", str(layout.model_dir(1)), str(layout.model_dir(2))]
    # ReST-EM: round 1 trains the base model on round 1's data, not model 1.
    assert [r["training"]["from_model"] for r in data["rounds"][:2]] == ["rsgen-demo", "rsgen-demo"]
    assert "ReST-EM" in (layout.dataset / "README.md").read_text()
