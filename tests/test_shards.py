"""The one parquet shard writer (prepare and emit) and the folder swap."""

import errno
import io

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rsgen.schema import PREPARED_FEATURES
from rsgen.shards import ParquetShardWriter, swap_dir_into_place


def rgb_png(seed: int, size=(48, 32)) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG")
    return buf.getvalue()


def row(i: int, image: bytes) -> dict:
    return {
        "image": {"bytes": image, "path": None},
        "image_sha256": f"{i:064x}",
        "family": "F",
        "qa": [{"id": f"id{i}", "question": f"q{i}", "answers": ["a"], "options": [], "source_row_id": str(i)}],
        "clean_meta": {"source_dataset": "d", "source_config": "", "source_split": "train", "source_row_ids": [str(i)],
                       "family": "F", "policy_version": "v", "steps": []},
    }


def test_shards_roll_over_by_size_and_get_final_names(tmp_path):
    image = rgb_png(1)
    writer = ParquetShardWriter(tmp_path, PREPARED_FEATURES, "data", max_shard_bytes=3 * len(image) + 10, row_group_rows=2)
    for i in range(7):
        writer.add(row(i, image), len(image))
    names = [p.name for p in writer.close()]
    assert names == [f"data-0000{i}-of-00003.parquet" for i in range(3)]
    assert sorted(p.name for p in tmp_path.iterdir()) == names
    ds = datasets.load_dataset("parquet", data_files=[str(tmp_path / n) for n in names], split="train",
                               features=PREPARED_FEATURES)
    assert [r["image_sha256"] for r in ds] == [f"{i:064x}" for i in range(7)]
    assert ds[0]["image"].size == (48, 32)


def test_empty_writer_leaves_one_empty_shard(tmp_path):
    names = [p.name for p in ParquetShardWriter(tmp_path, PREPARED_FEATURES, "data", max_shard_bytes=100).close()]
    assert names == ["data-00000-of-00001.parquet"]
    table = pq.read_table(tmp_path / names[0])
    assert table.num_rows == 0 and datasets.Features.from_arrow_schema(table.schema) == PREPARED_FEATURES


def test_same_rows_give_byte_identical_shards(tmp_path):
    image = rgb_png(2)
    outputs = []
    for name in ("a", "b"):
        writer = ParquetShardWriter(tmp_path / name, PREPARED_FEATURES, "train", max_shard_bytes=10**9)
        for i in range(5):
            writer.add(row(i, image))
        outputs.append([p.read_bytes() for p in writer.close()])
    assert outputs[0] == outputs[1]


def test_swap_replaces_a_folder_whole(tmp_path):
    final, new = tmp_path / "dataset", tmp_path / "dataset.partial"
    final.mkdir()
    (final / "old.txt").write_text("old")
    new.mkdir()
    (new / "new.txt").write_text("new")
    swap_dir_into_place(new, final)
    assert sorted(p.name for p in final.iterdir()) == ["new.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]
    # A crash between the two renames left `dataset.old` and no `dataset`: the next swap still ends clean.
    final.rename(tmp_path / "dataset.old")
    new.mkdir()
    swap_dir_into_place(new, final)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]


def test_image_columns_are_stored_plain_and_text_columns_compressed(tmp_path):
    """The per-column options `datasets` 5 writes with (no compression for already-compressed image bytes)."""
    writer = ParquetShardWriter(tmp_path, PREPARED_FEATURES, "data", max_shard_bytes=10**9)
    for i in range(3):
        writer.add(row(i, rgb_png(i)))
    (path,) = writer.close()
    group = pq.ParquetFile(path).metadata.row_group(0)
    columns = {group.column(c).path_in_schema: group.column(c) for c in range(group.num_columns)}
    for name in ("image.bytes", "image.path"):
        assert columns[name].compression == "UNCOMPRESSED"
        assert "PLAIN_DICTIONARY" not in columns[name].encodings and "RLE_DICTIONARY" not in columns[name].encodings
    for name in ("image_sha256", "qa.list.element.question", "clean_meta.source_dataset"):
        assert columns[name].compression == "SNAPPY", name
        assert "RLE_DICTIONARY" in columns[name].encodings or "PLAIN_DICTIONARY" in columns[name].encodings, name


def test_disk_full_while_writing_leaves_no_shard(tmp_path, monkeypatch):
    """ENOSPC from the parquet writer (injected at the second row group): every shard of the writer is removed,
    so nothing half-written is left to be renamed, swapped into place or trusted by a rerun."""
    image = rgb_png(4)
    calls = []
    real_write = pq.ParquetWriter.write_table

    def write_table(self, table, *args, **kwargs):
        calls.append(table.num_rows)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real_write(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_table)
    writer = ParquetShardWriter(tmp_path, PREPARED_FEATURES, "data", max_shard_bytes=10**9, row_group_rows=2)
    with pytest.raises(OSError) as err:
        for i in range(6):
            writer.add(row(i, image))
    assert err.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
