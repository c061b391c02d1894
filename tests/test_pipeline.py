"""`rsgen run` end to end with the shipped demo model: one process vs two (accelerate), and SIGKILL in every stage.

The reference is one uninterrupted single-process run; the other runs must end with the same dataset rows. The
demo model answers part of the questions right and its judge promotes some rejections, so every config (accepted,
promoted, rejected, `_sft`, `_dpo`) has rows to compare.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from run_helpers import BIN, ROOT, dataset_rows, finish, launch, rsgen

pytestmark = pytest.mark.slow


def write_recipe(tmp: Path, model: str, name: str, source: dict | None = None, **overrides) -> Path:
    """A small demo pool the shipped model gets partly right; the leniency gate is off so the judge's promotions
    reach the accepted splits (with the gate on, these few questions measure too little to trust the judge).
    `source` overrides keys of the pool's source."""
    recipe = {
        "model_name_or_path": model,
        "output_dir": str(tmp / name),
        "sources": [
            {
                "dataset_name": "rsgen-demo",
                "demo_num_images": 10,
                "demo_seed": 11,
                "family_column": "family",
                "options_column": "options",
                "source_id_column": "source_id",
                **(source or {}),
            }
        ],
        "max_new_tokens": 96,  # the demo model's reasoning trace fits
        "judge_max_new_tokens": 32,
        "token_budget": 512,  # small batches, so every stage writes several checkpoint parts
        "checkpoint_every_items": 2,
        "verifier": {"CLEVRMath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"},
        "judge_calibration_size": 4,
        "judge_min_specificity": 0.0,
        "prepare_num_proc": 1,
        **overrides,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def env() -> dict:
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def rsgen_run(recipe: Path, processes: int = 1) -> subprocess.Popen:
    return rsgen("run", "--config", str(recipe), processes=processes, cwd=recipe.parent, env=env())


def launch_machine(recipe: Path, machine_rank: int) -> subprocess.Popen:
    """One "machine" of a two-machine launch on localhost: one CPU process each, main process on 127.0.0.1."""
    cmd = [str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "accelerate_configs/cpu_2proc.yaml"),
           "--num_machines", "2", "--num_processes", "2", "--machine_rank", str(machine_rank),
           "--main_process_ip", "127.0.0.1", "--main_process_port", "29633", "-m", "rsgen", "run",
           "--config", str(recipe)]
    return launch(cmd, cwd=recipe.parent, env=env())


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pipeline")
    model = "rsgen-demo"
    recipe = write_recipe(tmp, model, "reference")
    finish(rsgen_run(recipe))
    return tmp, model, dataset_rows(tmp / "reference")


def test_reference_run_is_complete(reference):
    tmp, _, rows = reference
    stats = json.loads((tmp / "reference" / "stats.json").read_text())
    assert set(stats["families"]) == {"CLEVRMath", "DemoChart", "DemoMC"}
    for family, fam in stats["families"].items():
        assert any(name.startswith(family) for name in rows)
        assert fam["accepted_qa"] + fam["rejected_qa"] == fam["prepared_qa"]
    # The comparisons below see accepted, promoted and `_sft` rows, not only rejections.
    assert stats["totals"]["accepted_qa"] > 0
    assert stats["judge_counts"]["promoted"] > 0, stats["judge_counts"]
    assert sum(len(r) for name, r in rows.items() if name.endswith("_sft")) > 0
    assert sum(len(r) for name, r in rows.items() if name.endswith("_RS_think")) > 0
    run = json.loads((tmp / "reference" / "run.json").read_text())
    assert set(run["stages"]) == {"prepare", "generate", "verify", "judge", "emit"}
    assert run["finished_at"] and run["packages"]["transformers"]


@pytest.mark.floors  # .ci/run runs it on the declared floors too
def test_two_processes_give_the_same_dataset(reference):
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "two_procs")
    out = finish(rsgen_run(recipe, processes=2))
    assert "2 process" in out  # the stages saw two ranks
    assert dataset_rows(tmp / "two_procs") == rows


def test_two_machines_on_localhost_give_the_same_dataset(reference):
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "two_machines")
    machines = [launch_machine(recipe, rank) for rank in (0, 1)]
    outs = [finish(m) for m in machines]
    assert "rank 1 of 2" in "".join(outs) or "2 process" in "".join(outs)
    assert dataset_rows(tmp / "two_machines") == rows


