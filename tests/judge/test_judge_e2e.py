"""The judge stage end to end with a real tiny transformers model (a random zoo VLM): real loading through the
generation loader, real batched generation, strict parsing, checkpoints, and SIGKILL + restart via the CLI."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml
from judge_helpers import Pair, make_recipe, write_output_dir

from rsgen.judge import judge_summary, run_judge
from rsgen.judge.prompt import render_judge_prompt
from rsgen.judge.verdict import VERDICTS, parse_verdict
from rsgen.layout import OutputLayout
from rsgen.store import CheckpointStore, distributed_state

pytestmark = pytest.mark.slow

ARCH = "qwen2_vl"


@pytest.fixture
def tiny_model(tiny_vlm_factory):
    return tiny_vlm_factory(ARCH)


def pairs(n_rejected: int, n_accepted: int) -> list[Pair]:
    out = [Pair(f"acc{i:03d}", [str(i)], match=True, extracted=str(i)) for i in range(n_accepted)]
    # Not numbers ("about 4"), so not decisive mismatches: every one goes to the judge.
    out += [Pair(f"rej{i:03d}", [str(i)], match=False, extracted=f"about {i + 1}") for i in range(n_rejected)]
    out.append(Pair("none", ["1"], match=False, extracted=None, reason="no_answer"))
    return out


def test_end_to_end_with_a_tiny_model(tmp_path, tiny_model, caplog):
    caplog.set_level(logging.INFO, logger="rsgen")
    write_output_dir(tmp_path, pairs(6, 5))
    recipe = make_recipe(tmp_path, model_name_or_path=tiny_model, judge_max_new_tokens=8,
                         judge_calibration_size=3, enable_thinking=True)
    run_judge(recipe, distributed_state())
    records = CheckpointStore(OutputLayout(tmp_path).judge_work).records()
    assert len(records) == 15  # 6 rejected + 3 of each calibration side
    assert sum(r["kind"] == "calibration" for r in records.values()) == 3
    assert sum(r["kind"] == "known_wrong" for r in records.values()) == 3
    assert sum(r["kind"] == "known_right" for r in records.values()) == 3
    assert "none" not in records

    from rsgen.engine.models import load_config, load_processor

    processor = load_processor(tiny_model, config=load_config(tiny_model))
    for rec in records.values():
        assert rec["verdict"] in VERDICTS
        assert rec["verdict"] == parse_verdict(rec["response"], rec["hit_limit"])
        assert 0 < rec["generated_tokens"] <= 8
        assert rec["model"] == tiny_model
        # The model saw exactly the text-only judge prompt: its token count is the chat-templated prompt's.
        question = f"Question: how many things in scene {rec['id']}?\nAnswer in short without any other content."
        prompt = render_judge_prompt(question, rec["reference"], rec["candidate"])
        text = processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
            tokenize=False, add_generation_prompt=True, enable_thinking=True)
        assert rec["prompt_tokens"] == len(processor.tokenizer(text, add_special_tokens=False)["input_ids"])
    summary = judge_summary(tmp_path)
    assert summary["judged"] == 6 and summary["calibration_total"] == 3 and summary["known_wrong_total"] == 3
    assert f"agreed on {summary['calibration_agreed']}/3" in caplog.text


def _write_recipe(root, model, **extra) -> str:
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump({
        "output_dir": str(root), "model_name_or_path": model, "judge_max_new_tokens": 12,
        "judge_calibration_size": 4, "checkpoint_every_items": 1, "checkpoint_every_seconds": 1e9,
        "max_batch_size": 1, **extra}))
    return str(path)


def _all_lines(store: CheckpointStore) -> list[dict]:
    return [json.loads(line) for part in store.parts() for line in part.read_text().splitlines()]


def test_sigkill_and_restart_loses_and_duplicates_nothing(tmp_path, tiny_model, caplog):
    caplog.set_level(logging.INFO, logger="rsgen")
    killed, clean = tmp_path / "killed", tmp_path / "clean"
    for root in (killed, clean):
        root.mkdir()
        write_output_dir(root, pairs(24, 8))
        make_recipe(root)  # the verify stage's decisions, as scripted (the judge reads them)
    expected = 24 + 4 + 4 + 4  # rejected, then verifier-accepted, known-wrong and known-right calibration pairs
    store = CheckpointStore(OutputLayout(killed).judge_work)

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "rsgen", "judge", "--config", _write_recipe(killed, tiny_model)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while len(store.parts()) < 3 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    done_before = store.done_keys()
    assert 3 <= len(done_before) < expected  # killed in the middle of the stage

    # Restart (in this process, to save a second interpreter start-up).
    recipe = make_recipe(killed, model_name_or_path=tiny_model, judge_max_new_tokens=12, judge_calibration_size=4)
    run_judge(recipe, distributed_state())
    assert f"{len(done_before)} already done" in caplog.text
    lines = _all_lines(store)
    assert len(lines) == len({rec["key"] for rec in lines}) == expected  # nothing lost, nothing twice

    # The interrupted run's records are the uninterrupted run's records (greedy, batch-invariant).
    run_judge(make_recipe(clean, model_name_or_path=tiny_model, judge_max_new_tokens=12,
                          judge_calibration_size=4), distributed_state())
    reference = CheckpointStore(OutputLayout(clean).judge_work).records()
    got = store.records()
    assert got.keys() == reference.keys()
    fields = ("verdict", "response", "prompt_tokens", "generated_tokens", "kind", "reference", "candidate")
    assert {k: [got[k][f] for f in fields] for k in got} == {k: [reference[k][f] for f in fields] for k in got}


def test_a_text_only_causal_lm_judges_through_rsgen_run(tmp_path):
    """`rsgen run` with the shipped demo VLM generating and a separate tiny text-only chat LM (built here) judging,
    with its own template arguments."""
    from rsgen.testing.zoo import build_tiny_text_lm

    text_lm = build_tiny_text_lm(tmp_path / "text-lm")
    out_dir = tmp_path / "run"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({
        "output_dir": str(out_dir), "model_name_or_path": "rsgen-demo", "max_new_tokens": 96,
        "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 4, "demo_seed": 5, "family_column": "family",
                     "options_column": "options", "source_id_column": "source_id"}],
        "verifier": {"CLEVRMath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"},
        "judge_model_name_or_path": text_lm, "judge_chat_template_kwargs": {"enable_thinking": False},
        "judge_max_new_tokens": 6, "judge_calibration_size": 3, "judge_scope": "all", "prepare_num_proc": 1}))
    done = subprocess.run([sys.executable, "-m", "rsgen", "run", "--config", str(recipe)], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    records = CheckpointStore(OutputLayout(out_dir).judge_work).records()
    kinds = {r["kind"] for r in records.values()}
    assert {"rejected", "calibration", "known_wrong"} <= kinds
    assert all(r["model"] == text_lm for r in records.values())
    assert all(r["verdict"] == parse_verdict(r["response"], r["hit_limit"]) for r in records.values())
    stats = json.loads(OutputLayout(out_dir).stats_json.read_text())
    assert stats["judge_model"] == text_lm and stats["model"] == "rsgen-demo"
    assert stats["judge_counts"]["judged"] == sum(r["kind"] == "rejected" for r in records.values())
    assert f"re-examined by `{text_lm}`" in (OutputLayout(out_dir).dataset / "README.md").read_text()
