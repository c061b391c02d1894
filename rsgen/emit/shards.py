"""Hub-style sharded parquet: `data/{config}/train-00000-of-00004.parquet`, written row by row.

The shard count is fixed before the first row is written (the names carry it), from the planned bytes of the
config and the recipe's `shard_size_mb`; rows are spread over the shards contiguously and evenly, like
`datasets.Dataset.shard(contiguous=True)`. Files are written the way `datasets` writes parquet (its schema
metadata, so `load_dataset` restores the features; content-defined chunking and page index, so the Hub
deduplicates re-uploads), with no timestamps, so the same rows give byte-identical files.
"""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features
from datasets import config as datasets_config
from datasets.arrow_writer import get_parquet_column_options

ROW_GROUP_BYTES = 100 * 2**20  # `datasets`' own target for row groups (the Hub viewer reads one at a time)
ROW_GROUP_MAX_ROWS = 10_000
MB = 2**20  # bytes in the recipe's `shard_size_mb`
SPLIT = "train"


def shard_count(planned_bytes: int, num_rows: int, shard_size_mb: int) -> int:
    """Shards for a config: enough that none exceeds `shard_size_mb` (estimated), at least one, at most one per row.
    An empty config gets none: `datasets` cannot load a split without rows, so an empty config is not written."""
    if num_rows == 0:
        return 0
    return max(1, min(num_rows, math.ceil(planned_bytes / (max(1, shard_size_mb) * MB))))


def shard_name(index: int, count: int) -> str:
    return f"{SPLIT}-{index:05d}-of-{count:05d}.parquet"


def config_glob(config: str) -> str:
    """The `data_files` pattern of a config in the card's YAML header."""
    return f"data/{config}/{SPLIT}-*"


def written_sizes(paths: list[Path]) -> tuple[int, int]:
    """(uncompressed row bytes, file bytes) of written shards, from the files themselves."""
    num_bytes = file_bytes = 0
    for path in paths:
        meta = pq.ParquetFile(path).metadata
        num_bytes += sum(meta.row_group(i).total_byte_size for i in range(meta.num_row_groups))
        file_bytes += path.stat().st_size
    return num_bytes, file_bytes


def estimated_bytes(row: dict[str, Any]) -> int:
    """Approximate serialised size of a row's payload (pickle is a fast C walk of the nested values; images
    dominate real shards, so an estimate of the text is enough)."""
    return len(pickle.dumps(row, protocol=pickle.HIGHEST_PROTOCOL))


class ShardedParquetWriter:
    """Writes `num_rows` rows of one config into `num_shards` parquet files under `dataset_dir/data/{config}/`.

    Rows come in storage form (images as `{"bytes": ..., "path": None}`), so they go to Arrow without a per-row
    encoding pass. Row groups hold about ROW_GROUP_BYTES, from the config's planned bytes per row."""

    def __init__(self, dataset_dir: Path, config: str, features: Features, num_rows: int, num_shards: int,
                 planned_bytes: int = 0):
        if num_rows < 1 or num_shards < 1 or num_shards > num_rows:
            raise ValueError(f"{config}: cannot spread {num_rows} rows over {num_shards} shards")
        self.directory = Path(dataset_dir) / "data" / config
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config = config
        self.features = features
        self.schema = features.arrow_schema
        self.num_rows = num_rows
        self.num_shards = num_shards
        base, extra = divmod(num_rows, num_shards)
        self.shard_ends = []
        end = 0
        for i in range(num_shards):
            end += base + (1 if i < extra else 0)
            self.shard_ends.append(end)
        self.written = 0
        self.shard_index = 0
        self.buffer: list[dict[str, Any]] = []
        bytes_per_row = max(1, planned_bytes // max(1, num_rows))
        self.rows_per_group = max(1, min(ROW_GROUP_MAX_ROWS, ROW_GROUP_BYTES // bytes_per_row))
        self.writer: pq.ParquetWriter | None = None
        self.paths: list[Path] = []
        self._open_shard()

    def _open_shard(self) -> None:
        path = self.directory / shard_name(self.shard_index, self.num_shards)
        cdc = datasets_config.DEFAULT_CDC_OPTIONS
        self.writer = pq.ParquetWriter(
            path,
            self.schema,
            use_content_defined_chunking=cdc,
            write_page_index=True,
            **get_parquet_column_options(self.features, self.schema),
        )
        self.writer.add_key_value_metadata({"content_defined_chunking": json.dumps(cdc)})
        self.paths.append(path)

    def _flush_group(self) -> None:
        if self.buffer:
            self.writer.write_table(pa.Table.from_pylist(self.buffer, schema=self.schema))
        self.buffer = []

    def add(self, row: dict[str, Any]) -> None:
        if self.written >= self.num_rows:
            raise ValueError(f"{self.config}: more rows than the {self.num_rows} planned")
        self.buffer.append(row)
        self.written += 1
        if len(self.buffer) >= self.rows_per_group:
            self._flush_group()
        if self.written == self.shard_ends[self.shard_index] and self.shard_index + 1 < self.num_shards:
            self._flush_group()
            self.writer.close()
            self.shard_index += 1
            self._open_shard()

    def close(self) -> list[Path]:
        if self.written != self.num_rows:
            raise ValueError(f"{self.config}: {self.written} rows written, {self.num_rows} planned")
        self._flush_group()
        self.writer.close()
        return self.paths