def test_second_run_on_a_busy_output_dir_is_refused(reference):
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "busy")
    first = rsgen_run(recipe)
    lock = tmp / "busy" / "rsgen.lock"
    while first.poll() is None and not lock.exists():
        time.sleep(0.01)
    start = time.perf_counter()
    second = subprocess.run([sys.executable, "-m", "rsgen", "run", "--config", str(recipe)], cwd=tmp, env=env(),
                            capture_output=True, text=True, timeout=120)
    refused_in = time.perf_counter() - start
    assert second.returncode == 2, second.stderr[-2000:]
    assert f"pid {first.pid}" in second.stderr and "in use by another rsgen run" in second.stderr
    assert refused_in < 30
    finish(first)
    assert dataset_rows(tmp / "busy") == rows
    assert not lock.exists()


def read_progress(proc: subprocess.Popen, output: list[str]) -> None:
    """Collect the process's output (progress bars end lines with \r) as it comes."""
    for chunk in iter(lambda: proc.stdout.read(1), ""):
        output.append(chunk)


# The SIGTERM tests need a generate stage that lasts well past the progress bar's first update (after 1 s) on any
# machine, idle CI included: a larger pool than the other tests', answered one row per batch. The reference and the
# rerun answer one row per batch too: on CPU a wide batch can tip a greedy near-tie (one response of 324 read
# "reaches 1" batched and "reaches 2" alone, in one run of three), so answers the interrupted run wrote one at a
# time would differ from a reference answered in wide batches by chance, not by a bug. Rare checkpoints keep the
# reference and the rerun quick.
SIGTERM_POOL = {"demo_num_images": 40}
FAST = {"token_budget": 16384, "checkpoint_every_items": 256, "max_batch_size": 1}


@pytest.fixture(scope="module")
def sigterm_reference(reference):
    tmp, model, _ = reference
    recipe = write_recipe(tmp, model, "sigterm_reference", source=SIGTERM_POOL, **FAST)
    finish(rsgen_run(recipe))
    return tmp, model, dataset_rows(tmp / "sigterm_reference")


@pytest.mark.parametrize("processes", [1, 2])
def test_sigterm_mid_generate_flushes_every_record_and_rerun_is_clean(sigterm_reference, processes):
    """SIGTERM to every process of the run (what `scancel` does; under accelerate the workers then get it a second
    time from the launcher)."""
    tmp, model, rows = sigterm_reference
    name = f"sigterm{processes}"
    # Checkpoints that never flush on their own: whatever is on disk afterwards was flushed by the SIGTERM. One row
    # per batch (batching changes speed, not answers).
    recipe = write_recipe(tmp, model, name, source=SIGTERM_POOL, checkpoint_every_items=10**9,
                          checkpoint_every_seconds=10**9, max_batch_size=1)
    work = tmp / name / "work" / "generate"
    reference_work = tmp / "sigterm_reference" / "work" / "generate"
    items = sum(len(p.read_text().splitlines()) for p in reference_work.glob("*.jsonl"))
    proc = rsgen_run(recipe, processes)
    output: list[str] = []
    reader = threading.Thread(target=read_progress, args=(proc, output), daemon=True)
    reader.start()
    progress = re.compile(r"generate[^:\r\n]*: +\d+%\|[^|]*\| *([1-9]\d*)/(\d+)")  # rank 0's bar
    while proc.poll() is None and not progress.search("".join(output)):
        time.sleep(0.01)
    done, total = map(int, progress.search("".join(output)).groups())
    assert done < total, "generate ended before the signal"
    os.killpg(proc.pid, signal.SIGTERM)
    start = time.perf_counter()
    proc.wait(timeout=60)
    reader.join(timeout=10)
    seconds, out = time.perf_counter() - start, "".join(output)
    assert proc.returncode != 0 and "interrupted; rerun the same command to continue" in out, out[-3000:]
    if processes == 1:
        assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in out, out[-3000:]
    parts = list(work.glob("*.jsonl"))
    flushed = sum(len(p.read_text().splitlines()) for p in parts)
    print(f"{processes} process(es): SIGTERM after {done} of rank 0's {total} items ({items} in all); {flushed} on "
          f"disk afterwards; processes gone in {seconds:.1f} s")
    assert done <= flushed < items, (done, flushed, items)
    assert {p.name.split("-rank")[1][:5] for p in parts} == {f"{rank:05d}" for rank in range(processes)}
    assert seconds < 60
    assert not (tmp / name / "rsgen.lock").exists()
    finish(rsgen_run(write_recipe(tmp, model, name, source=SIGTERM_POOL, **FAST)))
    assert dataset_rows(tmp / name) == rows


