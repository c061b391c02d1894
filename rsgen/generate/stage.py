"""The generate stage: the model answers every prepared question; each answer is verified and checkpointed.

Work is a globally ordered list of keys (a QA id, or `id#sample` with `num_samples > 1`) run by the keyed-work
loop (`rsgen.store.run_keyed_work`): striped across the ranks of an `accelerate launch`, done keys skipped, so a
restart with any number of processes redoes nothing; each rank writes its own checkpoint parts under
OUTPUT_DIR/work/generate/. When nothing is pending the model is not even loaded. This module supplies only the
requests (image + question) and how a response becomes a verified record.
"""

from __future__ import annotations

import gc
import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.decisions import decide_response
from rsgen.engine import ChatRequest, build_engine, check_engine
from rsgen.generate import STAGE
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, model_output, read_records, sample_key, verifier_fields
from rsgen.references import check_references
from rsgen.schema import PreparedPool, PreparedQuestion, iter_questions, open_prepared, qa_ids, user_turn
from rsgen.store import CheckpointStore, KeyedWorkSummary, distributed_state, run_keyed_work
from rsgen.verifiers.decision import NO_ANSWER

logger = logging.getLogger(__name__)

PROGRESS_SECONDS = 1.0  # the progress bar's mininterval (rsgen.store.keyed_work)


@dataclass(frozen=True)
class WorkItem(PreparedQuestion):
    """A QA pair to answer, and which of its samples (`num_samples > 1`)."""

    key: str
    sample: int


def ordered_keys(prepared: PreparedPool, num_samples: int) -> list[str]:
    """Every work key of the prepared pool (each QA pair, each sample), in the pool's stable order."""
    ids = [qa_id for qa_id, _ in qa_ids(prepared)]
    if len(set(ids)) != len(ids):  # read again for the rows to name
        seen: dict[str, int] = {}
        for qa_id, row in qa_ids(prepared):
            if qa_id in seen:
                raise RecipeError(
                    f"prepared pool has QA id {qa_id!r} twice (rows {seen[qa_id]} and {row}); "
                    "ids must be unique: rerun `rsgen prepare` into a fresh output_dir"
                )
            seen[qa_id] = row
    return [sample_key(qa_id, sample, num_samples) for qa_id in ids for sample in range(num_samples)]


def work_items(prepared: PreparedPool, num_samples: int, wanted: set[str]) -> list[WorkItem]:
    """The items of the `wanted` keys, in the pool's order (only these are kept in memory: a rank needs the
    question and answers of its own pending items, not of the whole pool)."""
    items: list[WorkItem] = []
    for q in iter_questions(prepared):
        for sample in range(num_samples):
            key = sample_key(q.id, sample, num_samples)
            if key in wanted:
                items.append(WorkItem(q.id, q.row, q.family, q.question, q.answers, q.options, key, sample))
    return items


def _requests(prepared: PreparedPool, pending: list[WorkItem]) -> Iterator[ChatRequest]:
    """Requests for the pending items, reading each needed image once, as encoded bytes (the engine's workers
    decode them). A generator: rows are read as the engine asks for them, not all up front."""
    by_row: dict[int, list[WorkItem]] = defaultdict(list)
    for item in pending:
        by_row[item.row].append(item)
    rows = sorted(by_row)
    images = (image for table in prepared.take(rows, ["image"]) for image in table.column("image").to_pylist())
    for row_index, image in zip(rows, images):
        data = image.get("bytes")
        if data is None:
            raise RecipeError(
                f"prepared row {row_index} has no embedded image bytes (path {image.get('path')!r}); "
                "rerun `rsgen prepare`"
            )
        for item in by_row[row_index]:
            yield ChatRequest(item.key, user_turn(item.question), [data], meta=item)


def make_record(item: WorkItem, response, decision, verifier: str, model_id: str,
                revision: str | None) -> GenerateRecord:
    return GenerateRecord(key=item.key, id=item.id, sample=item.sample, family=item.family, question=item.question,
                          **model_output(response), **verifier_fields(decision, verifier), model=model_id,
                          revision=revision)


class GenerateStage:
    """The generate stage's part of the keyed-work loop: every QA pair (and sample) of the prepared pool."""

    name = STAGE.name
    unit = "sample"

    def __init__(self, recipe: RecipeConfig, prepared: PreparedPool):
        self.recipe = recipe
        self.prepared = prepared
        self.revision: str | None = None  # set from the engine once it is loaded
        self.generated = self.accepted = self.generated_tokens = 0
        self.start = time.perf_counter()
        self.progress_at = float("-inf")  # the first record shows its postfix at once
        # Per family, the summary table's counts of the records this call wrote: [items, accepted, no answer, hit
        # limit, generated tokens] (rsgen.generate.stage.print_summary_table).
        self.per_family: dict[str, list[int]] = {}

    def keys(self) -> list[str]:
        return ordered_keys(self.prepared, self.recipe.num_samples)

    def requests(self, pending: list[str]) -> Iterator[ChatRequest]:
        return _requests(self.prepared, work_items(self.prepared, self.recipe.num_samples, set(pending)))

    def record(self, request: ChatRequest, response) -> dict[str, Any]:
        item: WorkItem = request.meta
        verifier, decision = decide_response(self.recipe, item.family, response, item.answers, item.options)
        self.generated += 1
        self.accepted += bool(decision.match)
        self.generated_tokens += response.generated_tokens
        record = make_record(item, response, decision, verifier, self.recipe.model_name_or_path,
                             self.revision).to_json()
        counts = self.per_family.get(item.family)
        if counts is None:
            counts = self.per_family[item.family] = [0, 0, 0, 0, 0]
        counts[0] += 1
        counts[1] += bool(record["match"])
        counts[2] += record["reason"] == NO_ANSWER
        counts[3] += bool(record["hit_limit"])
        counts[4] += record["generated_tokens"]
        return record

    def progress(self, record: dict[str, Any]) -> dict | None:
        """The bar's postfix, at most once per PROGRESS_SECONDS (the bar redraws no more often; formatting and
        setting it for every record was ~3% of the stage's time against the bench's stub, in cProfile)."""
        now = time.perf_counter()
        if now - self.progress_at < PROGRESS_SECONDS:
            return None
        self.progress_at = now
        elapsed = max(now - self.start, 1e-9)
        return {"tok/s": f"{self.generated_tokens / elapsed:.0f}", "accept": f"{self.accepted / self.generated:.1%}"}


