"""`accelerate launch -m rsgen iterate` with two CPU processes: the rounds' generation and the TRL training run on
both processes, and a SIGKILL inside round 1's generation resumes there — round 0 (its pipeline and its training)
is not redone, round 1 keeps the answers it had."""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
from iterate_helpers import write_demo_iterate_recipe

from rsgen.layout import OutputLayout
from rsgen.store import CheckpointStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "explore"))
from launch_helpers import kill_tree, launch, run_to_end  # noqa: E402

pytestmark = pytest.mark.slow


def write_recipe(tmp: Path) -> Path:
    return write_demo_iterate_recipe(
        tmp, num_images=24, iterate_rounds=1,
        checkpoint_every_items=2,  # parts land often: the kill finds some of round 1's answers on disk
        max_batch_size=2,
        iterate_train={"learning_rate": 1.0e-4, "num_train_epochs": 2, "per_device_train_batch_size": 2,
                       "logging_steps": 1, "save_steps": 4, "gradient_checkpointing": False})


def test_two_processes_train_and_a_kill_inside_round_1s_generation_resumes_there(tmp_path):
    recipe = write_recipe(tmp_path)
    layout = OutputLayout(tmp_path / "it")
    round1 = CheckpointStore(OutputLayout(layout.round_dir(1)).generate_work)
    log = tmp_path / "first.log"
    proc = launch(["iterate", "--config", str(recipe)], 2, log)
    deadline = time.monotonic() + 600
    while not round1.done_keys():
        assert proc.poll() is None, f"iterate ended before round 1's generation:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, "round 1's generation did not start in 10 minutes"
        time.sleep(0.02)
    kill_tree(proc)
    assert "round 0: SFTTrainer of rsgen-demo" in log.read_text()  # the first run trained round 0
    at_kill = json.loads(layout.iterate_json.read_text())
    answered_at_kill = len(round1.done_keys())
    assert at_kill["rounds"][0]["training"]["finished_at"] and len(at_kill["rounds"]) == 1  # round 1 unfinished

    resumed = tmp_path / "resumed.log"
    run_to_end(["iterate", "--config", str(recipe)], 2, resumed)
    text = resumed.read_text()
    after = json.loads(layout.iterate_json.read_text())
    assert [r["round"] for r in after["rounds"]] == [0, 1] and after["stopped"] is None
    # Round 0 is not redone: same finish times, and no "round 0" pipeline or training started again.
    for part in ("pipeline_finished_at",):
        assert after["rounds"][0][part] == at_kill["rounds"][0][part]
    assert after["rounds"][0]["training"]["finished_at"] == at_kill["rounds"][0]["training"]["finished_at"]
    assert "round 0 of 1: the pipeline" not in text and "round 0: SFTTrainer" not in text
    # Round 1's generation resumed: what it had answered was kept (at least that much reported done), and the
    # generate log of round 1 is the only one in the rerun.
    done = [(int(a.replace(",", "")), int(b.replace(",", "")))
            for a, b in re.findall(r"generate: ([\d,]+) of ([\d,]+) \w+s already done", text)]
    assert len(done) == 1 and answered_at_kill <= done[0][0] < done[0][1], (answered_at_kill, done)
    # The training went through the Trainer's accelerate on both processes of the launch.
    training = after["rounds"][0]["training"]
    assert training["processes"] == 2
    assert training["steps"] == -(-training["rows"] // 4) * 2  # 2 epochs of rows / (2 per device x 2 processes)
    held = after["rounds"][1]["held_out"]
    assert held["qa"] > 0 and 0 <= held["verifier_rate"] <= 1
