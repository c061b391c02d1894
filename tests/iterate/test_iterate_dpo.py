"""`iterate_dpo`: after each round's SFT, TRL's `DPOTrainer` on the round's `_dpo_onpolicy` pairs of the training
slice, with the shipped demo model on a few images (an explore pass makes the on-policy pairs)."""

from __future__ import annotations

import json
import math

import pytest
from datasets import Image, List
from iterate_helpers import run_iterate, write_demo_iterate_recipe

from rsgen.iterate.held_out import read_held_out
from rsgen.iterate.train import DPO, image_sha256s, training_rows
from rsgen.layout import OutputLayout

pytestmark = pytest.mark.slow


def test_a_dpo_step_follows_the_sft_step_and_makes_the_next_model(tmp_path):
    run_iterate(write_demo_iterate_recipe(
        tmp_path, explore_samples=4, iterate_rounds=1,
        iterate_train={"learning_rate": 1.0e-4, "num_train_epochs": 1, "per_device_train_batch_size": 4,
                       "logging_steps": 1, "gradient_checkpointing": False},
        iterate_dpo={"learning_rate": 1.0e-5, "beta": 0.1, "num_train_epochs": 1, "per_device_train_batch_size": 2,
                     "logging_steps": 1, "gradient_checkpointing": False}))

    layout = OutputLayout(tmp_path / "it")
    data = json.loads(layout.iterate_json.read_text())
    sft, dpo = data["rounds"][0]["training"], data["rounds"][0]["dpo"]
    assert sft["model_out"] == str(layout.round_sft_model(0)) and dpo["from_model"] == sft["model_out"]
    assert dpo["model_out"] == str(layout.model_dir(1)) and (layout.model_dir(1) / "model.safetensors").exists()
    assert not layout.round_sft_model(0).exists()  # the intermediate is removed once model 1 is written
    held = read_held_out(layout.held_out_images)
    rows = training_rows(layout.round_dir(0) / "dataset", held, DPO)
    trained = {sha for row in rows.cast_column("images", List(Image(decode=False))) for sha in image_sha256s(row)}
    assert dpo["rows"] == len(rows) > 0 and trained and not trained & held
    assert dpo["steps"] == -(-len(rows) // 2)
    losses = [loss for _step, loss in dpo["losses"]]
    # The reference is the SFT model DPO starts from: at the first step policy = reference, so the loss is ln 2.
    assert losses[0] == pytest.approx(math.log(2), abs=1e-3) and all(math.isfinite(x) for x in losses)
    assert data["rounds"][1]["model"] == str(layout.model_dir(1)) and data["rounds"][1]["held_out"]["qa"] > 0
