import base64
import hashlib
import io
import warnings

import numpy as np
import pytest
from PIL import Image, ImageOps

from rsgen.prepare.images import ImageJob, ImagePack, inline_image, process_image

LIMITS = {"max_pixels": 89_478_485, "max_aspect_ratio": 200.0}


def job(data, kind="bytes", **kw):
    limits = {**LIMITS, **kw}
    return ImageJob(kind, data, None, limits["max_pixels"], limits["max_aspect_ratio"])


def check(data, **kw):
    """(result, the bytes prepare would store)."""
    j = job(data, **kw)
    result = process_image(j)
    return result, (result.data if result.data is not None else j.payload)


def test_rgb_image_is_kept_byte_for_byte(tools):
    data = tools.rgb_png(1)
    result, stored = check(data)
    assert result.reason is None and result.conversions == ()
    assert result.data is None  # nothing to send back: the main process has these bytes
    assert stored == data and result.sha256 == result.raw_sha256 == hashlib.sha256(data).hexdigest()
    assert (result.width, result.height) == (48, 32)


def test_jpeg_keeps_its_original_bytes(tools):
    data = tools.encode(Image.open(io.BytesIO(tools.rgb_png(2))), "JPEG")
    result, stored = check(data)
    assert result.reason is None and stored == data and result.sha256 == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("reason", ["image_undecodable", "image_truncated", "image_zero_size",
                                    "image_aspect_ratio", "image_too_many_pixels"])
def test_bad_images_are_dropped_with_their_reason(tools, reason):
    result, _ = check(tools.bad_images()[reason])
    assert result.reason == reason and result.data is None and result.sha256 is None


def test_pixel_limit_comes_from_the_recipe(tools):
    data = tools.rgb_png(3, (100, 100))
    assert check(data, max_pixels=9_999)[0].reason == "image_too_many_pixels"
    assert check(data, max_pixels=10_000)[0].reason is None


def test_aspect_ratio_limit_is_inclusive(tools):
    data = tools.encode(Image.new("RGB", (400, 2)))
    assert check(data)[0].reason is None  # exactly 200
    assert check(data, max_aspect_ratio=199.0)[0].reason == "image_aspect_ratio"


@pytest.mark.parametrize("conversion", ["image_mode_RGBA_to_RGB", "image_mode_P_to_RGB", "image_mode_LA_to_RGB",
                                        "image_mode_L_to_RGB", "image_mode_CMYK_to_RGB", "image_mode_I;16_to_RGB"])
def test_non_rgb_modes_are_converted(tools, conversion):
    result, stored = check(tools.mode_images()[conversion])
    assert result.reason is None and result.conversions == (conversion,)
    assert hashlib.sha256(stored).hexdigest() == result.sha256 != result.raw_sha256
    image = Image.open(io.BytesIO(stored))
    assert image.mode == "RGB" and image.format == "PNG" and image.size == (16, 16)


def test_conversion_keeps_the_picture(tools):
    def stored_pixel(data):
        return Image.open(io.BytesIO(check(data)[1])).getpixel((0, 0))

    images = tools.mode_images()
    assert stored_pixel(images["image_mode_RGBA_to_RGB"]) == (255, 127, 127)  # half red on white
    assert stored_pixel(images["image_mode_P_to_RGB"]) == (0, 0, 255)
    assert stored_pixel(images["image_mode_L_to_RGB"]) == (90, 90, 90)
    assert stored_pixel(images["image_mode_I;16_to_RGB"]) == (233, 233, 233)  # 60000/65535 scaled, not clipped


def test_conversion_is_deterministic(tools):
    data = tools.mode_images()["image_mode_RGBA_to_RGB"]
    assert check(data) == check(data)


def test_paths_missing_and_empty_files(tmp_path, tools):
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    good = tmp_path / "good.png"
    good.write_bytes(tools.rgb_png(4))
    assert check(str(tmp_path / "nope.png"), kind="path")[0].reason == "image_file_missing"
    assert check(str(empty), kind="path")[0].reason == "image_zero_size"
    assert check(str(tmp_path), kind="path")[0].reason == "image_file_missing"
    result = process_image(job(str(good), kind="path"))
    assert result.reason is None and result.data == tools.rgb_png(4)  # read by the worker, sent back


def test_image_pack_round_trip(tmp_path, tools):
    images = [tools.rgb_png(i) for i in range(5)]
    with ImagePack(tmp_path / "pack.bin") as pack:
        locations = [pack.append(data) for data in images]
        assert [pack.read(*loc) for loc in reversed(locations)] == list(reversed(images))
        late = pack.append(b"late")  # appending after reads still goes to the end
        assert pack.read(*late) == b"late" and pack.read(*locations[0]) == images[0]
    assert np.diff([loc[0] for loc in locations]).min() > 0


# ------------------------------------------------------------------------------------------------ orientation