def check_generate(recipe: RecipeConfig) -> None:
    """Pre-flight: the model is one the engine can load (its config only)."""
    check_engine(recipe, "generate")


def run_generate(recipe: RecipeConfig, state=None) -> KeyedWorkSummary:
    """Generate and verify this rank's pending items; every rank of an `accelerate launch` calls this."""
    # Everything alive before the stage (the modules, ~250k objects) is left out of the garbage collector's full
    # passes while it runs: it outlives the stage anyway, and one such pass cost ~0.1 s, 7-18 us per item of
    # bench/bench_server.py's stage part (timed with gc.callbacks; 0.7 us frozen). Objects made during the stage
    # are collected as ever.
    gc.freeze()
    try:
        return _run_generate(recipe, state)
    finally:
        gc.unfreeze()


def _run_generate(recipe: RecipeConfig, state) -> KeyedWorkSummary:
    state = state or distributed_state()
    layout = OutputLayout(recipe.output_dir)
    prepared = open_prepared(recipe.output_dir)
    # A verifier that cannot serve a family (a mapping without it, mc on free-form rows) fails here, before any
    # model work; references no verifier can use are announced before the model spends time on them.
    for warning in check_references(recipe, prepared):
        if state.is_main_process:
            logger.warning(warning)
    stage = GenerateStage(recipe, prepared)
    store = CheckpointStore(layout.generate_work)

    def make_engine():
        engine = build_engine(recipe, "generate", device=state.device)
        stage.revision = engine.revision or recipe.model_revision
        stage.start = time.perf_counter()
        return engine

    summary = run_keyed_work(stage, store, state, make_engine, recipe.checkpoint_every_items,
                             recipe.checkpoint_every_seconds)
    if state.is_main_process:
        # The store held nothing before and one process wrote it all: every record on disk is one this call
        # counted, so the table needs no second pass over them (~5% of the stage's CPU against bench_server's stub).
        alone = summary.world_size == 1 and summary.found == 0
        print_summary_table(store, summary, stage.per_family if alone else None)
    return summary


def print_summary_table(store: CheckpointStore, summary: KeyedWorkSummary,
                        counted: dict[str, list[int]] | None = None) -> None:
    """Per family over everything on disk (all ranks, all runs), then what this call did on this rank. `counted`:
    the per-family counts of every record on disk when the caller kept them (GenerateStage.per_family)."""
    per_family: dict[str, Counter] = defaultdict(Counter)
    fields = ("items", "accepted", "no_answer", "hit_limit", "tokens")
    for family, counts in (counted or {}).items():
        per_family[family].update(dict(zip(fields, counts)))
    for rec in read_records(store, GenerateRecord) if counted is None else ():
        fam = per_family[rec.family]
        fam["items"] += 1
        fam["accepted"] += bool(rec.match)
        fam["no_answer"] += rec.reason == NO_ANSWER
        fam["hit_limit"] += bool(rec.hit_limit)
        fam["tokens"] += rec.generated_tokens
    total = sum(per_family.values(), Counter())
    header = f"{'family':<16} {'items':>8} {'accepted':>9} {'rate':>7} {'no answer':>10} {'hit limit':>10} {'gen tokens':>11}"
    lines = ["", header, "-" * len(header)]
    for name, fam in sorted(per_family.items()) + [("total", total)]:
        rate = fam["accepted"] / fam["items"] if fam["items"] else 0.0
        lines.append(
            f"{name:<16} {fam['items']:>8} {fam['accepted']:>9} {rate:>7.1%} {fam['no_answer']:>10} "
            f"{fam['hit_limit']:>10} {fam['tokens']:>11}"
        )
    missing = summary.total - total["items"]
    lines.append(f"{'missing':<16} {missing:>8}" if missing else "every prepared item has a result")
    seconds = max(summary.seconds, 1e-9)
    if summary.done_now:
        stats = summary.engine.stats
        lines.append(
            f"this run (rank {summary.rank}): {summary.done_now} items in {summary.seconds:.1f} s "
            f"({summary.done_now / seconds:.2f} items/s, {stats.generated_tokens / seconds:.0f} generated tok/s, "
            f"{stats.batches} batches, padding efficiency {stats.padding_efficiency:.2f}, "
            f"{stats.generate_seconds / seconds:.0%} of the time in generate; model loaded in {summary.load_seconds:.1f} s)"
        )
    else:
        lines.append(f"this run (rank {summary.rank}): nothing pending, model not loaded")
    print("\n".join(lines), flush=True)
