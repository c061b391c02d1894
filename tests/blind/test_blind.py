"""The blind check (issue #24) with the shipped demo model: `blind_check: flag` asks every accepted pair again
without its image, stats and card count what the records say; `drop` then removes exactly the blind-solvable pairs
from every split and view, and accepted + rejected + blind-dropped = prepared."""

from __future__ import annotations

import json

import datasets
import pytest

from rsgen.cli import main
from rsgen.layout import OutputLayout
from rsgen.records import BlindRecord, read_records
from rsgen.schema import load_prepared
from rsgen.store import CheckpointStore


def _pairs(dataset_dir, config) -> set[tuple[str, str]]:
    """(image sha256, question) of every QA pair in an RS split."""
    try:
        rows = datasets.load_dataset(str(dataset_dir), config, split="train")
    except ValueError:  # a config with no rows is not written
        return set()
    return {(row["image_sha256"], qa["question"]) for row in rows for qa in row["qa"]}


def _sft_pairs(dataset_dir, config) -> set[str]:
    try:
        rows = datasets.load_dataset(str(dataset_dir), config, split="train")
    except ValueError:
        return set()
    return {row["prompt"][0]["content"][-1]["text"] for row in rows}


def _blind(fam: dict) -> dict:
    """A family's blind figures; a family with nothing accepted has none (nothing was asked)."""
    return fam["blind"] or {"checked": 0, "solvable": 0, "dropped": 0}


@pytest.fixture(scope="module")
def flagged_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("blind") / "demo"
    main(["demo", "--output-dir", str(out), "--num-images", "6"])  # the demo recipe has blind_check: flag
    return out


def test_docs_quote_the_blind_line_this_command_prints(flagged_run):
    """docs/blind.md's figures are the line `rsgen demo --num-images 6` prints (the fixture's command)."""
    from pathlib import Path

    from rsgen.demo_command import blind_line

    line = blind_line(json.loads(OutputLayout(flagged_run).stats_json.read_text()))
    docs = (Path(__file__).resolve().parents[2] / "docs" / "blind.md").read_text()
    assert "`rsgen demo --num-images 6` prints" in docs and f"\n{line}\n" in docs, line


def test_flag_asks_every_accepted_pair_and_counts_what_the_records_say(flagged_run, capsys):
    out = flagged_run
    stats = json.loads((out / "stats.json").read_text())
    assert stats["blind_check"] == "flag"
    records = {r.id: r for r in read_records(CheckpointStore(OutputLayout(out).blind_work), BlindRecord)}
    sha_of = {qa["id"]: (row["image_sha256"], qa["question"]) for row in load_prepared(str(out)) for qa in row["qa"]}

    accepted = set()
    for family, fam in stats["families"].items():
        accepted |= _pairs(out / "dataset", f"{family}_RS_think")
        mine = [r for r in records.values() if r.family == family]
        assert fam["accepted_qa"] == len(mine), "every accepted pair has exactly one blind record"
        if not mine:  # a family with nothing accepted has nothing to ask without the image
            assert fam["blind"] is None
            continue
        assert fam["blind"]["checked"] == len(mine)
        assert fam["blind"]["solvable"] == sum(r.solvable for r in mine)
        assert fam["blind"]["dropped"] == 0 and fam["blind_dropped_qa"] == 0
        mc = [r for r in mine if r.options]
        assert fam["blind"]["mc_checked"] == len(mc)
        if mc:
            assert fam["blind"]["mc_chance_rate"] == pytest.approx(sum(1 / r.options for r in mc) / len(mc), abs=1e-6)
    assert {sha_of[i] for i in records} == accepted
    # The flag is in the data: clean_meta.qa_blind_solvable, per pair of `qa`, in both accepted splits.
    solvable_of = {sha_of[i]: r.solvable for i, r in records.items()}
    flags = 0
    for family in stats["families"]:
        for kind in ("think", "nothink"):
            try:
                rows = datasets.load_dataset(str(out / "dataset"), f"{family}_RS_{kind}", split="train")
            except ValueError:
                continue
            for row in rows:
                got = row["clean_meta"]["qa_blind_solvable"]
                assert got == [solvable_of[(row["image_sha256"], qa["question"])] for qa in row["qa"]]
                flags += sum(got)
    assert flags == 2 * sum(r.solvable for r in records.values())
    for rec in records.values():
        assert "<image>" not in rec.question and rec.question == sha_of[rec.id][1]

    card = (out / "dataset" / "README.md").read_text()
    assert "## Blind check" in card
    for family, fam in stats["families"].items():
        if fam["blind"] is not None:
            assert f"| {family} | {fam['blind']['checked']} | {fam['blind']['solvable']} |" in card


