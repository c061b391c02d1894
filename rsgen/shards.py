"""Parquet shards, written the one way prepare and emit both use, and finished folders swapped into place.

`ParquetShardWriter` streams rows into shards of about `max_shard_bytes`, each named `{prefix}-0000i-of-0000N
.parquet` once the count is known (rows go to hidden `.part-*` files first, renamed at `close`). Files are written
the way `datasets` writes parquet (its schema metadata, so `load_dataset` restores the features; content-defined
chunking and a page index, so the Hub deduplicates re-uploads) and carry no timestamps: the same rows in the same
order give byte-identical files.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features, Image

from rsgen.interrupt import deferred

# `datasets`' content-defined chunking options (its config.DEFAULT_CDC_OPTIONS, copied: a private constant).
CDC_OPTIONS = {"min_chunk_size": 256 * 1024, "max_chunk_size": 1024 * 1024, "norm_level": 0}
ROW_GROUP_BYTES = 100 * 2**20  # `datasets`' own target for row groups (the Hub viewer reads one at a time)
ROW_GROUP_MAX_ROWS = 10_000
# Rows waiting for their row group are held as Arrow tables of this many rows, not as Python dicts: a row group of
# 10,000 rows took ~25-40 MB as dicts, ~10-17 MB in Arrow (the emit bench's configs), per open writer.
ARROW_CHUNK_ROWS = 256


def shard_name(prefix: str, index: int, count: int) -> str:
    return f"{prefix}-{index:05d}-of-{count:05d}.parquet"


def shard_glob(prefix: str) -> str:
    return f"{prefix}-*-of-*.parquet"


def estimated_bytes(row: dict[str, Any]) -> int:
    """Approximate serialised size of a row (pickle is a fast C walk of the nested values; images dominate real
    shards, so an estimate of the text is enough)."""
    return len(pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL))


def _holds_images(feature: Any) -> bool:
    if isinstance(feature, Image):
        return True
    if isinstance(feature, dict):
        return any(_holds_images(f) for f in feature.values())
    inner = getattr(feature, "feature", None)  # List / Sequence / LargeList
    return inner is not None and _holds_images(inner)


def column_options(features: Features, schema: pa.Schema) -> dict[str, Any]:
    """Per-leaf-column parquet options as `datasets` 5 writes them: the leaves of a column holding images (bytes
    already compressed) stored PLAIN without compression or dictionary; every other leaf snappy with a
    dictionary. Parquet matches options against leaf paths (`qa.list.element.question`), not top-level names."""

    def leaves(path: str, pa_type: pa.DataType) -> list[str]:
        if isinstance(pa_type, pa.ExtensionType):
            pa_type = pa_type.storage_type
        if pa.types.is_struct(pa_type):
            return [leaf for f in pa_type for leaf in leaves(f"{path}.{f.name}", f.type)]
        if pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type) or pa.types.is_fixed_size_list(pa_type):
            return leaves(f"{path}.list.element", pa_type.value_type)
        return [path]

    compression, use_dictionary, column_encoding = {}, [], {}
    for field in schema:
        images = _holds_images(features[field.name])
        for path in leaves(field.name, field.type):
            if images:
                compression[path], column_encoding[path] = "none", "PLAIN"
            else:
                compression[path] = "snappy"
                use_dictionary.append(path)
    return {"compression": compression, "use_dictionary": use_dictionary, "column_encoding": column_encoding}


class ParquetShardWriter:
    """Rows (in storage form: images as `{"bytes": ..., "path": None}`) -> parquet shards under `directory`."""

    def __init__(self, directory: str | os.PathLike, features: Features, prefix: str, max_shard_bytes: int,
                 row_group_bytes: int = ROW_GROUP_BYTES, row_group_rows: int = ROW_GROUP_MAX_ROWS):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.features = features
        self.schema = features.arrow_schema
        self.prefix = prefix
        self.max_shard_bytes = max(1, max_shard_bytes)
        self.row_group_bytes = row_group_bytes
        self.row_group_rows = row_group_rows
        self.rows = 0
        self._writer: pq.ParquetWriter | None = None
        self._parts: list[Path] = []
        self._shard_bytes = 0
        self._group: list[dict[str, Any]] = []  # rows not yet in `_chunks`
        self._chunks: list[pa.Table] = []  # the row group's earlier rows
        self._group_rows = 0
        self._group_bytes = 0

    def add(self, row: dict[str, Any], nbytes: int | None = None) -> None:
        try:
            self._add(row, nbytes)
        except BaseException:  # a full disk, SIGTERM: leave no half-written shard (and free its space)
            self._abort()
            raise

    def _add(self, row: dict[str, Any], nbytes: int | None) -> None:
        nbytes = estimated_bytes(row) if nbytes is None else nbytes
        if self._writer is not None and self._shard_bytes + self._group_bytes + nbytes > self.max_shard_bytes:
            self._flush_group()
            self._close_shard()
        if self._writer is None:
            self._open_shard()
        self._group.append(row)
        self._group_rows += 1
        self._group_bytes += nbytes
        self.rows += 1
        if self._group_rows >= self.row_group_rows or self._group_bytes >= self.row_group_bytes:
            self._flush_group()
        elif len(self._group) >= ARROW_CHUNK_ROWS:
            self._chunks.append(pa.Table.from_pylist(self._group, schema=self.schema))
            self._group = []

    def _open_shard(self) -> None:
        path = self.directory / f".part-{self.prefix}-{len(self._parts):05d}.parquet"
        cdc = CDC_OPTIONS
        self._writer = pq.ParquetWriter(path, self.schema, use_content_defined_chunking=cdc, write_page_index=True,
                                        **column_options(self.features, self.schema))
        self._writer.add_key_value_metadata({"content_defined_chunking": json.dumps(cdc)})
        self._parts.append(path)
        self._shard_bytes = 0

    def _flush_group(self) -> None:
        if self._group_rows:
            if self._group:
                self._chunks.append(pa.Table.from_pylist(self._group, schema=self.schema))
            # one chunk per column, as one from_pylist of the whole group gave: the same pages, the same bytes
            self._writer.write_table(pa.concat_tables(self._chunks).combine_chunks())
            self._shard_bytes += self._group_bytes
        self._group = []
        self._chunks = []
        self._group_rows = 0
        self._group_bytes = 0

    def _close_shard(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _abort(self) -> None:
        """Remove every shard written so far."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except OSError:
                pass
        for index, part in enumerate(self._parts):
            part.unlink(missing_ok=True)
            (self.directory / shard_name(self.prefix, index, len(self._parts))).unlink(missing_ok=True)  # renamed
        self._parts = []

    def close(self) -> list[Path]:
        """Finish the last shard and give every shard its final name; returns the paths in order. With no rows,
        one empty shard is written (an empty table is still a readable dataset)."""
        try:
            return self._close()
        except BaseException:
            self._abort()
            raise

    def _close(self) -> list[Path]:
        if not self._parts:
            self._open_shard()
        self._flush_group()
        self._close_shard()
        paths = []
        for index, part in enumerate(self._parts):
            fsync_path(part)  # durable before the folder is swapped into place
            path = self.directory / shard_name(self.prefix, index, len(self._parts))
            os.replace(part, path)
            paths.append(path)
        fsync_path(self.directory)
        return paths


def written_sizes(paths: list[Path]) -> tuple[int, int]:
    """(uncompressed row bytes, file bytes) of written shards, from the files themselves."""
    num_bytes = file_bytes = 0
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        num_bytes += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        file_bytes += path.stat().st_size
    return num_bytes, file_bytes


def swap_dir_into_place(finished: Path, final: Path) -> None:
    """Replace `final` by the finished folder `finished`, so that `final` is always either the old complete
    folder or the new complete one (a crash in between leaves `final.old`, which the next swap removes)."""
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    with deferred():  # SIGTERM: not between the two renames
        if final.exists():
            final.rename(old)
        finished.rename(final)
        fsync_path(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def fsync_path(path: Path) -> None:
    """Flush a file's data, or a folder's entries (a rename, a new file), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
