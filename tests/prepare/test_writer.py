import datasets
import pyarrow.parquet as pq

from rsgen.prepare.writer import ShardWriter, SpillBuckets
from rsgen.schema import PREPARED_FEATURES


def row(i: int, image: bytes) -> dict:
    return {
        "image": {"bytes": image, "path": None},
        "image_sha256": f"{i:064x}",
        "family": "F",
        "qa": [{"id": f"id{i}", "question": f"q{i}", "answers": ["a"], "options": [], "source_row_id": str(i)}],
        "clean_meta": {"source_dataset": "d", "source_config": "", "source_split": "train", "source_row_ids": [str(i)],
                       "family": "F", "policy_version": "v", "steps": []},
    }


def test_shards_roll_over_by_size_and_get_final_names(tmp_path, tools):
    image = tools.rgb_png(1)
    writer = ShardWriter(tmp_path, max_shard_bytes=3 * len(image) + 10, row_group_rows=2)
    for i in range(7):
        writer.add(row(i, image), len(image))
    names = writer.close()
    assert names == [f"data-0000{i}-of-00003.parquet" for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    ds = datasets.load_dataset("parquet", data_files=[str(tmp_path / n) for n in names], split="train",
                               features=PREPARED_FEATURES)
    assert [r["image_sha256"] for r in ds] == [f"{i:064x}" for i in range(7)]
    assert ds[0]["image"].size == (48, 32)


def test_empty_writer_leaves_one_empty_shard(tmp_path):
    names = ShardWriter(tmp_path, max_shard_bytes=100).close()
    assert names == ["data-00000-of-00001.parquet"]
    table = pq.read_table(tmp_path / names[0])
    assert table.num_rows == 0 and datasets.Features.from_arrow_schema(table.schema) == PREPARED_FEATURES


def test_spill_buckets_flush_under_the_memory_cap(tmp_path):
    buckets = SpillBuckets(tmp_path, max_buffer_bytes=200)
    for i in range(50):
        buckets.add(f"F/{i % 3:02x}", {"seq": i, "text": "ü" * 5})
    assert buckets._buffered <= 200 + 40  # flushed as it went
    assert buckets.keys() == ["F/00", "F/01", "F/02"]
    assert [r["seq"] for r in buckets.read("F/01")] == list(range(1, 50, 3))
    assert list(buckets.read("F/09")) == []
