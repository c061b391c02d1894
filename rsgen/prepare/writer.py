"""Bounded-memory grouping and the parquet shards of the prepared pool.

Grouping QA pairs by image without holding the pool in memory is an external hash partition: every QA pair is
appended (as one JSON line, text only) to a bucket file chosen by its family and the first two hex digits of its
image's sha256, while the image bytes sit once in a content-addressed folder. A bucket then holds about 1/256 of
a family's QA text and is grouped in memory; rows come out sorted by (family, sha256), the same order on every run.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rsgen.schema import PREPARED_FEATURES

SHARD_PATTERN = "data-{index:05d}-of-{total:05d}.parquet"
SHARD_GLOB = "data-*-of-*.parquet"


class SpillBuckets:
    """Append-only text buckets on disk, buffered in memory up to `max_buffer_bytes` in all."""

    def __init__(self, directory: str | os.PathLike, max_buffer_bytes: int = 16 << 20):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_buffer_bytes = max_buffer_bytes
        self._buffers: dict[str, list[str]] = {}
        self._buffered = 0
        self._keys: set[str] = set()

    def _path(self, key: str) -> Path:
        return self.directory / f"{key}.jsonl"

    def add(self, key: str, record: dict) -> None:
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
        self._buffers.setdefault(key, []).append(line)
        self._keys.add(key)
        self._buffered += len(line)
        if self._buffered > self.max_buffer_bytes:
            self.flush()

    def flush(self) -> None:
        for key in sorted(self._buffers):
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a", encoding="utf-8") as f:
                f.writelines(self._buffers[key])
        self._buffers.clear()
        self._buffered = 0

    def keys(self) -> list[str]:
        return sorted(self._keys)

    def read(self, key: str) -> Iterator[dict]:
        self.flush()
        path = self._path(key)
        if not path.exists():
            return
        with open(path, encoding="utf-8") as f:
            for line in f:
                yield json.loads(line)


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
