"""The generate stage: the model answers every prepared question; each answer is verified and checkpointed.

Work is a globally ordered list of keys (a QA id, or `id#sample` with `num_samples > 1`), striped across the
ranks of an `accelerate launch` (`shard_for_rank` over the FULL list, then done keys skipped), so a restart with
any number of processes skips exactly what is on disk and redoes nothing. Each rank writes its own checkpoint
parts under OUTPUT_DIR/work/generate/. When nothing is pending the model is not even loaded.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.generate.engine import ChatRequest, GenerationEngine
from rsgen.layout import OutputLayout
from rsgen.store import CheckpointStore, shard_for_rank

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkItem:
    key: str
    id: str
    sample: int
    row: int  # row of the prepared pool (one image)
    family: str
    question: str
    answers: tuple[str, ...]
    options: tuple[str, ...]


@dataclass
class GenerateRunSummary:
    """What this rank did in this call (the table at the end reads the whole store instead)."""

    rank: int
    world_size: int
    assigned: int  # keys striped to this rank
    already_done: int
    generated: int = 0
    accepted: int = 0
    generated_tokens: int = 0
    seconds: float = 0.0  # generating and verifying
    load_seconds: float = 0.0  # loading the model
    model_loaded: bool = False
    engine_stats: Any = None
    reasons: Counter = field(default_factory=Counter)


def sample_key(qa_id: str, sample: int, num_samples: int) -> str:
    return qa_id if num_samples == 1 else f"{qa_id}#{sample}"


def _rows(prepared, columns: list[str], batch_size: int = 1024) -> Iterator[tuple[int, dict]]:
    """(row index, row) over some columns, read in Arrow batches (much faster than row by row)."""
    index = 0
    for batch in prepared.select_columns(columns).iter(batch_size=batch_size):
        for values in zip(*(batch[c] for c in columns)):
            yield index, dict(zip(columns, values))
            index += 1


def ordered_keys(prepared, num_samples: int) -> list[str]:
    """Every work key of the prepared pool (each QA pair, each sample), in the pool's stable order."""
    keys: list[str] = []
    seen: dict[str, int] = {}
    for row_index, row in _rows(prepared, ["qa"]):
        for qa in row["qa"]:
            qa_id = qa["id"]
            if qa_id in seen:
                raise RecipeError(
                    f"prepared pool has QA id {qa_id!r} twice (rows {seen[qa_id]} and {row_index}); "
                    "ids must be unique: rerun `rsgen prepare` into a fresh output_dir"
                )
            seen[qa_id] = row_index
            keys.extend(sample_key(qa_id, sample, num_samples) for sample in range(num_samples))
    return keys


def work_items(prepared, num_samples: int, wanted: set[str]) -> list[WorkItem]:
    """The items of the `wanted` keys, in the pool's order (only these are kept in memory: a rank needs the
    question and answers of its own pending items, not of the whole pool)."""
    items: list[WorkItem] = []
    for row_index, row in _rows(prepared, ["family", "qa"]):
        for qa in row["qa"]:
            for sample in range(num_samples):
                key = sample_key(qa["id"], sample, num_samples)
                if key in wanted:
                    items.append(
                        WorkItem(
                            key=key,
                            id=qa["id"],
                            sample=sample,
                            row=row_index,
                            family=row["family"],
                            question=qa["question"],
                            answers=tuple(qa["answers"]),
                            options=tuple(qa["options"] or ()),
                        )
                    )
    return items


