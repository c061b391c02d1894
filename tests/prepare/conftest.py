"""Helpers for the prepare tests: small images drawn with PIL (including every kind of bad image), recipes."""

import csv
import io
import json
import struct
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from rsgen.config import RecipeConfig, source_from_dict


def encode(image: Image.Image, fmt: str = "PNG") -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def rgb_png(seed: int, size=(48, 32)) -> bytes:
    """A distinct RGB PNG per seed."""
    rng = np.random.default_rng(seed)
    return encode(Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8), "RGB"))


def bomb_png(width: int = 30000, height: int = 30000) -> bytes:
    """A few hundred bytes whose header claims a huge image: a decompression bomb."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def rotated_jpeg() -> bytes:
    """A 40x20 JPEG, left half red and right half blue, whose EXIF orientation 6 says: show it turned 90 degrees
    clockwise (20x40, red on top)."""
    image = Image.new("RGB", (40, 20), "blue")
    image.paste((255, 0, 0), (0, 0, 20, 20))
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", exif=exif, quality=95)
    return buffer.getvalue()


def bad_images() -> dict[str, bytes]:
    """Image bytes for each drop class (key = the reason prepare must report)."""
    good = rgb_png(999, (64, 64))
    return {
        "image_undecodable": b"this is not an image",
        "image_truncated": good[: len(good) // 2],
        "image_zero_size": b"",
        "image_aspect_ratio": encode(Image.new("RGB", (402, 2), "white")),
        "image_too_many_pixels": bomb_png(),
    }


def mode_images() -> dict[str, bytes]:
    """Image bytes for each converted mode (key = the conversion prepare must report)."""
    return {
        "image_mode_RGBA_to_RGB": encode(Image.new("RGBA", (16, 16), (255, 0, 0, 128))),
        "image_mode_P_to_RGB": encode(Image.new("RGB", (16, 16), "blue").convert("P")),
        "image_mode_LA_to_RGB": encode(Image.new("LA", (16, 16), (40, 200))),
        "image_mode_L_to_RGB": encode(Image.new("L", (16, 16), 90)),
        "image_mode_CMYK_to_RGB": encode(Image.new("CMYK", (16, 16), (0, 255, 255, 0)), "JPEG"),
        "image_mode_I;16_to_RGB": encode(Image.fromarray(np.full((16, 16), 60000, dtype=np.uint16))),
    }


def make_recipe(output_dir, sources: list[dict], **kw) -> RecipeConfig:
    """A recipe for prepare only (built directly: prepare needs no verifier or model)."""
    kw.setdefault("prepare_num_proc", 1)
    return RecipeConfig(
        output_dir=str(output_dir), sources=[source_from_dict(s, i) for i, s in enumerate(sources)], **kw
    )


POOL_FORMATS = ("csv", "tsv", "jsonl", "json", "parquet", "imagefolder")


def write_pool(folder, fmt: str, rows: list[dict], **source) -> dict:
    """Write `rows` (column -> value; `image` holds image bytes or the cell's text) as a pool in format `fmt`, the way public pools
    are published: image files next to a CSV / TSV / JSON Lines / JSON array table (`imagefolder`: a
    metadata.jsonl naming them by `file_name`), or bytes embedded in parquet. Returns the source mapping that
    reads it (family "F" unless `source` says otherwise)."""
    folder.mkdir(parents=True, exist_ok=True)
    table = []
    for i, row in enumerate(rows):
        row = dict(row)
        image = row.pop("image")
        if fmt == "parquet" or isinstance(image, str):  # a string is the cell itself (base64, a data URI, a path)
            row["file_name" if fmt == "imagefolder" else "image"] = image
        else:
            name = f"img{i}.png"
            (folder / name).write_bytes(image)
            row["file_name" if fmt == "imagefolder" else "image"] = name
        table.append(row)
    names = list(dict.fromkeys(k for row in table for k in row))
    if fmt in ("csv", "tsv"):
        path = folder / f"pool.{fmt}"
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, names, delimiter="\t" if fmt == "tsv" else ",")
            writer.writeheader()
            writer.writerows(table)
    elif fmt in ("jsonl", "imagefolder"):
        path = folder / ("metadata.jsonl" if fmt == "imagefolder" else "pool.jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in table), encoding="utf-8")
    elif fmt == "json":
        path = folder / "pool.json"
        path.write_text(json.dumps(table, indent=1), encoding="utf-8")
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = folder / "pool.parquet"
        pq.write_table(pa.Table.from_pylist(table), path)
    else:
        raise ValueError(fmt)
    where = {"data_dir": str(folder)} if fmt == "imagefolder" else {"data_files": [str(path)]}
    return {**where, "family": "F", **source}


def record_wheres(source: dict) -> list[str]:
    """`file:position` of each record of a pool `write_pool` wrote, as a user finds it: the line where the record
    starts in a text file (counted from 1, a CSV header included: JSON Lines -> 1, 2, ...; CSV -> 2, 3, ...; a JSON
    array written with indent=1 -> the lines that open an object), the 0-based row index in a parquet file."""
    from pathlib import Path

    path = Path(source["data_files"][0]) if "data_files" in source else Path(source["data_dir"]) / "metadata.jsonl"
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return [f"{path.name}:{i}" for i in range(pq.read_metadata(path).num_rows)]
    lines = path.read_text(encoding="utf-8").splitlines()
    if path.suffix in (".csv", ".tsv"):
        starts = range(2, len(lines) + 1)
    elif path.suffix == ".json":
        starts = [n for n, line in enumerate(lines, 1) if line == " {"]
    else:
        starts = [n for n, line in enumerate(lines, 1) if line.strip()]
    return [f"{path.name}:{n}" for n in starts]


@pytest.fixture(params=POOL_FORMATS)
def pool_format(request) -> str:
    """Each way a local pool is stored; a test taking it runs once per format."""
    return request.param


@pytest.fixture
def tools():
    return SimpleNamespace(
        encode=encode,
        rgb_png=rgb_png,
        bomb_png=bomb_png,
        rotated_jpeg=rotated_jpeg,
        bad_images=bad_images,
        mode_images=mode_images,
        make_recipe=make_recipe,
        write_pool=write_pool,
        record_wheres=record_wheres,
    )
