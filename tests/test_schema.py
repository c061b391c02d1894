"""The prepared pool read in place: the same rows as `datasets` reads from the shards, by batch or by position,
and nothing written to the HF datasets cache."""

import os

import datasets
import pytest
from test_shards import rgb_png, row

from rsgen.config import RecipeError
from rsgen.generate.stage import ordered_keys
from rsgen.layout import OutputLayout
from rsgen.schema import (
    PREPARED_FEATURES,
    PREPARED_SHARD_PREFIX,
    iter_questions,
    load_prepared,
    open_prepared,
    qa_ids,
)
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


def _pool_with_ids(tmp_path, ids_per_row):
    image = rgb_png(3)
    writer = ParquetShardWriter(OutputLayout(tmp_path).prepared, PREPARED_FEATURES, PREPARED_SHARD_PREFIX,
                                max_shard_bytes=4 * len(image) + 10, row_group_rows=2)
    for i, ids in enumerate(ids_per_row):
        r = row(i, image)
        r["qa"] = [{**r["qa"][0], "id": qa_id} for qa_id in ids]
        writer.add(r, len(image))
    writer.close()
    return open_prepared(tmp_path)


def test_qa_ids_are_the_ids_and_rows_of_iter_questions_and_a_repeated_id_names_its_rows(tmp_path):
    pool = _pool_with_ids(tmp_path / "a", [["a", "b"], [], ["c"], ["d", "e", "f"], ["g"], ["h", "i"], ["j"]])
    assert list(qa_ids(pool)) == [(q.id, q.row) for q in iter_questions(pool)] == [
        ("a", 0), ("b", 0), ("c", 2), ("d", 3), ("e", 3), ("f", 3), ("g", 4), ("h", 5), ("i", 5), ("j", 6)]
    assert ordered_keys(pool, 1) == list("abcdefghij")
    assert ordered_keys(pool, 2)[:4] == ["a#0", "a#1", "b#0", "b#1"]
    twice = _pool_with_ids(tmp_path / "b", [["a"], ["b", "c"], ["d"], ["c"], ["b"]])
    with pytest.raises(RecipeError, match=r"QA id 'c' twice \(rows 1 and 3\)"):
        ordered_keys(twice, 1)


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


def _mapped_kib(path) -> int:
    """KiB of `path` memory-mapped and resident in this process (what a mapped read adds to its RSS)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            if line[0] in "0123456789abcdef" and "-" in line.split(" ", 1)[0]:  # a mapping's header line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(line.split()[1])
    return total


def test_reading_the_pool_holds_about_one_row_group_not_the_shard(tmp_path):
    """A pass over the pool (batches, take) holds a row group at a time: neither pyarrow's buffers nor the shard's
    pages (a memory map's touched pages stay in RSS) grow with the shard. 1M QA pairs: one 399 MB shard, emit's peak
    RSS rose 550 -> 834 MB from 100k (issue #35)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rsgen.schema import PreparedPool

    path = tmp_path / "pool.parquet"
    group_rows, image_bytes, groups = 4, 32 * 1024, 200  # 200 row groups of 128 KiB: a 25 MiB shard
    images = [os.urandom(image_bytes) for _ in range(group_rows * groups)]  # incompressible, as images are
    pq.write_table(pa.table({"image": images, "n": list(range(len(images)))}), path, row_group_size=group_rows,
                   compression="none")
    pool = PreparedPool([path])
    peak = 0
    seen = []
    for table in pool.batches(batch_size=6):  # batches cut across row groups
        seen.extend(table.column("n").to_pylist())
        peak = max(peak, pa.total_allocated_bytes() + _mapped_kib(path) * 1024)
    taken = []
    for table in pool.take(list(range(0, len(images), 3))):
        taken.extend(table.column("n").to_pylist())
        peak = max(peak, pa.total_allocated_bytes() + _mapped_kib(path) * 1024)
    assert seen == list(range(len(images))) and taken == list(range(0, len(images), 3))
    assert peak < 8 * group_rows * image_bytes, f"{peak / 2**20:.1f} MiB held reading a 25 MiB shard"