def test_a_part_cut_in_half_is_set_aside_and_redone(reference):
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "cut")
    finish(rsgen_run(recipe))
    work = tmp / "cut" / "work" / "generate"
    part = sorted(work.glob("*.jsonl"))[1]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    shutil.rmtree(tmp / "cut" / "dataset")
    out = finish(rsgen_run(recipe))
    assert f"checkpoint part {part} is damaged" in out
    assert (work / "quarantine" / part.name).read_bytes() == data[: len(data) // 2]
    assert dataset_rows(tmp / "cut") == rows


# What shows that a stage is in progress: its partial output exists on disk.
IN_PROGRESS = {
    "prepare": lambda d: (d / "prepared.partial").exists(),
    "generate": lambda d: any((d / "work" / "generate").glob("*.jsonl")),
    "judge": lambda d: any((d / "work" / "judge").glob("*.jsonl")),
    "emit": lambda d: (d / "dataset.partial").exists(),
}


def test_sigkill_in_every_stage_then_rerun_gives_the_same_dataset(reference):
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "killed")
    out_dir = tmp / "killed"
    killed_in = []
    for stage, in_progress in IN_PROGRESS.items():
        proc = rsgen_run(recipe)
        while proc.poll() is None and not in_progress(out_dir):
            time.sleep(0.01)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            killed_in.append(stage)
        else:
            proc.communicate()
    finish(rsgen_run(recipe))
    # Generation and judging are long enough that the kill always lands inside them.
    assert {"generate", "judge"} <= set(killed_in), killed_in
    assert dataset_rows(out_dir) == rows
    # And a rerun of a finished run does no model work.
    again = finish(rsgen_run(recipe))
    assert "Loading weights" not in again


# A fake `srun`, for the test of the Slurm script's launch logic: it starts the command once per "node" on this
# machine, as srun does once on each node of the allocation, with that node's SLURM_NODEID; its exit status is the
# worst of the tasks'. A fake `scontrol show hostnames`: both "nodes" are this machine.
FAKE_SRUN = """#!/usr/bin/env python3
import os, subprocess, sys
args, nodes = sys.argv[1:], 1
while args[0].startswith("--"):
    option = args.pop(0)
    if option.startswith("--nodes="):
        nodes = int(option.split("=", 1)[1])
tasks = [subprocess.Popen(args, env={**os.environ, "SLURM_NODEID": str(i), "SLURM_PROCID": str(i),
                                     "SLURM_LOCALID": "0"}) for i in range(nodes)]
sys.exit(max(task.wait() for task in tasks))
"""
FAKE_SCONTROL = "#!/bin/sh\necho 127.0.0.1\necho 127.0.0.1\n"


def test_slurm_script_on_two_fake_nodes_gives_the_same_dataset(reference, tmp_path):
    """scripts/slurm/rsgen.slurm as sbatch would run it on a two-node allocation (srun and scontrol faked, one CPU
    process per "node"): the same dataset rows as one process, every config (accepted, promoted, rejected, views)."""
    tmp, model, rows = reference
    recipe = write_recipe(tmp, model, "slurm_two_nodes")
    fake_bin = tmp_path / "fake_slurm_bin"
    fake_bin.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (fake_bin / name).write_text(text)
        (fake_bin / name).chmod(0o755)
    environ = {**env(), "PATH": f"{fake_bin}{os.pathsep}{env()['PATH']}", "SLURM_JOB_ID": "7",
               "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[0-1]", "SLURM_SUBMIT_DIR": str(ROOT),
               "PROCESSES_PER_NODE": "1", "ACCELERATE_CONFIG": "accelerate_configs/cpu_2proc.yaml",
               "MAIN_PORT": "29637"}
    done = subprocess.run(["bash", str(ROOT / "scripts/slurm/rsgen.slurm"), str(recipe), "--log_level", "info"],
                          env=environ, capture_output=True, text=True, timeout=900, start_new_session=True)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "2 nodes x 1 processes, main 127.0.0.1:29637" in done.stdout
    out = tmp / "slurm_two_nodes"
    assert json.loads((out / "run.json").read_text())["world_size"] == 2
    ranks = {re.search(r"-rank(\d+)-", p.name).group(1) for p in (out / "work" / "generate").glob("*.jsonl")}
    assert ranks == {"00000", "00001"}  # both "nodes" generated
    progress = json.loads((out / "progress.json").read_text())
    assert progress["state"] == "finished" and progress["world_size"] == 2
    assert progress["stages"]["generate"]["done"] == progress["stages"]["generate"]["total"]
    assert progress["stages"]["generate"]["ranks_reporting"] == 2
    assert dataset_rows(out) == rows
