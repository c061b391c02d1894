"""The checkpoint store: a stage's work records as per-rank JSON Lines parts under OUTPUT_DIR/work/<stage>/
(what the records hold: `rsgen.records`; the loop that fills a store: `rsgen.store.keyed_work`).

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
from pathlib import Path
from typing import Any

from rsgen.interrupt import deferred
from rsgen.shards import fsync_path

logger = logging.getLogger(__name__)

PART_SUFFIX = ".jsonl"
QUARANTINE = "quarantine"  # damaged parts are moved here (work/<stage>/quarantine/)
_KEY_PREFIX = '{"key": '
_CRC_TAG = "-crc"  # part names end in -crc<8 hex digits>.jsonl: the CRC-32 of the part's bytes
# How a failed request's record reads on disk (rsgen.records: GenerateRecord.failed, reason request_failed).
_FAILED_TEXT = ('"failed": ', '"reason": "request_failed"')
_FAILED_MARKERS = tuple(marker.encode() for marker in _FAILED_TEXT)
COMPACT_FAN_IN = 16  # a writer merges this many of its parts of one level into one part (see PartWriter)
MAX_COMPACT_BYTES = 64 * 1024**2  # ... unless together they are bigger than this


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
        for _where, rec in self.iter_located():
            yield rec

    def iter_located(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """`iter_records` with where each record was read ("PART line N"), for errors that name the file."""
        seen: set[str] = set()
        for part, lines in self._scan():
            name = str(part)
            for number, line in enumerate(lines, 1):
                rec = json.loads(line)
                if rec["key"] in seen:
                    continue
                seen.add(rec["key"])
                yield f"{name} line {number}", rec

    def part_lines(self) -> Iterator[tuple[Path, list[str]]]:
        """(part, its lines) of every undamaged part, each read once, in part order, a key written twice not
        removed: for a reader that keeps the first record of a key by itself (emit's on-disk index), without the
        set of every key that `iter_located` holds while it reads."""
        return self._scan()

    def records(self) -> dict[str, dict[str, Any]]:
        return {rec["key"]: rec for rec in self.iter_records()}

    def done_keys(self) -> set[str]:
        """Keys done, failed requests excepted (`forget_failed`). Keys only: a restart of a large run must not parse gigabytes of responses just to learn what is done.
        Parts write "key" first (see PartWriter.flush), so the key is decoded from the start of each line."""
        keys: set[str] = set()
        decode = json.JSONDecoder().raw_decode
        for _part, lines in self._scan():
            for line in lines:
                if _FAILED_TEXT[0] in line or _FAILED_TEXT[1] in line:  # a failed request: asked again
                    continue
                if line.startswith(_KEY_PREFIX):
                    keys.add(decode(line, len(_KEY_PREFIX))[0])
                else:  # a part written by something else: fall back to a full parse
                    keys.add(json.loads(line)["key"])
        return keys

    def _scan(self) -> Iterator[tuple[Path, list[str]]]:
        """(part, its lines) for every undamaged part, each read once. A part that vanishes before it is read was
        merged by its writer (PartWriter) or quarantined by another rank: the folder is then listed again and the
        parts not yet read are read, so a merge under way never hides its records."""
        read: set[str] = set()
        while True:
            vanished = False
            for part in self.parts():
                if part.name in read:
                    continue
                read.add(part.name)
                lines = self._read_part(part)
                if lines is None:
                    vanished = True
                else:
                    yield part, lines
            if not vanished:
                return

    def _read_part(self, part: Path) -> list[str] | None:
        """The lines of an undamaged part; None when it is gone (merged or quarantined meanwhile). A damaged part is
        moved to quarantine/ (its keys count as not done)."""
        try:
            data = part.read_bytes()
        except FileNotFoundError:
            return None
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

    def retain(self, keep: Callable[[dict[str, Any]], bool]) -> int:
        """Drop the records `keep` refuses (work that no longer applies, e.g. a verdict on a candidate that changed);
        returns how many were dropped. Main process only. Each part holding such a record is written again
        without it as a new part, then the old part is removed: a crash in between leaves both, and the next call
        drops the same records again."""
        return sum(self._rewrite_without(part, lines, keep) for part, lines in self._scan())

    def forget_failed(self) -> int:
        """Drop the records of requests that failed every retry (a `failed` message, or reason request_failed), so
        that this run asks them again; returns how many. Main process only. Only parts whose bytes hold the marker
        are parsed (a JSON string value cannot hold it: its quotes are escaped), so a large store costs one read."""
        dropped = 0
        for part in self.parts():
            try:
                data = part.read_bytes()
            except FileNotFoundError:
                continue
            if not any(marker in data for marker in _FAILED_MARKERS):
                continue
            dropped += self._rewrite_without(part, self._read_part(part) or [],
                                             lambda rec: not (rec.get("failed") or rec.get("reason") == "request_failed"))
        return dropped

    def _rewrite_without(self, part: Path, lines: list[str], keep: Callable[[dict[str, Any]], bool]) -> int:
        """Write `part` again without the records `keep` refuses, as a new part, then remove it: a crash in between
        leaves both, and the next call drops the same records again. Returns how many were dropped."""
        kept = [rec for rec in (json.loads(line) for line in lines) if keep(rec)]
        if len(kept) == len(lines):
            return 0
        if kept:
            with PartWriter(self.directory, 0, len(kept), float("inf")) as writer:
                writer.extend(kept)
        part.unlink()
        fsync_path(self.directory)
        return len(lines) - len(kept)

    def writer(self, rank: int, every_items: int = 256, every_seconds: float = 60.0) -> PartWriter:
        return PartWriter(self.directory, rank, every_items, every_seconds)


_encode = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(x, ensure_ascii=False) without a new encoder each call
_line_orders: dict[tuple[str, ...], tuple[str, ...]] = {}  # a record's field names -> the order they are written in


def record_line(rec: dict[str, Any]) -> str:
    """One record as a part's line: "key" first, the rest sorted (stable bytes, and done_keys() reads the key without
    a full parse). The order is worked out once per set of field names -- every record of a stage has one or two
    -- not sorted again per record: with the encoder made once, ~6 us a record instead of ~10 (bench_server's
    stage part)."""
    names = tuple(rec)
    order = _line_orders.get(names)
    if order is None:
        if len(_line_orders) > 1024:  # records of ever new shapes (none so far): no unbounded cache
            _line_orders.clear()
        order = _line_orders[names] = ("key", *sorted(name for name in names if name != "key"))
    return _encode({name: rec[name] for name in order}) + "\n"


class PartWriter:
    """Buffers records and flushes them as one new part every `every_items` records or `every_seconds`.

    The parts stay few at any size: whenever COMPACT_FAN_IN parts of one level (0: as flushed) written by this
    writer are on disk, they are merged into one part of the next level (streamed, never held whole), until a part
    reaches MAX_COMPACT_BYTES. A 1M-record stage flushed every 64 records thus leaves tens of parts, not ~15,600, and
    a restart reads them in seconds. The merged part is complete on disk (fsynced, renamed, CRC in its name) before
    its sources are removed: a kill in between leaves the same records twice, which readers take once."""

    def __init__(self, directory: Path, rank: int, every_items: int, every_seconds: float):
        self.directory = directory
        self.rank = rank
        self.every_items = max(1, every_items)
        self.every_seconds = every_seconds
        self.buffer: list[dict[str, Any]] = []
        self.last_flush = time.monotonic()
        self.levels: list[list[tuple[Path, int]]] = []  # this writer's parts still to merge, (path, bytes) per level
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
        with deferred():  # a SIGTERM now takes effect once the part (and any merge it completes) is on disk
            self._flush()

    def _flush(self) -> None:
        self.last_flush = time.monotonic()
        if not self.buffer:
            return
        data = "".join([record_line(rec) for rec in self.buffer]).encode("utf-8")
        path = self._publish([data])
        self.buffer = []
        self._written(path, len(data), 0)

    def _publish(self, chunks: Iterable[bytes]) -> Path:
        """Write `chunks` as one new part: temporary name, fsync, rename to its final name (CRC-32 included),
        fsync of the directory. Returns its path."""
        tmp = self.directory / f".{uuid.uuid4().hex}.tmp"
        crc = 0
        try:
            with open(tmp, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
                    crc = zlib.crc32(chunk, crc)
                fh.flush()
                os.fsync(fh.fileno())
            # Time first so parts sort in write order; uuid so two restarts within one ns never collide.
            name = f"{time.time_ns():020d}-rank{self.rank:05d}-{uuid.uuid4().hex[:8]}{_CRC_TAG}{crc:08x}{PART_SUFFIX}"
            os.replace(tmp, self.directory / name)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk leaves no half-written file behind
            raise
        fsync_path(self.directory)  # the rename itself survives a crash
        return self.directory / name

    def _written(self, path: Path, size: int, level: int) -> None:
        while len(self.levels) <= level:
            self.levels.append([])
        parts = self.levels[level]
        parts.append((path, size))
        if len(parts) < COMPACT_FAN_IN:
            return
        self.levels[level] = []
        if sum(n for _, n in parts) > MAX_COMPACT_BYTES:
            return  # big enough as they are
        merged_from: list[Path] = []
        merged = self._publish(_undamaged_bytes([p for p, _ in parts], merged_from))
        if not merged_from:  # every source was damaged or gone
            merged.unlink()
            return
        for source in merged_from:  # a damaged source stays, for the next reader to quarantine
            source.unlink(missing_ok=True)
        fsync_path(self.directory)
        self._written(merged, merged.stat().st_size, level + 1)

    def close(self) -> None:
        self.flush()

    def __enter__(self) -> PartWriter:
        return self

    def __exit__(self, *exc) -> None:
        # Flush even on error: records in the buffer are finished work.
        self.flush()


def _undamaged_bytes(parts: list[Path], merged_from: list[Path]) -> Iterator[bytes]:
    """The bytes of each part that is still there and undamaged (appended to `merged_from`). A damaged one is not
    merged -- a fresh CRC must never vouch for damaged bytes -- and stays where it is: the next reader moves it to
    quarantine/ and its keys are done again."""
    for part in parts:
        try:
            data = part.read_bytes()
        except FileNotFoundError:  # another rank quarantined it meanwhile
            continue
        if part_damage(part.name, data) is None:
            merged_from.append(part)
            yield data


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
