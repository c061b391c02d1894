"""`bench/bench_prepare.py`'s pool writer: `--image-size` stores every image resized and leaves the rest of each row
as the demo drew it, readable by `datasets` as an Image column."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import pyarrow.parquet as pq
from PIL import Image

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from bench_prepare import write_pool  # noqa: E402


def test_image_size_resizes_every_image_and_keeps_the_rest(tmp_path):
    demo, resized = str(tmp_path / "demo.parquet"), str(tmp_path / "resized.parquet")
    write_pool(demo, 60, seed=7, image_size=None)
    write_pool(resized, 60, seed=7, image_size=(96, 64))
    a, b = pq.read_table(demo), pq.read_table(resized)
    assert a.schema.equals(b.schema, check_metadata=True)  # the `datasets` features travel with the file
    assert pq.ParquetFile(resized).num_row_groups == pq.ParquetFile(demo).num_row_groups > 1  # 100 rows each
    assert a.drop(["image"]).equals(b.drop(["image"]))
    for before, after in zip(a.column("image").to_pylist(), b.column("image").to_pylist()):
        assert Image.open(io.BytesIO(before["bytes"])).size == (168, 112)
        image = Image.open(io.BytesIO(after["bytes"]))
        assert (image.format, image.size) == ("PNG", (96, 64))

    import datasets

    row = datasets.load_dataset("parquet", data_files=resized, split="train")[0]
    assert row["image"].size == (96, 64)
