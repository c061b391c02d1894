"""The keyed-work loop every model stage runs (`run_keyed_work`): a stage's keys striped over the ranks of a launch,
keys already in its checkpoint store skipped, the engine built only when something is pending, one record written
per result, then a barrier. A restart with any number of processes redoes nothing finished. Also the process's
distributed state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from rsgen.interrupt import deferred, interruptible
from rsgen.store.checkpoint import CheckpointStore
from rsgen.store.progress import keyed_work_progress

logger = logging.getLogger(__name__)


def shard_for_rank(keys: list[str], rank: int, world_size: int) -> list[str]:
    """Stripe the FULL, globally ordered key list across ranks (then each rank skips its done keys): every key
    belongs to exactly one rank whatever the timing of the ranks, so no barrier is needed between reading the
    store and working. Striping only the pending keys would race with ranks that already wrote parts."""
    return keys[rank::world_size]


def distributed_state():
    """The process's `accelerate.PartialState` (one process, or one rank of an `accelerate launch`)."""
    import datetime

    import torch
    from accelerate import PartialState

    # Without cpu=True, CPU processes under torchrun all believe they are rank 0 (measured; see docs/scale.md).
    # A long timeout: ranks reach the barrier after generate/judge at different times,
    # and NCCL's default of 10 minutes would crash a days-long run at the end of a stage.
    return PartialState(cpu=not torch.cuda.is_available(), timeout=datetime.timedelta(hours=24))