def test_drop_removes_exactly_the_blind_solvable_pairs_from_every_split_and_view(flagged_run, capsys):
    out = flagged_run
    before = json.loads((out / "stats.json").read_text())
    kept = {f: {k: _pairs(out / "dataset", f"{f}_RS_{k}") for k in ("think", "nothink")} | {
        "rejected": _pairs(out / "dataset", f"{f}_rejected"), "sft": _sft_pairs(out / "dataset", f"{f}_sft")}
        for f in before["families"]}
    records = list(read_records(CheckpointStore(OutputLayout(out).blind_work), BlindRecord))
    sha_of = {qa["id"]: (row["image_sha256"], qa["question"]) for row in load_prepared(str(out)) for qa in row["qa"]}
    solvable = {sha_of[r.id] for r in records if r.solvable}
    assert solvable, "the measurement needs blind-solvable pairs to drop"

    main(["emit", "--config", str(out / "dataset" / "recipe.yaml"), "--blind_check", "drop"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["blind_check"] == "drop"
    t = stats["totals"]
    assert t["prepared_qa"] == t["accepted_qa"] + t["rejected_qa"] + t["blind_dropped_qa"] == before["totals"]["prepared_qa"]
    assert t["blind_dropped_qa"] == len(solvable)
    for family, fam in stats["families"].items():
        assert fam["prepared_qa"] == fam["accepted_qa"] + fam["rejected_qa"] + fam["blind_dropped_qa"]
        was_solvable = _blind(before["families"][family])["solvable"]
        assert fam["blind_dropped_qa"] == _blind(fam)["dropped"] == was_solvable
        for kind in ("think", "nothink"):
            assert _pairs(out / "dataset", f"{family}_RS_{kind}") == kept[family][kind] - solvable
        assert _pairs(out / "dataset", f"{family}_rejected") == kept[family]["rejected"]
        assert _sft_pairs(out / "dataset", f"{family}_sft") == kept[family]["sft"] - {q for _, q in solvable}
    card = (out / "dataset" / "README.md").read_text()
    assert "reason `blind_solvable`" in card


@pytest.mark.slow  # a subprocess killed with SIGKILL
def test_blind_stage_resumes_after_sigkill_with_an_identical_dataset(tmp_path):
    import os
    import shutil
    import signal
    import subprocess
    import sys
    import time

    reference = tmp_path / "reference"
    main(["demo", "--output-dir", str(reference), "--num-images", "12"])
    killed = tmp_path / "killed"
    shutil.copytree(reference, killed)
    shutil.rmtree(killed / "work" / "blind")
    shutil.rmtree(killed / "dataset")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((reference / "dataset" / "recipe.yaml").read_text().replace(str(reference), str(killed)))
    flags = ["--checkpoint_every_items", "1", "--max_batch_size", "1"]  # a part per pair: a kill lands mid-stage
    store = CheckpointStore(OutputLayout(killed).blind_work)
    proc = subprocess.Popen([sys.executable, "-m", "rsgen", "blind", "--config", str(recipe), *flags],
                            env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    while len(store.parts()) < 2 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    expected = len(CheckpointStore(OutputLayout(reference).blind_work).done_keys())
    assert 1 <= len(store.done_keys()) < expected, "killed in the middle of the stage"

    main(["run", "--config", str(recipe), *flags])  # resumes the blind stage, then emits
    got = {k: (r["response"], r["solvable"]) for k, r in store.records().items()}
    want = {k: (r["response"], r["solvable"])
            for k, r in CheckpointStore(OutputLayout(reference).blind_work).records().items()}
    assert got == want
    for path in sorted((reference / "dataset" / "data").rglob("*.parquet")):
        assert (killed / path.relative_to(reference)).read_bytes() == path.read_bytes(), path
    assert json.loads((killed / "stats.json").read_text())["families"] == \
        json.loads((reference / "stats.json").read_text())["families"]


@pytest.mark.slow  # trains with TRL
def test_sft_trains_on_the_view_left_after_drop(flagged_run, tmp_path):
    from trl import SFTConfig, SFTTrainer

    from rsgen.engine.models import demo_model_path, load_model_and_processor

    out = flagged_run
    main(["emit", "--config", str(out / "dataset" / "recipe.yaml"), "--blind_check", "drop"])
    stats = json.loads((out / "stats.json").read_text())
    assert stats["totals"]["blind_dropped_qa"] > 0
    family = max(stats["families"], key=lambda f: stats["families"][f]["splits"].get("sft", {}).get("rows", 0))
    rows = datasets.load_dataset(str(out / "dataset"), f"{family}_sft", split="train")
    assert len(rows) == stats["families"][family]["accepted_qa"]
    model, processor = load_model_and_processor(str(demo_model_path()), device="cpu")
    trainer = SFTTrainer(model=model.train(), processing_class=processor, train_dataset=rows,
                         args=SFTConfig(output_dir=str(tmp_path / "sft"), max_length=None, use_cpu=True, bf16=False,
                                        max_steps=2, per_device_train_batch_size=2, report_to=[]))
    trainer.train()
    assert trainer.state.global_step == 2
    import math

    assert math.isfinite(trainer.state.log_history[-1]["train_loss"])


def test_records_of_pairs_no_longer_accepted_or_of_other_verifier_settings_are_set_aside(flagged_run, tmp_path, caplog):
    """A scripted engine (named as such: this test is about which records count, not about the model) answers
    whatever it is asked; a change of the verifier settings sets the old records aside and asks again."""
    import logging
    import shutil

    from rsgen.blind.stage import run_blind
    from rsgen.config import load_recipe

    source = flagged_run  # copied: this test changes its verifier settings
    out = tmp_path / "out"
    shutil.copytree(source, out)
    text = (source / "dataset" / "recipe.yaml").read_text().replace(str(source), str(out))
    (tmp_path / "r.yaml").write_text(text)
    recipe = load_recipe(str(tmp_path / "r.yaml"))
    store = CheckpointStore(OutputLayout(out).blind_work)
    before = store.records()
    assert before

    class ScriptedEngine:
        revision = None
        stats: dict = {}

        def generate(self, requests):
            from rsgen.engine import GenerationResult

            for request in requests:
                assert request.images == [] and all(p["type"] == "text" for p in request.messages[0]["content"])
                yield request, GenerationResult(text="unrelated", prompt_tokens=1, generated_tokens=1, hit_limit=False)

    caplog.set_level(logging.INFO)
    run_blind(recipe, engine=ScriptedEngine())  # same settings: nothing is asked again
    assert store.records() == before
    import dataclasses

    main(["verify", "--config", str(tmp_path / "r.yaml"), "--numeric_tolerance", "0.5"])  # decide again, no model
    changed = dataclasses.replace(recipe, numeric_tolerance=0.5)
    run_blind(changed, engine=ScriptedEngine())
    assert f"{len(before)} records set aside" in caplog.text
    after = store.records()
    assert after.keys() == before.keys() and all(r["response"] == "unrelated" for r in after.values())


@pytest.mark.slow  # accelerate launch, two CPU processes
def test_two_processes_share_the_blind_stage_and_give_the_same_records(flagged_run, tmp_path):
    import os
    import shutil
    import socket
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    out = tmp_path / "two"
    shutil.copytree(flagged_run, out)
    shutil.rmtree(out / "work" / "blind")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text((flagged_run / "dataset" / "recipe.yaml").read_text().replace(str(flagged_run), str(out)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
         str(repo / "accelerate_configs" / "cpu_2proc.yaml"), "--num_processes", "2", "--main_process_port", str(port),
         "-m", "rsgen", "blind", "--config", str(recipe), "--blind_check", "flag"],
        cwd=repo, env={**os.environ, "PYTHONUNBUFFERED": "1"}, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    store = CheckpointStore(OutputLayout(out).blind_work)
    assert {p.name.split("-")[1] for p in store.parts()} == {"rank00000", "rank00001"}, "both ranks did work"
    want = CheckpointStore(OutputLayout(flagged_run).blind_work).records()
    assert {k: (r["response"], r["solvable"]) for k, r in store.records().items()} == \
        {k: (r["response"], r["solvable"]) for k, r in want.items()}
