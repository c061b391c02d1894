"""Guard against per-item rescans (issue #35): the stages after generate read each checkpoint store and the prepared
pool a fixed number of times, whatever the number of QA pairs. A stage that re-read every part once per pair (the
judge once did, after its last answer: hours at 100k pairs) fails here, at a few hundred pairs.

The stages run for real on a scripted output directory (tests/judge/judge_helpers.py); the engines of explore,
judge and blind are scripted (`ScriptedJudgeEngine`, `ScriptedSampler`), since what is counted is the stages'
reads of their files, not what a model says. Counted: directory scans of each checkpoint store
(`CheckpointStore.parts`) and reads of the prepared pool (`PreparedPool.batches` / `take`), per stage, at two sizes.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "judge"))

from judge_helpers import FakeState, Pair, ScriptedJudgeEngine, write_output_dir  # noqa: E402

from rsgen.blind.stage import run_blind  # noqa: E402
from rsgen.config import recipe_from_dict  # noqa: E402
from rsgen.emit.stage import run_emit  # noqa: E402
from rsgen.engine import GenerationResult  # noqa: E402
from rsgen.explore import stage as explore_stage  # noqa: E402
from rsgen.judge.stage import run_judge  # noqa: E402
from rsgen.schema import PreparedPool  # noqa: E402
from rsgen.store import CheckpointStore  # noqa: E402
from rsgen.verify.stage import run_verify  # noqa: E402

SIZES = (40, 160)  # QA pairs


class ScriptedSampler:
    """An explore engine that answers every sample of a request with the same text (right for every third pair)."""

    revision = None

    def generate(self, requests):
        for request in requests:
            text = request.meta.answers[0] if int(request.meta.id[1:]) % 3 == 0 else "a few"
            for key in request.sample_keys:
                yield request, GenerationResult(text=text, prompt_tokens=3, generated_tokens=2, hit_limit=False,
                                                sample_key=key)


def pairs(n: int) -> list[Pair]:
    # Every third pair right; the others answer "a few" (no number: not a decisive mismatch, so judged).
    return [Pair(f"q{i:04d}", [str(i % 7 + 1)], match=i % 3 == 0, extracted=str(i % 7 + 1) if i % 3 == 0 else "a few")
            for i in range(n)]


def reads_per_stage(root: Path, n: int, last: str = "emit") -> dict[str, Counter]:
    """Reads per stage, verify through `last`, on a fresh output directory of `n` QA pairs."""
    write_output_dir(root, pairs(n), every_items=4)
    recipe = recipe_from_dict({
        "output_dir": str(root), "model_name_or_path": "test-model", "judge_calibration_size": 3,
        "checkpoint_every_items": 2, "checkpoint_every_seconds": 1e9, "blind_check": "flag", "explore_samples": 2,
    })
    counts: Counter = Counter()
    real_parts, real_batches, real_take = CheckpointStore.parts, PreparedPool.batches, PreparedPool.take

    def parts(self):
        counts[f"scans of work/{self.directory.name}"] += 1
        return real_parts(self)

    def batches(self, *args, **kwargs):
        counts["prepared pool reads"] += 1
        return real_batches(self, *args, **kwargs)

    def take(self, *args, **kwargs):
        counts["prepared pool reads"] += 1
        return real_take(self, *args, **kwargs)

    state = FakeState()
    per_stage = {}
    stages = {
        "verify": lambda: run_verify(recipe, state),
        "explore": lambda: explore_stage.run_explore(recipe, state),
        "judge": lambda: run_judge(recipe, state, engine=ScriptedJudgeEngine(lambda prompt: "UNSURE")),
        "blind": lambda: run_blind(recipe, state, engine=ScriptedJudgeEngine(lambda prompt: "a few")),
        "emit": lambda: run_emit(recipe, state),
    }
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(CheckpointStore, "parts", parts)
        mp.setattr(PreparedPool, "batches", batches)
        mp.setattr(PreparedPool, "take", take)
        mp.setattr(explore_stage, "build_engine", lambda *args, **kwargs: ScriptedSampler())
        for name, run in stages.items():
            counts.clear()
            run()
            per_stage[name] = Counter(counts)
            if name == last:
                break
    return per_stage


def test_no_stage_reads_its_files_once_per_pair(tmp_path):
    small, large = (reads_per_stage(tmp_path / str(n), n) for n in SIZES)
    for stage in small:
        assert small[stage], f"{stage}: nothing counted (the guard would not see a rescan)"
        assert large[stage] == small[stage], (
            f"{stage} reads its files more often with {SIZES[1]} QA pairs than with {SIZES[0]}: {dict(large[stage])} "
            f"against {dict(small[stage])} -- a per-item rescan (issue #35)")


def test_the_guard_sees_a_rescan(tmp_path, monkeypatch):
    """The measurement itself: the judge's old end-of-stage check (one read of the store per pair) fails it."""
    from rsgen.judge import stage as judge_stage

    real = judge_stage.run_keyed_work

    def rescanning(stage, store, *args, **kwargs):
        summary = real(stage, store, *args, **kwargs)
        [key for key in stage.by_key if key not in store.done_keys()]  # noqa: B015 -- the old per-pair check
        return summary

    monkeypatch.setattr(judge_stage, "run_keyed_work", rescanning)
    small, large = (reads_per_stage(tmp_path / str(n), n, last="judge") for n in SIZES)
    assert large["judge"]["scans of work/judge"] > small["judge"]["scans of work/judge"]