class KeyedStage(Protocol):
    """What a stage gives the keyed-work loop: its keys, requests for the pending ones, a record per result."""

    name: str  # the stage's name (progress bar and logs)
    unit: str  # what one key is, for the progress bar ("item", "pair")

    def keys(self) -> list[str]:
        """Every key of the stage, in one global order that every rank computes identically."""

    def requests(self, pending: list[str]) -> Iterable[Any]:
        """Engine requests for the pending keys (`request.key` is the work key; `request.meta` the stage's item)."""

    def record(self, request: Any, result: Any) -> dict[str, Any]:
        """The checkpoint record of one finished request, as stored (a `rsgen.records` record's `to_json()`; it
        carries `"key": request.key`)."""

    def progress(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Progress-bar postfix after `record` was written, or None."""

    # Optional: `group(key) -> str`. Keys of one group go to the same rank (explore: the samples of one question,
    # which share one encoded prompt). Without it every key is its own group.


@dataclass
class KeyedWorkSummary:
    """What one rank did in one call of `run_keyed_work` (tables over the whole store read the store instead)."""

    rank: int
    world_size: int
    total: int  # keys of the stage, all ranks
    assigned: int  # keys striped to this rank
    already_done: int
    done_now: int = 0
    found: int = 0  # keys with a record in the store when the call began, every rank's
    seconds: float = 0.0  # generating (model loading excluded)
    load_seconds: float = 0.0
    engine: Any = None  # the engine, when work was pending (its `stats` and `revision`)


SERVER_COUNTS = "server-counts-rank{rank:05d}.json"  # beside the parts of a stage's store, one file per rank


def add_server_counts(directory, rank: int, stats) -> None:
    """Add what a server engine counted in this run (retries by cause, failed, refused, content null) to the
    rank's running totals beside the stage's parts: emit sums them per stage into stats.json and the card.
    Nothing for engines that count no requests to a server."""
    if not isinstance(getattr(stats, "retries_by_cause", None), dict) or not (
            stats.retries or stats.failed or stats.refused or stats.no_content or stats.in_flight_peak):
        return
    import json
    import os
    from pathlib import Path

    path = Path(directory) / SERVER_COUNTS.format(rank=rank)
    counts = json.loads(path.read_text()) if path.is_file() else {}
    counts["requests"] = counts.get("requests", 0) + stats.requests
    for name in ("failed", "refused", "no_content"):
        counts[name] = counts.get(name, 0) + getattr(stats, name)
    retries = counts.setdefault("retries", {})
    for cause, n in stats.retries_by_cause.items():
        retries[cause] = retries.get(cause, 0) + n
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(counts, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_server_counts(directory) -> dict | None:
    """The counts of `add_server_counts` summed over the ranks (None: no server engine worked here)."""
    import json
    from pathlib import Path

    files = sorted(Path(directory).glob("**/" + SERVER_COUNTS.replace("{rank:05d}", "*")))
    if not files:
        return None
    total: dict = {"requests": 0, "failed": 0, "refused": 0, "no_content": 0, "retries": {}}
    for path in files:
        counts = json.loads(path.read_text())
        for name in ("requests", "failed", "refused", "no_content"):
            total[name] += counts.get(name, 0)
        for cause, n in counts.get("retries", {}).items():
            total["retries"][cause] = total["retries"].get(cause, 0) + n
    total["retries"] = dict(sorted(total["retries"].items()))
    return total


def run_keyed_work(stage: KeyedStage, store: CheckpointStore, state, make_engine: Callable[[], Any],
                   every_items: int = 256, every_seconds: float = 60.0) -> KeyedWorkSummary:
    """The loop the model stages share: stripe the stage's keys over the ranks, skip keys already in the store,
    build the engine only when something is pending, write one record per result, then wait for every rank.
    Called by every rank of a launch."""
    from tqdm.auto import tqdm

    keys = stage.keys()
    group = getattr(stage, "group", None)
    if group is None:
        mine = shard_for_rank(keys, state.process_index, state.num_processes)
    else:
        groups = list(dict.fromkeys(group(k) for k in keys))  # first-seen order: the same on every rank
        my_groups = set(shard_for_rank(groups, state.process_index, state.num_processes))
        mine = [k for k in keys if group(k) in my_groups]
    done = store.done_keys()  # a record of a request that failed every retry is not done: it is asked again
    if state.is_main_process:  # and its record goes, so that the new one is the one read (first written wins)
        forgotten = store.forget_failed()
        if forgotten:
            logger.info(f"{stage.name}: {forgotten:,} {stage.unit}(s) whose request failed last time are asked again")
    pending = [k for k in mine if k not in done]
    if state.is_main_process:  # what a rerun found, over every rank's parts
        left = sum(k not in done for k in keys)
        logger.info(f"{stage.name}: {len(keys) - left:,} of {len(keys):,} {stage.unit}s already done, {left:,} to go")
    summary = KeyedWorkSummary(state.process_index, state.num_processes, total=len(keys), assigned=len(mine),
                               already_done=len(mine) - len(pending), found=len(done))
    progress = keyed_work_progress(stage, summary)  # this rank's counts, for OUTPUT_DIR/progress.json
    if pending:
        start = time.perf_counter()
        engine = summary.engine = make_engine()
        summary.load_seconds = time.perf_counter() - start
        ranks = f" (rank {state.process_index} of {state.num_processes})" if state.num_processes > 1 else ""
        bar = tqdm(total=len(pending), desc=stage.name + ranks, unit=stage.unit, disable=not state.is_main_process,
                   dynamic_ncols=True, mininterval=1.0)
        start = time.perf_counter()
        # SIGTERM/SIGINT end the loop with Interrupted; leaving the `with` flushes every finished record.
        try:
            with interruptible(), store.writer(state.process_index, every_items, every_seconds) as writer, bar:
                for request, result in engine.generate(stage.requests(pending)):
                    record = stage.record(request, result)
                    with deferred():  # a record stored is a record counted, also when SIGTERM comes between
                        writer.add(record)
                        progress.add(record, getattr(engine, "stats", None), unsaved=len(writer.buffer))
                    summary.done_now += 1
                    bar.update(1)
                    postfix = stage.progress(record)
                    if postfix:
                        bar.set_postfix(postfix, refresh=False)
        finally:
            add_server_counts(store.directory, state.process_index, getattr(engine, "stats", None))
        summary.seconds = time.perf_counter() - start
    progress.close()
    state.wait_for_everyone()
    return summary
