"""The explore stage end to end with the shipped demo model: rounds and stopping, pass rates, reproducibility
across stopping rules, and SIGKILL mid-explore followed by a two-process resume."""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import datasets
import pytest
from explore_helpers import demo_explore_recipe
from launch_helpers import kill_tree, launch, run_to_end

from rsgen.explore.stage import CORRECT, WRONG, is_paired, verdict
from rsgen.layout import OutputLayout
from rsgen.records import ExploreRecord, GenerateRecord
from rsgen.schema import EXPLORE_RECORD_FIELDS, iter_questions, open_prepared
from rsgen.store import CheckpointStore, distributed_state
from rsgen.verifiers import verify_response


def records(output_dir: Path, stage: str = "explore") -> dict[str, dict]:
    return CheckpointStore(OutputLayout(output_dir).work / stage).records()


def typed(rec: dict):
    """A stored record as the stage reads it: an explore sample, or the greedy answer."""
    return ExploreRecord.from_json(rec) if "round" in rec else GenerateRecord.from_json(rec)


def questions_of(output_dir: Path):
    return {q.id: q for q in iter_questions(open_prepared(output_dir))}


@pytest.mark.slow
def test_samples_follow_the_rounds_and_the_paired_stop(explored_run):
    out, recipe = explored_run
    questions = questions_of(out)
    greedy, explored = records(out, "generate"), records(out)
    by_question: dict[str, dict[int, dict]] = {q: {} for q in questions}
    for rec in explored.values():
        assert rec["key"] == f"{rec['id']}#{rec['sample']}" and sorted(rec) == sorted(EXPLORE_RECORD_FIELDS)
        by_question[rec["id"]][rec["sample"]] = rec
        q = questions[rec["id"]]
        decision = verify_response(recipe.verifier_for(q.family), rec["response"], list(q.answers),
                                   options=list(q.options) or None)
        assert (rec["match"], rec["extracted"]) == (decision.match, decision.extracted)
        assert rec["round"] == rec["sample"].bit_length() - 1  # round r draws samples 2**r .. 2**(r+1)-1
    drawn_counts = set()
    for qa_id, samples in by_question.items():
        drawn = sorted(samples)
        assert drawn == list(range(1, len(drawn) + 1)) and len(drawn) in (1, 3, 4), (qa_id, drawn)
        drawn_counts.add(len(drawn))
        history = [greedy[qa_id]] + [samples[s] for s in drawn]
        verdicts = [verdict(typed(r), questions[qa_id], recipe) for r in history]
        # Closed exactly when the responses before the round held a pair.
        for end in (2, 4):  # responses before round 1 (greedy + 1) and before round 2 (greedy + 3)
            if len(history) > end:
                assert not is_paired(verdicts[:end]), qa_id
        if len(drawn) < 4:
            assert is_paired(verdicts), qa_id
    assert drawn_counts >= {1, 4}, "no question closed early, or none ran to the end: the test cannot tell"


@pytest.mark.slow
def test_pass_rates_in_the_work_records(explored_run):
    out, recipe = explored_run
    questions = questions_of(out)
    greedy, explored = records(out, "generate"), records(out)
    lines = [json.loads(line) for line in OutputLayout(out).explore_pass_rates.read_text().splitlines()]
    assert [r["id"] for r in lines] == list(questions)
    for rate in lines:
        history = [greedy[rate["id"]]] + [r for r in explored.values() if r["id"] == rate["id"]]
        verdicts = [verdict(typed(r), questions[rate["id"]], recipe) for r in history]
        assert rate["samples"] == len(history) and rate["correct"] == verdicts.count(CORRECT)
        assert rate["pass_rate"] == pytest.approx(rate["correct"] / rate["samples"])
        assert rate["paired"] == (CORRECT in verdicts and WRONG in verdicts)
    assert 0 < sum(r["paired"] for r in lines) < len(lines)


@pytest.mark.slow
def test_never_draws_every_sample_and_the_same_ones(explored_run, tmp_path):
    """`explore_stop: never` draws all N for every question; where both runs drew a sample, it is the same
    response (a sample depends on (seed, key) only, not on which other samples were drawn with it)."""
    from rsgen.explore import run_explore

    out, _ = explored_run
    copy = tmp_path / "never"
    shutil.copytree(out, copy)
    shutil.rmtree(OutputLayout(copy).explore_work)
    recipe, _ = demo_explore_recipe(copy, explore_stop="never")
    run_explore(recipe, distributed_state())
    paired, never = records(out), records(copy)
    assert sorted(never) == sorted(f"{q}#{s}" for q in questions_of(copy) for s in range(1, 5))
    assert len(paired) < len(never)
    for key, rec in paired.items():
        assert never[key]["response"] == rec["response"], key


def dataset_rows(output_dir: Path) -> dict[str, list]:
    data = OutputLayout(output_dir).dataset / "data"
    return {config.name: datasets.load_dataset("parquet", data_files=str(config / "*.parquet"), split="train")
            .to_list() for config in sorted(data.iterdir())}


@pytest.mark.slow
def test_sigkill_mid_explore_then_two_processes_give_the_identical_dataset(explored_run, tmp_path):
    out, _ = explored_run
    expected = dataset_rows(out)
    assert any(name.endswith("_dpo_onpolicy") for name in expected) and any(n.endswith("_grpo") for n in expected)
    killed = tmp_path / "killed"
    _, recipe_path = demo_explore_recipe(killed, max_batch_size=4, checkpoint_every_items=2)
    log = tmp_path / "run.log"
    total = len(records(out))
    threshold = random.Random().randint(1, total // 2)
    store = CheckpointStore(OutputLayout(killed).explore_work)
    proc = launch(["run", "--config", str(recipe_path)], 1, log)
    try:
        while len(store.done_keys()) < threshold:
            assert proc.poll() is None, f"the run ended before it could be killed:\n{log.read_text()[-4000:]}"
            time.sleep(0.02)
    finally:
        kill_tree(proc)
    done_at_kill = len(store.done_keys())
    assert 0 < done_at_kill < total
    assert not OutputLayout(killed).dataset.exists()
    run_to_end(["run", "--config", str(recipe_path)], 2, log)
    assert {p.name.split("-rank")[1][:5] for p in store.parts()} == {"00000", "00001"}
    assert records(killed) == records(out)
    assert dataset_rows(killed) == expected
