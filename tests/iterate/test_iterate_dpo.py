"""`iterate_dpo`: after each round's SFT, TRL's `DPOTrainer` on the round's `_dpo_onpolicy` pairs of the training
slice, with the shipped demo model on a few images (an explore pass makes the on-policy pairs)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import yaml
from datasets import Image, List

from rsgen.iterate.held_out import read_held_out
from rsgen.iterate.train import DPO, _image_sha256, training_rows
from rsgen.layout import OutputLayout

pytestmark = pytest.mark.slow


def test_a_dpo_step_follows_the_sft_step_and_makes_the_next_model(tmp_path):
    recipe = {
        "model_name_or_path": "rsgen-demo",
        "output_dir": str(tmp_path / "it"),
        "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 16, "demo_seed": 11, "family_column": "family",
                     "options_column": "options", "source_id_column": "source_id"}],
        "max_new_tokens": 96,
        "judge_max_new_tokens": 32,
        "verifier": "relaxed",
        "judge_calibration_size": 4,
        "prepare_num_proc": 1,
        "explore_samples": 4,
        "iterate_rounds": 1,
        "iterate_eval_fraction": 0.25,
        "iterate_stop_when_worse": False,
        "iterate_train": {"learning_rate": 1.0e-4, "num_train_epochs": 1, "per_device_train_batch_size": 4,
                          "logging_steps": 1, "gradient_checkpointing": False},
        "iterate_dpo": {"learning_rate": 1.0e-5, "beta": 0.1, "num_train_epochs": 1, "per_device_train_batch_size": 2,
                        "logging_steps": 1, "gradient_checkpointing": False},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "rsgen", "iterate", "--config", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]

    layout = OutputLayout(tmp_path / "it")
    data = json.loads(layout.iterate_json.read_text())
    sft, dpo = data["rounds"][0]["training"], data["rounds"][0]["dpo"]
    assert sft["model_out"] == str(layout.round_sft_model(0)) and dpo["from_model"] == sft["model_out"]
    assert dpo["model_out"] == str(layout.model_dir(1)) and (layout.model_dir(1) / "model.safetensors").exists()
    assert not layout.round_sft_model(0).exists()  # the intermediate is removed once model 1 is written
    held = read_held_out(layout.held_out_images)
    rows = training_rows(layout.round_dir(0) / "dataset", held, DPO)
    trained = {_image_sha256(row) for row in rows.cast_column("images", List(Image(decode=False)))}
    assert dpo["rows"] == len(rows) > 0 and trained and not trained & held
    assert dpo["steps"] == -(-len(rows) // 2)
    losses = [loss for _step, loss in dpo["losses"]]
    # The reference is the SFT model DPO starts from: at the first step policy = reference, so the loss is ln 2.
    assert losses[0] == pytest.approx(math.log(2), abs=1e-3) and all(math.isfinite(x) for x in losses)
    assert data["rounds"][1]["model"] == str(layout.model_dir(1)) and data["rounds"][1]["held_out"]["qa"] > 0
