"""The explore stage: rounds of sampling beyond the greedy answer, each sample verified as it lands.

The greedy pass says whether the model got a question right once; training wants more: the model's own right
and wrong reasoning for the same question (on-policy DPO pairs), a pass rate per question (difficulty), and the
questions an RL run can still learn from (0 < pass rate < 1). With `explore_samples: N` this stage draws up to N
responses per question at `explore_temperature` / `explore_top_p`, in rounds over the questions still open:

- Round r draws samples 2**r .. 2**(r+1) - 1 (sample 0 is the greedy answer in work/generate/; samples 1..N
  are here, in work/explore/, one record per sample with the generate record's fields plus `round`). The
  samples of one question in a round are one request (`ChatRequest.sample_keys`): its image is encoded and its
  prompt prefilled once, and the cache is repeated per sample.
- `explore_stop: paired` closes a question once its responses so far hold a verified-correct one (the verifier
  matched) and a verified-wrong one (an extractable answer the verifier rejected, and with the judge on a
  decisive mismatch — others wait for the judge, which grades explore samples after this stage). `never`
  draws all N: exact pass rates.
- Whether a question is open in round r depends only on its samples below 2**r, and each sample only on
  (seed, its key) (`rsgen.engine.sampling`): a run killed at any point and resumed on any number of processes
  draws exactly the samples of the uninterrupted run. Each round is one call of the keyed-work loop
  (`rsgen.store.run_keyed_work`: ranks, resume, checkpoints, barrier); a question's samples stay on one rank.

At the end the main process writes work/explore_pass_rates.jsonl: per question the samples drawn (greedy
included), how many the verifier accepted, the pass rate, and whether a pair was found. Emit recomputes pass
rates with the judge's verdicts (a judge promotion counts as correct there).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from rsgen import routing
from rsgen.config import RecipeConfig, RecipeError
from rsgen.decisions import decide_response, decided_records
from rsgen.engine import ChatRequest, build_engine, check_engine
from rsgen.explore import STAGE
from rsgen.layout import OutputLayout
from rsgen.records import (
    CORRECT,
    WRONG,
    ExploreRecord,
    GenerateRecord,
    model_output,
    qa_id_of,
    records_by_key,
    sample_key,
    sample_of,
    verifier_fields,
)
from rsgen.schema import PreparedPool, PreparedQuestion, iter_questions, open_prepared, user_turn
from rsgen.store import CheckpointStore, distributed_state, run_keyed_work


def round_samples(round_index: int, explore_samples: int) -> range:
    """Sample indices drawn in a round: 1, then 2-3, then 4-7, ... up to `explore_samples`."""
    return range(2**round_index, min(2 ** (round_index + 1), explore_samples + 1))


def number_of_rounds(explore_samples: int) -> int:
    return explore_samples.bit_length()


def verdict(record: GenerateRecord, question: PreparedQuestion, recipe: RecipeConfig) -> str | None:
    """What a response counts as while sampling: CORRECT (the verifier matched), WRONG (an extractable answer the
    verifier rejected: final with the judge off, or when the mismatch is decisive and does not go to the judge),
    None (nothing extractable, or the judge has yet to grade it)."""
    if record.match:
        return CORRECT
    if not routing.needs_judging(record):
        return None
    if not recipe.judge or not routing.goes_to_judge(record, question.answers, question.options, recipe.judge_scope,
                                                     recipe.numeric_tolerance):
        return WRONG
    return None


def is_paired(verdicts: list[str | None]) -> bool:
    return CORRECT in verdicts and WRONG in verdicts


class ExploreRound:
    """One round of the explore stage for the keyed-work loop: the round's samples of the questions still open."""

    name = STAGE.name
    unit = "sample"

    def __init__(self, recipe: RecipeConfig, prepared: PreparedPool, round_index: int, keys: list[str],
                 questions: dict[str, PreparedQuestion]):
        self.recipe = recipe
        self.prepared = prepared
        self.round_index = round_index
        self._keys = keys
        self.questions = questions
        self.revision: str | None = None
        self.drawn = self.correct = 0

    def keys(self) -> list[str]:
        return self._keys

    @staticmethod
    def group(key: str) -> str:
        return qa_id_of(key)

    def requests(self, pending: list[str]) -> Iterator[ChatRequest]:
        """One request per question: its pending samples of this round share the prompt. Images are read once,
        as encoded bytes, as the engine asks for them."""
        by_question: dict[str, list[str]] = defaultdict(list)
        for key in pending:
            by_question[self.group(key)].append(key)
        by_row: dict[int, list[str]] = defaultdict(list)
        for qa_id in by_question:
            by_row[self.questions[qa_id].row].append(qa_id)
        rows = sorted(by_row)
        images = (image for table in self.prepared.take(rows, ["image"]) for image in table.column("image").to_pylist())
        for row_index, image in zip(rows, images):
            data = image.get("bytes")
            if data is None:
                raise RecipeError(f"prepared row {row_index} has no embedded image bytes; rerun `rsgen prepare`")
            for qa_id in by_row[row_index]:
                q = self.questions[qa_id]
                yield ChatRequest(qa_id, user_turn(q.question), [data], meta=q, sample_keys=tuple(by_question[qa_id]))

    def record(self, request: ChatRequest, result) -> dict[str, Any]:
        q: PreparedQuestion = request.meta
        verifier, decision = decide_response(self.recipe, q.family, result, q.answers, q.options)
        self.drawn += 1
        self.correct += bool(decision.match)
        return ExploreRecord(key=result.sample_key, id=q.id, sample=sample_of(result.sample_key), round=self.round_index,
                             family=q.family, question=q.question, **model_output(result),
                             **verifier_fields(decision, verifier), model=self.recipe.model_name_or_path,
                             revision=self.revision).to_json()

    def progress(self, record: dict[str, Any]) -> dict[str, str]:
        return {"round": str(self.round_index), "correct": f"{self.correct / max(self.drawn, 1):.1%}"}


