"""Keyed work: the checkpoint store shared by generate and judge (per-rank JSON Lines parts under
OUTPUT_DIR/work/<stage>/), the process's distributed state, and the one loop both stages run (`run_keyed_work`).

Why parts and not one file: each rank appends only its own files, so no locking is needed across processes or
nodes; each part is written to a temporary name, fsynced, renamed and its directory fsynced, so a part on disk is
always complete. A killed run loses at most the records buffered since the last flush (SIGTERM/SIGINT flush them:
rsgen.interrupt), and a restart (with any number of processes) skips every key already present in any part.
A part damaged on disk later (a full disk, a bad copy between clusters) is detected by the CRC-32 in its name,
moved to `quarantine/` with a warning, and its keys are done again.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rsgen.interrupt import deferred, interruptible
from rsgen.shards import fsync_path

logger = logging.getLogger(__name__)

PART_SUFFIX = ".jsonl"
QUARANTINE = "quarantine"  # damaged parts are moved here (work/<stage>/quarantine/)
_KEY_PREFIX = '{"key": '
_CRC_TAG = "-crc"  # part names end in -crc<8 hex digits>.jsonl: the CRC-32 of the part's bytes


class CheckpointStore:
    """Records keyed by `key` (a QA id, or `id#sample`), stored as atomic parts in one directory."""

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    def parts(self) -> list[Path]:
        if not self.directory.is_dir():
            return []
        return sorted(p for p in self.directory.iterdir() if p.name.endswith(PART_SUFFIX))

    def iter_records(self) -> Iterator[dict[str, Any]]:
        """Every record once per key (the first written wins), in part order."""
        seen: set[str] = set()
        for part in self.parts():
            for line in self._read_part(part):
                rec = json.loads(line)
                if rec["key"] in seen:
                    continue
                seen.add(rec["key"])
                yield rec

    def records(self) -> dict[str, dict[str, Any]]:
        return {rec["key"]: rec for rec in self.iter_records()}

    def done_keys(self) -> set[str]:
        """Keys only: a restart of a large run must not parse gigabytes of responses just to learn what is done.
        Parts write "key" first (see PartWriter.flush), so the key is decoded from the start of each line."""
        keys: set[str] = set()
        decode = json.JSONDecoder().raw_decode
        for part in self.parts():
            for line in self._read_part(part):
                if line.startswith(_KEY_PREFIX):
                    keys.add(decode(line, len(_KEY_PREFIX))[0])
                else:  # a part written by something else: fall back to a full parse
                    keys.add(json.loads(line)["key"])
        return keys

    def _read_part(self, part: Path) -> list[str]:
        """The lines of an undamaged part. A damaged part is moved to quarantine/ (its keys count as not done)."""
        try:
            data = part.read_bytes()
        except FileNotFoundError:  # another rank quarantined it meanwhile
            return []
        problem = part_damage(part.name, data)
        if problem is None:
            return data.decode("utf-8").splitlines()
        quarantine = self.directory / QUARANTINE
        quarantine.mkdir(exist_ok=True)
        try:
            os.replace(part, quarantine / part.name)
        except FileNotFoundError:  # another rank moved it first (and warned)
            return []
        logger.warning("checkpoint part %s is damaged (%s): moved to %s; its keys will be done again",
                       part, problem, quarantine / part.name)
        return []

    def writer(self, rank: int, every_items: int = 256, every_seconds: float = 60.0) -> PartWriter:
        return PartWriter(self.directory, rank, every_items, every_seconds)


class PartWriter:
    """Buffers records and flushes them as one new part every `every_items` records or `every_seconds`."""

    def __init__(self, directory: Path, rank: int, every_items: int, every_seconds: float):
        self.directory = directory
        self.rank = rank
        self.every_items = max(1, every_items)
        self.every_seconds = every_seconds
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        directory.mkdir(parents=True, exist_ok=True)
        fsync_path(directory.parent)

    def add(self, record: dict[str, Any]) -> None:
        if "key" not in record:
            raise ValueError("checkpoint records need a 'key'")
        self.buffer.append(record)
        if len(self.buffer) >= self.every_items or time.monotonic() - self.last_flush >= self.every_seconds:
            self.flush()

    def extend(self, records: Iterable[dict[str, Any]]) -> None:
        for r in records:
            self.add(r)

    def flush(self) -> None:
        with deferred():  # a SIGTERM now takes effect once the part is complete
            self._flush()

    def _flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.buffer:
            return
        # "key" first, the rest sorted: stable bytes, and done_keys() reads the key without a full parse.
        data = "".join(
            json.dumps({"key": rec["key"], **{k: rec[k] for k in sorted(rec) if k != "key"}}, ensure_ascii=False) + "\n"
            for rec in self.buffer
        ).encode("utf-8")
        # Time first so parts sort in write order; uuid so two restarts within one ns never collide.
        name = f"{time.time_ns():020d}-rank{self.rank:05d}-{uuid.uuid4().hex[:8]}{_CRC_TAG}{zlib.crc32(data):08x}"
        tmp = self.directory / f".{name}.tmp"
        try:
            with open(tmp, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.directory / (name + PART_SUFFIX))
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
            raise
        fsync_path(self.directory)  # the rename itself survives a crash
        self.buffer = []

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc) -> None:
        # Flush even on error: records in the buffer are finished work.
        self.flush()


def part_damage(name: str, data: bytes) -> str | None:
    """Why a part's bytes cannot be trusted, or None. Parts named with a CRC-32 are checked against it; others
    (written by older versions) must parse line by line."""
    if not data.endswith(b"\n"):
        return "empty" if not data else "cut short: no final newline"
    stem = name.removesuffix(PART_SUFFIX)
    if _CRC_TAG in stem:
        expected = stem.rsplit(_CRC_TAG, 1)[1]
        return None if f"{zlib.crc32(data):08x}" == expected else "CRC-32 does not match its name"
    try:
        for n, line in enumerate(data.decode("utf-8").splitlines(), 1):
            rec = json.loads(line)
            if not isinstance(rec, dict) or "key" not in rec:
                return f"line {n} is not a record with a key"
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        return f"does not parse: {err}"
    return None


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

    # Without cpu=True, CPU processes under torchrun all believe they are rank 0 (measured; see the README's
    # multi-process section). A long timeout: ranks reach the barrier after generate/judge at different times,
    # and NCCL's default of 10 minutes would crash a days-long run at the end of a stage.
    return PartialState(cpu=not torch.cuda.is_available(), timeout=datetime.timedelta(hours=24))


class KeyedStage(Protocol):
    """What a stage gives the keyed-work loop: its keys, requests for the pending ones, a record per result."""

    name: str  # "generate", "judge" (progress bar and logs)
    unit: str  # what one key is, for the progress bar ("item", "pair")

    def keys(self) -> list[str]:
        """Every key of the stage, in one global order that every rank computes identically."""

    def requests(self, pending: list[str]) -> Iterable[Any]:
        """Engine requests for the pending keys (`request.key` is the work key; `request.meta` the stage's item)."""

    def record(self, request: Any, result: Any) -> dict[str, Any]:
        """The checkpoint record of one finished request (must carry `"key": request.key`)."""

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
    seconds: float = 0.0  # generating (model loading excluded)
    load_seconds: float = 0.0
    engine: Any = None  # the engine, when work was pending (its `stats` and `revision`)


def run_keyed_work(stage: KeyedStage, store: CheckpointStore, state, make_engine: Callable[[], Any],
                   every_items: int = 256, every_seconds: float = 60.0) -> KeyedWorkSummary:
    """The loop generate and judge share: stripe the stage's keys over the ranks, skip keys already in the store,
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
    done = store.done_keys()
    pending = [k for k in mine if k not in done]
    if state.is_main_process:  # what a rerun found, over every rank's parts
        left = sum(k not in done for k in keys)
        logger.info(f"{stage.name}: {len(keys) - left:,} of {len(keys):,} {stage.unit}s already done, {left:,} to go")
    summary = KeyedWorkSummary(state.process_index, state.num_processes, total=len(keys), assigned=len(mine),
                               already_done=len(mine) - len(pending))
    if pending:
        start = time.perf_counter()
        engine = summary.engine = make_engine()
        summary.load_seconds = time.perf_counter() - start
        ranks = f" (rank {state.process_index} of {state.num_processes})" if state.num_processes > 1 else ""
        bar = tqdm(total=len(pending), desc=stage.name + ranks, unit=stage.unit, disable=not state.is_main_process,
                   dynamic_ncols=True, mininterval=1.0)
        start = time.perf_counter()
        # SIGTERM/SIGINT end the loop with Interrupted; leaving the `with` flushes every finished record.
        with interruptible(), store.writer(state.process_index, every_items, every_seconds) as writer, bar:
            for request, result in engine.generate(stage.requests(pending)):
                record = stage.record(request, result)
                writer.add(record)
                summary.done_now += 1
                bar.update(1)
                postfix = stage.progress(record)
                if postfix:
                    bar.set_postfix(postfix, refresh=False)
        summary.seconds = time.perf_counter() - start
    state.wait_for_everyone()
    return summary
