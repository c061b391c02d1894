import hashlib
import io

import numpy as np
import pytest
from PIL import Image

from rsgen.prepare.images import ImageJob, ImagePack, process_image

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
    assert result.reason is None and result.conversion is None
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
    assert result.reason is None and result.conversion == conversion
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
