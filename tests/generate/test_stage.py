"""The generate stage end to end on a real prepared demo pool and a real tiny model: records, verification,
resuming, two CPU processes through `accelerate launch`, and SIGKILL at a random point followed by a restart."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from rsgen.config import recipe_from_dict
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.schema import GENERATE_RECORD_FIELDS, load_prepared
from rsgen.store import CheckpointStore, distributed_state
from rsgen.verifiers import verify_response

REPO = Path(__file__).resolve().parents[2]
CPU_2PROC = REPO / "accelerate_configs" / "cpu_2proc.yaml"
VERIFIERS = {"CLEVRMath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"}


def recipe_dict(output_dir: Path, model: str, **overrides) -> dict:
    raw = {
        "model_name_or_path": model,
        "output_dir": str(output_dir),
        "sources": [
            {
                "dataset_name": "rsgen-demo",
                "demo_num_images": 8,
                "demo_seed": 20240601,
                "family_column": "family",
                "options_column": "options",
                "source_id_column": "source_id",
            }
        ],
        "verifier": VERIFIERS,
        "max_new_tokens": 12,
        "judge": False,
        "prepare_num_proc": 1,
        "checkpoint_every_items": 4,
        "max_batch_size": 64,
    }
    raw.update(overrides)
    return raw


def write_recipe(output_dir: Path, model: str, **overrides):
    """The recipe object, and the same recipe as a YAML file for the command line."""
    raw = recipe_dict(output_dir, model, **overrides)
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return recipe_from_dict(raw), path


@pytest.fixture(scope="module")
def model_path(zoo_model_path):
    return zoo_model_path("qwen2_vl")


@pytest.fixture(scope="module")
def prepared_pool(tmp_path_factory, model_path) -> Path:
    """The demo pool through the real prepare stage (read-only: tests copy it)."""
    root = tmp_path_factory.mktemp("pool")
    recipe, _ = write_recipe(root, model_path)
    run_prepare(recipe)
    return OutputLayout(root).prepared


def fresh_output_dir(tmp_path: Path, prepared_pool: Path, name: str) -> Path:
    out = tmp_path / name
    shutil.copytree(prepared_pool, OutputLayout(out).prepared)
    return out


def prepared_pairs(output_dir: Path) -> dict[str, dict]:
    pairs = {}
    for row in load_prepared(output_dir).select_columns(["family", "qa"]):
        for qa in row["qa"]:
            pairs[qa["id"]] = {**qa, "family": row["family"]}
    return pairs


def part_keys(output_dir: Path) -> list[str]:
    """Every key in every part, duplicates included (the store itself dedups; we check nothing needed it)."""
    keys = []
    for part in CheckpointStore(OutputLayout(output_dir).generate_work).parts():
        keys += [json.loads(line)["key"] for line in part.read_text().splitlines()]
    return keys


@pytest.fixture(scope="module")
def reference(tmp_path_factory, prepared_pool, model_path):
    """An uninterrupted single-process run, in this process: (output_dir, records, summary)."""
    out = fresh_output_dir(tmp_path_factory.mktemp("reference"), prepared_pool, "out")
    recipe, _ = write_recipe(out, model_path)
    from rsgen.generate import run_generate

    summary = run_generate(recipe, distributed_state())
    return out, CheckpointStore(OutputLayout(out).generate_work).records(), summary


@pytest.mark.slow
def test_records_cover_every_pair_with_verified_fields(reference, model_path):
    out, records, summary = reference
    pairs = prepared_pairs(out)
    assert len(pairs) > 30
    assert sorted(records) == sorted(pairs)
    assert sorted(part_keys(out)) == sorted(pairs)  # exactly once
    assert summary.done_now == len(pairs) and summary.engine is not None
    # Flushed in parts of checkpoint_every_items records.
    assert len(CheckpointStore(OutputLayout(out).generate_work).parts()) >= len(pairs) // 4
    for key, rec in records.items():
        qa = pairs[key]
        assert tuple(sorted(rec)) == tuple(sorted(GENERATE_RECORD_FIELDS))
        assert rec["id"] == key and rec["sample"] == 0
        assert rec["question"] == qa["question"] and rec["family"] == qa["family"]
        assert rec["verifier"] == VERIFIERS[qa["family"]]
        if rec["hit_limit"]:  # cut at the token limit: never verified, never accepted (issue #36 C)
            assert (rec["match"], rec["reason"], rec["extracted"]) == (False, "hit_token_limit", None)
        else:
            decision = verify_response(rec["verifier"], rec["response"], qa["answers"], options=qa["options"] or None)
            assert (rec["match"], rec["reason"], rec["extracted"]) == (decision.match, decision.reason,
                                                                       decision.extracted)
        assert rec["prompt_tokens"] > 20 and 1 <= rec["generated_tokens"] <= 12
        if rec["hit_limit"]:
            assert rec["generated_tokens"] == 12
        assert rec["model"] == model_path and rec["revision"] is None  # a local directory has no revision
    assert len({rec["response"] for rec in records.values()}) > 5


@pytest.mark.slow
def test_finished_stage_rerun_makes_no_model_calls(reference, tmp_path, model_path, monkeypatch, capsys):
    out, records, _ = reference
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    recipe, _ = write_recipe(copy, model_path)

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded although nothing was pending")

    monkeypatch.setattr("rsgen.engine.models.load_model_and_processor", no_model)
    from rsgen.generate import run_generate

    parts_before = CheckpointStore(OutputLayout(copy).generate_work).parts()
    summary = run_generate(recipe, distributed_state())
    assert summary.done_now == 0 and summary.engine is None and summary.already_done == len(records)
    assert CheckpointStore(OutputLayout(copy).generate_work).parts() == parts_before
    assert "nothing pending" in capsys.readouterr().out


@pytest.mark.slow
def test_num_samples_gives_one_record_per_sample(tmp_path, prepared_pool, model_path):
    out = fresh_output_dir(tmp_path, prepared_pool, "samples")
    recipe, _ = write_recipe(out, model_path, num_samples=2, temperature=1.0, top_p=0.9, max_new_tokens=6)
    from rsgen.generate import run_generate

    run_generate(recipe, distributed_state())
    records = CheckpointStore(OutputLayout(out).generate_work).records()
    pairs = prepared_pairs(out)
    assert sorted(records) == sorted(f"{qa_id}#{s}" for qa_id in pairs for s in (0, 1))
    assert all(rec["key"] == f"{rec['id']}#{rec['sample']}" for rec in records.values())
    differ = sum(records[f"{i}#0"]["response"] != records[f"{i}#1"]["response"] for i in pairs)
    assert differ > len(pairs) // 2


# ----------------------------------------------------------------------------------------- subprocesses


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(recipe_path: Path, processes: int, log: Path) -> subprocess.Popen:
    """`rsgen generate` as a user runs it: directly, or through `accelerate launch` with two CPU processes."""
    if processes == 1:
        cmd = [sys.executable, "-m", "rsgen", "generate", "--config", str(recipe_path)]
    else:
        cmd = [
            sys.executable, "-m", "accelerate.commands.launch",
            "--config_file", str(CPU_2PROC), "--num_processes", str(processes),
            "--main_process_port", str(_free_port()),
            "-m", "rsgen", "generate", "--config", str(recipe_path),
        ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)


def run_to_end(recipe_path: Path, processes: int, log: Path, timeout: float = 600) -> None:
    proc = launch(recipe_path, processes, log)
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        kill_tree(proc)
    assert rc == 0, log.read_text()[-4000:]


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started (torchrun puts workers in their own sessions)."""
    try:
        root = psutil.Process(proc.pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:  # already exited (and reaped)
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(tree, timeout=10)


def kill_at_random_point(recipe_path: Path, processes: int, log: Path, total: int, rng: random.Random) -> int:
    """Start a run and SIGKILL it once a random number of records (at least one part) is on disk."""
    threshold = rng.randint(1, total // 2)
    store = CheckpointStore(recipe_path.parent / "work" / "generate")
    proc = launch(recipe_path, processes, log)
    deadline = time.monotonic() + 600
    while len(store.done_keys()) < threshold:
        assert proc.poll() is None, f"the run ended before it could be killed:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.02)
    kill_tree(proc)
    return len(store.done_keys())


def rank_of_parts(output_dir: Path) -> set[str]:
    return {p.name.split("-rank")[1][:5] for p in CheckpointStore(OutputLayout(output_dir).generate_work).parts()}


@pytest.mark.slow
def test_two_processes_answer_every_pair_exactly_once(reference, tmp_path, prepared_pool, model_path):
    _, expected, _ = reference
    out = fresh_output_dir(tmp_path, prepared_pool, "two")
    _, recipe_path = write_recipe(out, model_path, max_batch_size=8)
    run_to_end(recipe_path, 2, tmp_path / "two.log")

    assert sorted(part_keys(out)) == sorted(prepared_pairs(out))  # every pair, exactly once
    assert rank_of_parts(out) == {"00000", "00001"}  # two ranks shared the work (not two copies of rank 0)
    assert CheckpointStore(OutputLayout(out).generate_work).records() == expected  # process count changes nothing


@pytest.mark.slow
@pytest.mark.parametrize(("killed_processes", "restart_processes"), [(2, 1), (1, 2)])
def test_sigkill_then_restart_equals_uninterrupted_run(
    reference, tmp_path, prepared_pool, model_path, killed_processes, restart_processes
):
    _, expected, _ = reference
    seed = random.randrange(10**6)
    rng = random.Random(seed)
    out = fresh_output_dir(tmp_path, prepared_pool, "killed")
    # Small batches and parts, so there are many points to be killed at.
    recipe, recipe_path = write_recipe(out, model_path, max_batch_size=2, checkpoint_every_items=2)
    log = tmp_path / "run.log"

    done_at_kill = kill_at_random_point(recipe_path, killed_processes, log, len(expected), rng)
    assert 0 < done_at_kill < len(expected), f"seed {seed}"
    parts_at_kill = set(CheckpointStore(OutputLayout(out).generate_work).parts())
    if restart_processes == 1:
        from rsgen.generate import run_generate

        summary = run_generate(recipe, distributed_state())  # in this process: one process, no launcher
        assert summary.done_now == len(expected) - done_at_kill
    else:
        run_to_end(recipe_path, restart_processes, log)
        restart_parts = set(CheckpointStore(OutputLayout(out).generate_work).parts()) - parts_at_kill
        assert {p.name.split("-rank")[1][:5] for p in restart_parts} == {"00000", "00001"}

    assert sorted(part_keys(out)) == sorted(expected), f"duplicates or losses (seed {seed})"
    assert CheckpointStore(OutputLayout(out).generate_work).records() == expected, f"seed {seed}"
