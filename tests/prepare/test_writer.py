import datasets
import pyarrow.parquet as pq
import pytest

from rsgen.prepare.writer import ExternalSorter, ShardWriter
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


@pytest.mark.parametrize("max_buffer_bytes", [150, 1 << 20])  # many runs on disk / all in memory
def test_external_sort_orders_by_key_then_arrival(tmp_path, max_buffer_bytes):
    sorter = ExternalSorter(tmp_path, max_buffer_bytes=max_buffer_bytes)
    keys = [f"F/{(i * 7) % 5:02x}" for i in range(60)]
    for i, key in enumerate(keys):
        sorter.add(key, {"i": i, "text": "ü\n" * (i % 3)})
    assert sorter._buffered < max_buffer_bytes
    if max_buffer_bytes == 150:
        assert len(list(tmp_path.iterdir())) > 10
    out = list(sorter)
    assert [k for k, _ in out] == sorted(keys)
    expected = sorted(range(60), key=lambda i: (keys[i], i))
    assert [r["i"] for _, r in out] == expected
    assert out[0][1]["text"] == ""
