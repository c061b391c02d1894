"""The prepared pool read in place: the same rows as `datasets` reads from the shards, by batch or by position,
and nothing written to the HF datasets cache."""

import os

import datasets
import pytest
from test_shards import rgb_png, row

from rsgen.layout import OutputLayout
from rsgen.schema import PREPARED_FEATURES, PREPARED_SHARD_PREFIX, load_prepared, open_prepared
from rsgen.shards import ParquetShardWriter

N = 11


@pytest.fixture
def pool_dir(tmp_path):
    """A prepared pool of N rows over 3 shards with row groups of 2 rows (row groups and shards both cut)."""
    image = rgb_png(3)
    writer = ParquetShardWriter(OutputLayout(tmp_path).prepared, PREPARED_FEATURES, PREPARED_SHARD_PREFIX,
                                max_shard_bytes=4 * len(image) + 10, row_group_rows=2)
    for i in range(N):
        r = row(i, image)
        r["family"] = "AB"[i % 2]
        writer.add(r, len(image))
    assert len(writer.close()) == 3
    return tmp_path


def reference_rows(output_dir):
    """What the `datasets` parquet loader reads (the outside truth), images as stored."""
    files = [str(p) for p in sorted(OutputLayout(output_dir).prepared.glob("*.parquet"))]
    ds = datasets.load_dataset("parquet", data_files=files, split="train", features=PREPARED_FEATURES)
    return list(ds.cast_column("image", datasets.Image(decode=False)))


def test_batches_take_and_column_read_what_datasets_reads(pool_dir):
    expected = reference_rows(pool_dir)
    pool = open_prepared(pool_dir)
    assert len(pool) == N
    assert [r for t in pool.batches(batch_size=3) for r in t.to_pylist()] == expected
    assert [r for t in pool.batches(["family", "qa"]) for r in t.to_pylist()] == [
        {"family": r["family"], "qa": r["qa"]} for r in expected]
    assert pool.column("family") == [r["family"] for r in expected]
    wanted = [0, 1, 4, 5, 9, 10]
    assert [r for t in pool.take(wanted) for r in t.to_pylist()] == [expected[i] for i in wanted]
    assert [r for t in pool.take([7], ["image"]) for r in t.to_pylist()] == [{"image": expected[7]["image"]}]
    assert list(pool.take([])) == []


@pytest.mark.parametrize("rows", [[3, 2], [1, 1], [N], [-1]])
def test_take_refuses_unordered_or_outside_positions(pool_dir, rows):
    with pytest.raises(ValueError, match="ascending row positions"):
        list(open_prepared(pool_dir).take(rows))


def test_reading_the_pool_writes_nothing_to_the_datasets_cache(pool_dir, tmp_path, monkeypatch):
    cache = tmp_path / "hf-datasets-cache"
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    pool = open_prepared(pool_dir)
    list(pool.batches())
    list(pool.take([3, 8]))
    ds = load_prepared(pool_dir)
    assert len(ds) == N and ds[0]["image"].size == (48, 32) and ds.features == PREPARED_FEATURES
    assert not cache.exists() or not any(os.scandir(cache))


def test_no_pool_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="rsgen prepare"):
        open_prepared(tmp_path)