def chat_messages(question: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


def _requests(prepared, pending: list[WorkItem]) -> Iterator[ChatRequest]:
    """Requests for the pending items, reading each needed image once, as encoded bytes (the engine's workers
    decode them). A generator: rows are read as the engine asks for them, not all up front."""
    from datasets import Image as ImageFeature

    by_row: dict[int, list[WorkItem]] = defaultdict(list)
    for item in pending:
        by_row[item.row].append(item)
    rows = sorted(by_row)
    images = prepared.select_columns(["image"]).cast_column("image", ImageFeature(decode=False)).select(rows)
    for row_index, row in zip(rows, images):
        image = row["image"]
        data = image.get("bytes")
        if data is None:
            raise RecipeError(
                f"prepared row {row_index} has no embedded image bytes (path {image.get('path')!r}); "
                "rerun `rsgen prepare`"
            )
        for item in by_row[row_index]:
            yield ChatRequest(item.key, chat_messages(item.question), [data])


def build_engine(recipe: RecipeConfig, model, processor) -> GenerationEngine:
    return GenerationEngine(
        model,
        processor,
        max_new_tokens=recipe.max_new_tokens,
        temperature=recipe.temperature,
        top_p=recipe.top_p,
        token_budget=recipe.token_budget,
        max_batch_size=recipe.max_batch_size,
        chat_template_kwargs=recipe.generation_chat_template_kwargs(),
        seed=recipe.seed,
    )


def _model_revision(recipe: RecipeConfig, model) -> str | None:
    """The commit the weights came from when loaded from the Hub cache, else the requested revision."""
    commit = getattr(getattr(model, "config", None), "_commit_hash", None)
    return commit or recipe.model_revision


def make_record(item: WorkItem, response, decision, verifier: str, model_id: str, revision: str | None) -> dict:
    return {
        "key": item.key,
        "id": item.id,
        "sample": item.sample,
        "family": item.family,
        "question": item.question,
        "response": response.text,
        "extracted": decision.extracted,
        "match": bool(decision.match),
        "reason": None if decision.match else decision.reason,
        "verifier": verifier,
        "prompt_tokens": response.prompt_tokens,
        "generated_tokens": response.generated_tokens,
        "hit_limit": response.hit_limit,
        "model": model_id,
        "revision": revision,
    }


def run_generate(recipe: RecipeConfig, state=None) -> GenerateRunSummary:
    """Generate and verify this rank's pending items; every rank of an `accelerate launch` calls this."""
    from rsgen.prepare import load_prepared

    if state is None:
        from rsgen.pipeline import distributed_state

        state = distributed_state()
    rank, world = state.process_index, state.num_processes
    layout = OutputLayout(recipe.output_dir)
    prepared = load_prepared(recipe.output_dir)
    keys = ordered_keys(prepared, recipe.num_samples)
    store = CheckpointStore(layout.generate_work)
    mine = shard_for_rank(keys, rank, world)
    done = store.done_keys()
    pending = work_items(prepared, recipe.num_samples, {k for k in mine if k not in done})
    summary = GenerateRunSummary(rank, world, assigned=len(mine), already_done=len(mine) - len(pending))
    for item in pending:  # a bad verifier mapping fails here, before any model work
        recipe.verifier_for(item.family)

    if pending:
        _generate_pending(recipe, state, prepared, pending, store, summary)

    state.wait_for_everyone()
    if state.is_main_process:
        print_summary_table(store, summary, total_items=len(keys))
    return summary


def _generate_pending(recipe, state, prepared, pending, store, summary) -> None:
    from tqdm.auto import tqdm

    from rsgen.generate.models import load_model_and_processor
    from rsgen.verify import verify_response

    start = time.perf_counter()
    model, processor = load_model_and_processor(
        recipe.resolved_model,
        revision=recipe.model_revision,
        torch_dtype=recipe.torch_dtype,
        attn_implementation=recipe.attn_implementation,
        trust_remote_code=recipe.trust_remote_code,
        device=state.device,
    )
    summary.model_loaded = True
    summary.load_seconds = time.perf_counter() - start
    revision = _model_revision(recipe, model)
    engine = build_engine(recipe, model, processor)
    summary.engine_stats = engine.stats
    by_key = {item.key: item for item in pending}

    bar = tqdm(
        total=len(pending),
        desc=f"generate (rank {state.process_index} of {state.num_processes})" if state.num_processes > 1 else "generate",
        unit="item",
        disable=not state.is_main_process,
        dynamic_ncols=True,
        mininterval=1.0,
    )
    start = time.perf_counter()
    writer = store.writer(state.process_index, recipe.checkpoint_every_items, recipe.checkpoint_every_seconds)
    with writer, bar:
        for request, response in engine.generate(_requests(prepared, pending)):
            item = by_key[request.key]
            verifier = recipe.verifier_for(item.family)
            decision = verify_response(
                verifier,
                response.text,
                list(item.answers),
                options=list(item.options) or None,
                numeric_tolerance=recipe.numeric_tolerance,
                timeout_seconds=recipe.math_timeout_seconds,
            )
            writer.add(make_record(item, response, decision, verifier, recipe.model_name_or_path, revision))
            summary.generated += 1
            summary.accepted += bool(decision.match)
            summary.generated_tokens += response.generated_tokens
            if not decision.match:
                summary.reasons[decision.reason] += 1
            bar.update(1)
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix(
                {"tok/s": f"{summary.generated_tokens / elapsed:.0f}", "accept": f"{summary.accepted / summary.generated:.1%}"},
                refresh=False,
            )
    summary.seconds = time.perf_counter() - start


def print_summary_table(store: CheckpointStore, summary: GenerateRunSummary, total_items: int) -> None:
    """Per family over everything on disk (all ranks, all runs), then what this call did on this rank."""
    per_family: dict[str, Counter] = defaultdict(Counter)
    for rec in store.iter_records():
        fam = per_family[rec["family"]]
        fam["items"] += 1
        fam["accepted"] += bool(rec["match"])
        fam["no_answer"] += rec["reason"] == "no_answer"
        fam["hit_limit"] += bool(rec["hit_limit"])
        fam["tokens"] += rec["generated_tokens"]
    total = sum(per_family.values(), Counter())
    header = f"{'family':<16} {'items':>8} {'accepted':>9} {'rate':>7} {'no answer':>10} {'hit limit':>10} {'gen tokens':>11}"
    lines = ["", header, "-" * len(header)]
    for name, fam in sorted(per_family.items()) + [("total", total)]:
        rate = fam["accepted"] / fam["items"] if fam["items"] else 0.0
        lines.append(
            f"{name:<16} {fam['items']:>8} {fam['accepted']:>9} {rate:>7.1%} {fam['no_answer']:>10} "
            f"{fam['hit_limit']:>10} {fam['tokens']:>11}"
        )
    missing = total_items - total["items"]
    lines.append(f"{'missing':<16} {missing:>8}" if missing else "every prepared item has a result")
    seconds = max(summary.seconds, 1e-9)
    if summary.generated:
        stats = summary.engine_stats
        lines.append(
            f"this run (rank {summary.rank}): {summary.generated} items in {summary.seconds:.1f} s "
            f"({summary.generated / seconds:.2f} items/s, {summary.generated_tokens / seconds:.0f} generated tok/s, "
            f"{stats.batches} batches, padding efficiency {stats.padding_efficiency:.2f}, "
            f"{stats.generate_seconds / seconds:.0%} of the time in generate; model loaded in {summary.load_seconds:.1f} s)"
        )
    else:
        lines.append(f"this run (rank {summary.rank}): nothing pending, model not loaded")
    print("\n".join(lines), flush=True)
