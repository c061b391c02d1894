"""`rsgen iterate` end to end with the shipped demo model on a few images: two rounds, a SIGKILL inside round 0's
fine-tuning and the rerun that resumes from TRL's checkpoint, the saved models, iterate.json, the card, the final
dataset (loaded, and trained on with TRL), the held-out slice against every round's training rows."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import datasets
import pytest
from datasets import Image, List
from iterate_helpers import write_demo_iterate_recipe

from rsgen.engine import demo_model_path
from rsgen.iterate.held_out import read_held_out
from rsgen.iterate.report import rounds_table
from rsgen.iterate.train import image_sha256s, training_rows
from rsgen.layout import OutputLayout
from rsgen.schema import iter_questions, open_prepared

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
ROUNDS = 2


def write_recipe(tmp: Path, **overrides) -> Path:
    return write_demo_iterate_recipe(tmp, **{
        "verifier": {"CLEVRMath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"},
        "iterate_rounds": ROUNDS,
        # A checkpoint every step and several epochs over ~30 pairs: the kill lands between checkpoints.
        "iterate_train": {"learning_rate": 1.0e-4, "num_train_epochs": 4, "per_device_train_batch_size": 2,
                          "logging_steps": 1, "save_steps": 1, "gradient_checkpointing": False},
        **overrides,
    })


def rsgen_iterate(recipe: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "rsgen", "iterate", "--config", str(recipe), *extra],
                            cwd=recipe.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=1200)
    assert proc.returncode == 0, out[-4000:]
    return out


def checkpoints(folder: Path) -> list[str]:
    return sorted((p.name for p in folder.glob("checkpoint-*") if (p / "trainer_state.json").exists()),
                  key=lambda name: int(name.split("-")[1]))


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """The loop killed (SIGKILL) once round 0's training has written its second checkpoint, then rerun twice: to
    the end, and once more with everything finished. Returns what the tests compare."""
    tmp = tmp_path_factory.mktemp("iterate")
    recipe = write_recipe(tmp)
    layout = OutputLayout(tmp / "it")
    training = layout.round_training(0)
    proc = rsgen_iterate(recipe)
    deadline = time.monotonic() + 900
    while len(checkpoints(training)) < 2:
        assert proc.poll() is None, f"iterate ended before round 0's second checkpoint:\n{proc.stdout.read()[-3000:]}"
        assert time.monotonic() < deadline, "no second checkpoint in 15 minutes"
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    at_kill = json.loads(layout.iterate_json.read_text())
    killed_at = checkpoints(training)[-1]
    round0_run = json.loads(OutputLayout(layout.round_dir(0)).run_json.read_text())

    resumed_log = finish(rsgen_iterate(recipe))
    after = json.loads(layout.iterate_json.read_text())
    model_mtimes = {k: (layout.model_dir(k) / "model.safetensors").stat().st_mtime_ns for k in range(1, ROUNDS + 1)}
    again_log = finish(rsgen_iterate(recipe))
    print("\n" + rounds_table(after))  # the held-out curve of this real run (`pytest -s` shows it)
    return {"tmp": tmp, "recipe": recipe, "layout": layout, "at_kill": at_kill, "killed_at": killed_at,
            "round0_run": round0_run, "resumed_log": resumed_log, "after": after, "model_mtimes": model_mtimes,
            "again_log": again_log, "again": json.loads(layout.iterate_json.read_text())}


def test_the_kill_landed_inside_round_0s_training(killed_and_resumed):
    at_kill = killed_and_resumed["at_kill"]["rounds"][0]
    assert at_kill["pipeline_finished_at"] and at_kill["training"]["started_at"]
    assert "finished_at" not in at_kill["training"]


def test_the_rerun_resumes_from_the_trl_checkpoint_and_redoes_no_finished_part(killed_and_resumed):
    r = killed_and_resumed
    after, layout = r["after"], r["layout"]
    round0 = after["rounds"][0]
    assert round0["training"]["resumed_from"] == r["killed_at"]
    assert f"resuming the sft training from {layout.round_training(0) / r['killed_at']}" in r["resumed_log"]
    assert round0["pipeline_finished_at"] == r["at_kill"]["rounds"][0]["pipeline_finished_at"]
    run = json.loads(OutputLayout(layout.round_dir(0)).run_json.read_text())
    assert run["stages"]["generate"] == r["round0_run"]["stages"]["generate"]  # round 0's pipeline not rerun
    assert round0["training"]["steps"] == after["rounds"][1]["training"]["steps"] or round0["training"]["steps"] > 2
    assert not list(layout.round_training(0).glob("checkpoint-*"))  # spent once the model is saved
    # Everything finished: a third run redoes nothing (same records, same model files) and reports the same.
    assert [x["pipeline_finished_at"] for x in r["again"]["rounds"]] == [x["pipeline_finished_at"] for x in after["rounds"]]
    assert [x.get("training", {}).get("finished_at") for x in r["again"]["rounds"]] == \
        [x.get("training", {}).get("finished_at") for x in after["rounds"]]
    assert {k: (layout.model_dir(k) / "model.safetensors").stat().st_mtime_ns for k in r["model_mtimes"]} == \
        r["model_mtimes"]
    assert "round 0 of" not in r["again_log"]


def test_two_rounds_saved_their_models_and_measured_three(killed_and_resumed):
    after, layout = killed_and_resumed["after"], killed_and_resumed["layout"]
    assert [x["round"] for x in after["rounds"]] == list(range(ROUNDS + 1)) and after["stopped"] is None
    assert after["rounds"][0]["model"] == "rsgen-demo"
    for k in range(1, ROUNDS + 1):
        assert after["rounds"][k]["model"] == str(layout.model_dir(k))
        assert (layout.model_dir(k) / "model.safetensors").exists()
        assert after["rounds"][k - 1]["training"]["model_out"] == str(layout.model_dir(k))
    for x in after["rounds"]:
        held = x["held_out"]
        assert held["qa"] > 0 and 0 <= held["verifier_rate"] <= held["accept_rate"] <= 1
        assert set(held["families"]) == {"CLEVRMath", "DemoChart", "DemoMC"}
        # The demo pool knows every answer: each round graded against the scene, its accepted pairs checked.
        assert 0 <= held["truth_right"] <= held["qa"] and x["truth"]["accepted"] > 0
    # The judge of every round is the round-0 model, never the fine-tuned one.
    assert after["judge_model"] == "rsgen-demo"
    for k in range(ROUNDS + 1):
        run = json.loads(OutputLayout(layout.round_dir(k)).run_json.read_text())
        assert (run["recipe"]["judge_model_name_or_path"] or "rsgen-demo") == "rsgen-demo", k
    # Model 1 answers differently from model 0: the fine-tuning reached the weights the next round used.
    responses = [{rec["id"]: rec["response"] for rec in _generate_records(layout.round_dir(k))} for k in (0, 1)]
    assert responses[0] != responses[1]


def _generate_records(round_dir: Path):
    from rsgen.store import CheckpointStore

    return CheckpointStore(OutputLayout(round_dir).generate_work).iter_records()


def test_sft_loss_falls_within_each_round(killed_and_resumed):
    for x in killed_and_resumed["after"]["rounds"][:ROUNDS]:
        losses = [loss for _step, loss in x["training"]["losses"]]
        third = max(1, len(losses) // 3)
        assert len(losses) == x["training"]["steps"] >= 6
        first, last = sum(losses[:third]) / third, sum(losses[-third:]) / third
        assert last < first, (x["round"], losses)


def test_the_held_out_slice_is_in_no_rounds_training_rows(killed_and_resumed):
    after, layout = killed_and_resumed["after"], killed_and_resumed["layout"]
    held = read_held_out(layout.held_out_images)
    assert held and after["held_out"]["images"] == len(held)
    pool_images = set(open_prepared(layout.root).column("image_sha256"))
    assert held < pool_images
    for k in range(ROUNDS):
        rows = training_rows(layout.round_dir(k) / "dataset", held)
        trained = {sha for row in rows.cast_column("images", List(Image(decode=False))) for sha in image_sha256s(row)}
        assert trained and not trained & held
        assert len(rows) == after["rounds"][k]["training"]["rows"]


def test_final_dataset_holds_every_pair_once_and_trains_with_trl(killed_and_resumed, tmp_path):
    from trl import SFTConfig, SFTTrainer

    from rsgen.engine.models import load_model_and_processor

    after, layout = killed_and_resumed["after"], killed_and_resumed["layout"]
    dataset = layout.dataset
    pool_qa = sum(1 for _ in iter_questions(open_prepared(layout.root)))
    accepted = rejected = 0
    for family in ("CLEVRMath", "DemoChart", "DemoMC"):
        for config in (f"{family}_RS_think", f"{family}_rejected"):
            if not (dataset / "data" / config).is_dir():
                continue
            rows = datasets.load_dataset(str(dataset), config, split="train")
            for row in rows:
                assert len(row["clean_meta"]["qa_rounds"]) == len(row["qa"])
                assert set(row["clean_meta"]["qa_rounds"]) <= set(range(ROUNDS + 1))
                if config.endswith("_rejected"):
                    assert set(row["clean_meta"]["qa_rounds"]) == {ROUNDS}  # the last round's answer
                    rejected += len(row["qa"])
                else:
                    accepted += len(row["qa"])
    assert accepted + rejected == pool_qa
    assert accepted == sum(x["contributed_accepted"] for x in after["rounds"])
    stats = json.loads(layout.stats_json.read_text())
    assert stats["totals"]["accepted_qa"] == accepted and stats["iterate"]["rounds"][-1]["round"] == ROUNDS

    card = (dataset / "README.md").read_text()
    assert "## Self-improvement rounds (`rsgen iterate`)" in card
    for k in range(ROUNDS + 1):
        assert f"| {k} | `{after['rounds'][k]['model']}` |" in card
    assert (dataset / "assets" / "iterate.png").stat().st_size > 1000

    sft = datasets.load_dataset(str(dataset), "CLEVRMath_sft", split="train")
    model, processor = load_model_and_processor(str(demo_model_path()), device="cpu")
    args = SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, use_cpu=True, bf16=False,
                     max_length=None, report_to="none", save_strategy="no", gradient_checkpointing=False)
    result = SFTTrainer(model=model, args=args, train_dataset=sft, processing_class=processor).train()
    assert math.isfinite(result.training_loss)


def test_a_changed_training_setup_is_refused_after_training_started(killed_and_resumed):
    proc = rsgen_iterate(killed_and_resumed["recipe"], "--iterate_train", "{learning_rate: 0.001}")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 2, out[-3000:]
    assert "iterate_train: {" in out and "round 0's training was started with the old value" in out


def test_docs_quote_the_table_in_the_form_rsgen_iterate_prints(killed_and_resumed):
    """docs/iterate.md's demo figures are `rsgen iterate`'s printed table (or `python -m rsgen.iterate.report` on
    the same iterate.json): the header and the labelled lines of this run's table are the page's."""
    printed = killed_and_resumed["again_log"]
    docs = (Path(__file__).resolve().parents[2] / "docs" / "iterate.md").read_text()
    header = next(line for line in printed.splitlines() if line.startswith("round "))
    assert f"\n{header}\n" in docs
    for label in ("held out: ", "judge in every round: rsgen-demo", "truth check (accepted pairs that contradict",
                  "held-out truth, round "):
        assert any(line.startswith(label) for line in printed.splitlines()), label
        assert f"\n{label.split(':')[0].split(',')[0]}" in docs, label