logger = logging.getLogger(__name__)


def _log(state, message: str) -> None:
    if state.is_main_process:
        logger.info(message)


def check_explore(recipe: RecipeConfig) -> None:
    """Pre-flight: with an explore pass, the model is one the engine can load (its config only)."""
    if recipe.explore_samples:
        check_engine(recipe, "explore")


def run_explore(recipe: RecipeConfig, state=None) -> dict[str, Any] | None:
    """Draw this rank's share of every round; every rank of an `accelerate launch` calls this. Returns the
    summary (`explore_summary`) on the main process, else None."""
    state = state or distributed_state()
    if not recipe.explore_samples:
        _log(state, "explore_samples: 0 — no explore pass")
        return None
    layout = OutputLayout(recipe.output_dir)
    prepared = open_prepared(recipe.output_dir)
    questions = list(iter_questions(prepared))
    by_id = {q.id: q for q in questions}
    greedy = decided_records(recipe)  # the greedy answers with the verify stage's decisions
    missing = [q.id for q in questions if q.id not in greedy]
    if missing:
        raise RecipeError(f"generate is not finished in {recipe.output_dir!r}: {len(missing)} of {len(questions)} "
                          f"questions lack a greedy answer (e.g. {', '.join(missing[:3])}); run `rsgen generate` first")
    store = CheckpointStore(layout.explore_work)
    engine = None

    stage: ExploreRound | None = None

    def make_engine():  # loaded once, on the first round with work pending on this rank
        nonlocal engine
        if engine is None:
            engine = build_engine(recipe, "explore", device=state.device)
        stage.revision = engine.revision or recipe.model_revision
        return engine

    responses = recipe.explore_samples + 1  # per question: the greedy answer (sample 0) and the explore samples
    for round_index in range(number_of_rounds(recipe.explore_samples)):
        # every rank sees every finished round: run_keyed_work ends with a barrier
        drawn = records_by_key(store, ExploreRecord)
        keys = []
        for q in questions:
            history = [greedy[q.id]] + [drawn[k] for s in range(1, 2**round_index)
                                        if (k := sample_key(q.id, s, responses)) in drawn]
            if recipe.explore_stop == "paired" and is_paired([verdict(r, q, recipe) for r in history]):
                continue
            keys += [sample_key(q.id, s, responses) for s in round_samples(round_index, recipe.explore_samples)]
        if not keys:
            break
        stage = ExploreRound(recipe, prepared, round_index, keys, by_id)
        _log(state, f"round {round_index}: {len(keys)} samples of {len(keys) // len(round_samples(round_index, recipe.explore_samples))} open questions")
        start = time.perf_counter()
        summary = run_keyed_work(stage, store, state, make_engine, recipe.checkpoint_every_items,
                                 recipe.checkpoint_every_seconds)
        if summary.done_now:
            _log(state, f"round {round_index}: {summary.done_now} samples on rank {state.process_index} in "
                        f"{time.perf_counter() - start:.1f} s")
    if not state.is_main_process:
        return None
    rates = pass_rates(questions, greedy, records_by_key(store, ExploreRecord), recipe)
    write_pass_rates(layout.explore_pass_rates, rates)
    result = explore_summary(rates)
    _log(state, format_summary(result))
    return result


def pass_rates(questions: list[PreparedQuestion], greedy: dict[str, GenerateRecord],
               explored: dict[str, ExploreRecord], recipe: RecipeConfig) -> list[dict[str, Any]]:
    """Per question: samples drawn (greedy included), verifier-accepted ones, pass rate, pair found."""
    by_question: dict[str, list[ExploreRecord]] = defaultdict(list)
    for rec in explored.values():
        by_question[rec.id].append(rec)
    out = []
    for q in questions:
        history = [greedy[q.id], *sorted(by_question.get(q.id, []), key=lambda r: r.sample)]
        verdicts = [verdict(r, q, recipe) for r in history]
        correct = verdicts.count(CORRECT)
        out.append({"id": q.id, "family": q.family, "samples": len(history), "correct": correct,
                    "pass_rate": round(correct / len(history), 6), "paired": is_paired(verdicts)})
    return out


def write_pass_rates(path, rates: list[dict[str, Any]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "w", encoding="utf-8") as fh:
        for rate in rates:
            fh.write(json.dumps(rate, ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def explore_summary(rates: list[dict[str, Any]]) -> dict[str, Any]:
    families: dict[str, Counter] = defaultdict(Counter)
    for rate in rates:
        fam = families[rate["family"]]
        fam["questions"] += 1
        fam["samples"] += rate["samples"]
        fam["paired"] += rate["paired"]
        fam["learnable"] += 0 < rate["pass_rate"] < 1
    total = sum(families.values(), Counter())
    return {"families": {f: dict(c) for f, c in sorted(families.items())}, "total": dict(total)}


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"{'family':<16} {'questions':>9} {'samples':>8} {'paired':>7} {'0<pass<1':>9}"]
    for name, c in [*summary["families"].items(), ("total", summary["total"])]:
        lines.append(f"{name:<16} {c.get('questions', 0):>9} {c.get('samples', 0):>8} {c.get('paired', 0):>7} "
                     f"{c.get('learnable', 0):>9}")
    return "\n".join(lines)