def test_exif_rotated_jpeg_is_stored_upright(tools):
    data = tools.rotated_jpeg()
    result, stored = check(data)
    assert result.reason is None and result.conversions == ("image_exif_orientation_6_applied",)
    image = Image.open(io.BytesIO(stored))
    assert image.format == "PNG" and image.size == (20, 40) == (result.width, result.height)
    assert image.getexif().get(0x0112) is None  # nothing left for a viewer to rotate again
    assert image.getpixel((10, 5))[0] > 200 and image.getpixel((10, 35))[2] > 200  # red on top, blue below
    expected = ImageOps.exif_transpose(Image.open(io.BytesIO(data))).convert("RGB")
    assert np.array_equal(np.asarray(image), np.asarray(expected))
    assert result.sha256 == hashlib.sha256(stored).hexdigest() != result.raw_sha256


def test_upright_exif_tag_keeps_the_bytes(tools):
    image = Image.open(io.BytesIO(tools.rgb_png(3)))
    exif = Image.Exif()
    exif[0x0112] = 1
    data = _save(image, "JPEG", exif=exif)
    result, stored = check(data)
    assert result.conversions == () and stored == data


def _save(image, fmt, **kw):
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **kw)
    return buffer.getvalue()


# ------------------------------------------------------------------------------------------------ inline images


def test_inline_image_reads_data_uris_and_base64(tools):
    png = tools.rgb_png(4)
    text = base64.b64encode(png).decode()
    assert inline_image(f"data:image/png;base64,{text}") == png
    assert inline_image(text) == png
    assert inline_image(text[:60] + "\n" + text[60:]) == png  # wrapped lines (MIME style)
    assert inline_image("data:image/png;base64,!!!") == b""  # meant as an image, broken
    assert inline_image("A" * 5000) == bytes(3750)  # longer than any path: an image (the check finds it broken)
    assert inline_image("images/cat.png") is None
    assert inline_image("0" * 70) is None  # base64 characters, but no image inside and short: a file name


@pytest.mark.parametrize("pool_format", ["csv", "tsv", "jsonl", "json", "parquet"])
def test_pool_with_inline_images(tmp_path, tools, pool_format):
    from rsgen.prepare import run_prepare
    from rsgen.schema import load_prepared

    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    rows = [
        {"image": "data:image/png;base64," + b64(tools.rgb_png(1)), "question": "uri?", "answer": "a"},
        {"image": b64(tools.rgb_png(2)), "question": "bare?", "answer": "a"},
        {"image": b64(tools.rotated_jpeg()), "question": "rotated?", "answer": "a"},
        {"image": "data:image/png;base64,@@@@", "question": "broken?", "answer": "a"},
        {"image": b64(b"GIF89a" + b"\0" * 80), "question": "not really a gif?", "answer": "a"},
        {"image": "missing.png", "question": "path?", "answer": "a"},
    ]
    source = tools.write_pool(tmp_path / "pool", pool_format, rows)
    recipe = tools.make_recipe(tmp_path / "out", [source], instruction="")
    report = run_prepare(recipe)
    assert report["dropped"] == {"image_undecodable": 2, "image_file_missing": 1}
    assert report["converted"] == {"image_exif_orientation_6_applied": 1}
    images = {q["question"]: row["image"] for row in load_prepared(recipe.output_dir) for q in row["qa"]}
    assert sorted(images) == ["bare?", "rotated?", "uri?"]
    assert images["rotated?"].size == (20, 40)  # what `datasets` shows is the upright image
    assert hashlib.sha256(tools.rgb_png(1)).hexdigest() in {
        row["image_sha256"] for row in load_prepared(recipe.output_dir)}


def test_pool_with_an_exif_rotated_image_in_every_format(tmp_path, tools, pool_format):
    from rsgen.prepare import run_prepare
    from rsgen.schema import load_prepared

    rows = [{"image": tools.rotated_jpeg(), "question": "which color is on top?", "answer": "red"},
            {"image": b"\xff\xd8\xff broken jpeg", "question": "broken?", "answer": "a"}]
    source = tools.write_pool(tmp_path / "pool", pool_format, rows)
    recipe = tools.make_recipe(tmp_path / "out", [source])
    report = run_prepare(recipe)
    assert report["dropped"] == {"image_undecodable": 1}
    assert report["converted"] == {"image_exif_orientation_6_applied": 1}
    (row,) = load_prepared(recipe.output_dir)
    assert row["image"].size == (20, 40) and row["image"].getpixel((10, 5))[0] > 200
    assert "image_upright@1" in row["clean_meta"]["steps"]


def test_corrupt_exif_orientation_keeps_the_image(tools):
    """An Orientation tag of the wrong type and a truncated EXIF block: the pixels are kept as stored."""
    import struct

    good = tools.encode(Image.open(io.BytesIO(tools.rgb_png(5))), "JPEG")
    tiff = b"II*\x00" + struct.pack("<I", 8) + struct.pack("<H", 1) + struct.pack("<HHII", 0x0112, 2, 4, 100)
    junk = b"Exif\x00\x00" + tiff
    data = good[:2] + b"\xff\xe1" + (len(junk) + 2).to_bytes(2, "big") + junk + good[2:]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pillow warns about the corrupt EXIF
        result, stored = check(data)
    assert result.reason is None and result.conversions == () and stored == data
