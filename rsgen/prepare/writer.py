"""Bounded-memory grouping and the parquet shards of the prepared pool.

Grouping QA pairs by image without holding the pool in memory is an external sort: every QA pair (text and the
location of its image in the pack file, never the image itself) is keyed by (family, image sha256) and sorted
in runs of bounded size; merging the runs yields each image's QA pairs together, in (family, sha256) order, the
same order on every run. A handful of run files, not one file per bucket or image: creating many small files
is slow on ordinary disks.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rsgen.schema import PREPARED_FEATURES

SHARD_PATTERN = "data-{index:05d}-of-{total:05d}.parquet"
SHARD_GLOB = "data-*-of-*.parquet"
KEY_END = "\x1f"  # separates a sort key from the record; never inside a key (keys are family names and hex)


class ExternalSorter:
    """Sort records larger than memory: buffer up to `max_buffer_bytes`, write each full buffer as a sorted run
    file, then merge the runs in one streaming pass. Records come back in key order (ties in insertion order)."""

    def __init__(self, directory: str | os.PathLike, max_buffer_bytes: int = 8 << 20):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_buffer_bytes = max_buffer_bytes
        self._lines: list[str] = []
        self._buffered = 0
        self._runs: list[Path] = []
        self._count = 0

    def add(self, key: str, record: dict) -> None:
        # The key leads the line, so sorting lines sorts records; a counter keeps equal keys in arrival order.
        line = f"{key}{KEY_END}{self._count:012d}{KEY_END}{json.dumps(record, ensure_ascii=False, separators=(',', ':'))}\n"
        self._count += 1
        self._lines.append(line)
        self._buffered += len(line)
        if self._buffered >= self.max_buffer_bytes:
            self._write_run()

    def _write_run(self) -> None:
        if not self._lines:
            return
        self._lines.sort()
        path = self.directory / f"run-{len(self._runs):05d}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(self._lines)
        self._runs.append(path)
        self._lines = []
        self._buffered = 0

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        """(key, record) in key order."""
        if not self._runs:  # everything fit in memory: no need to touch the disk
            self._lines.sort()
            lines: Iterator[str] = iter(self._lines)
            files = []
        else:
            self._write_run()
            files = [open(p, encoding="utf-8") for p in self._runs]
            lines = heapq.merge(*files)
        try:
            for line in lines:
                key, _, rest = line.partition(KEY_END)
                yield key, json.loads(rest.partition(KEY_END)[2])
        finally:
            for f in files:
                f.close()


class ShardWriter:
    """Streams rows into parquet shards of about `max_shard_bytes`, in row groups of bounded size.

    The bytes written depend only on the rows and their order, so the same rows give the same files.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        max_shard_bytes: int,
        row_group_rows: int = 64,
        row_group_bytes: int = 64 << 20,
    ):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_shard_bytes = max(1, max_shard_bytes)
        self.row_group_rows = row_group_rows
        self.row_group_bytes = row_group_bytes
        self.schema = PREPARED_FEATURES.arrow_schema  # carries the features, so `datasets` reads `image` as Image
        self._writer: pq.ParquetWriter | None = None
        self._parts: list[Path] = []
        self._shard_bytes = 0
        self._group: list[dict] = []
        self._group_bytes = 0
        self.rows = 0

    def add(self, row: dict, nbytes: int) -> None:
        if self._writer is not None and self._shard_bytes + self._group_bytes + nbytes > self.max_shard_bytes:
            self._flush_group()
            self._close_shard()
        if self._writer is None:
            self._open_shard()
        self._group.append(row)
        self._group_bytes += nbytes
        self.rows += 1
        if len(self._group) >= self.row_group_rows or self._group_bytes >= self.row_group_bytes:
            self._flush_group()

    def _open_shard(self) -> None:
        path = self.directory / f".part-{len(self._parts):05d}.parquet"
        self._writer = pq.ParquetWriter(path, self.schema)
        self._parts.append(path)
        self._shard_bytes = 0

    def _flush_group(self) -> None:
        if not self._group:
            return
        self._writer.write_table(pa.Table.from_pylist(self._group, schema=self.schema))
        self._shard_bytes += self._group_bytes
        self._group = []
        self._group_bytes = 0

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def close(self) -> list[str]:
        """Finish and give the shards their final names `data-0000i-of-0000N.parquet`; returns the names."""
        if self._writer is None and not self._parts:
            self._open_shard()  # an empty pool is still a readable (empty) dataset
        self._flush_group()
        self._close_shard()
        total = len(self._parts)
        names = []
        for index, part in enumerate(self._parts):
            name = SHARD_PATTERN.format(index=index, total=total)
            os.replace(part, self.directory / name)
            names.append(name)
        return names
