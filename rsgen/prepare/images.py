"""Image checks and conversion, run in worker processes: decode fully, validate, turn upright, convert to RGB, hash.

An image whose EXIF orientation tag says "rotate" is stored with the rotation applied to its pixels (as PNG, no
tag left): the model sees the image through the processor, which ignores the tag, and a dataset viewer may
apply it; storing the upright pixels makes both show the same picture.

This module imports only the standard library, numpy and Pillow, so spawned workers start fast. A worker sends
back bytes only when the main process does not already have them (a converted image, or one read from a path);
the main process appends kept images to one pack file (`ImagePack`): one file instead of one per image, because
creating many small files is what costs most on ordinary disks.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any

from PIL import Image, ImageFile, ImageOps

ImageFile.LOAD_TRUNCATED_IMAGES = False  # a truncated file is bad input, not an image with a grey bottom


@dataclass(frozen=True)
class ImageJob:
    kind: str  # "bytes" | "path"
    payload: bytes | str
    raw_sha: str | None  # sha256 of the payload bytes when the main process already computed it
    max_pixels: int
    max_aspect_ratio: float
    eval_index: str | None = None  # folder of the evaluation image index (decontaminate), checked after the image


@dataclass(frozen=True)
class ImageResult:
    reason: str | None  # drop reason, None when the image is usable
    sha256: str | None = None  # of the bytes to store
    raw_sha256: str | None = None  # of the bytes as found in the source
    conversions: tuple[str, ...] = ()  # e.g. ("image_exif_orientation_6_applied", "image_mode_RGBA_to_RGB")
    width: int = 0
    height: int = 0
    data: bytes | None = None  # the bytes to store, when they are not the job's own payload bytes
    eval_match: int | None = None  # position in the evaluation image index of the image this one copies


class ImagePack:
    """Append-only file of image bytes; an image is addressed by (offset, length)."""

    def __init__(self, path: str | os.PathLike):
        self.path = path
        self._file = open(path, "w+b")  # open for the whole stage: appended in pass 1, read in pass 2
        self._size = 0

    def append(self, data: bytes) -> tuple[int, int]:
        self._file.seek(0, os.SEEK_END)
        offset = self._size
        self._file.write(data)
        self._size += len(data)
        return offset, len(data)

    def read(self, offset: int, length: int) -> bytes:
        self._file.seek(offset)
        return self._file.read(length)

    def close(self) -> None:
        self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


ORIENTATION_TAG = 0x0112  # EXIF Orientation: 1 = upright, 2-8 = mirrored and/or rotated


def _to_rgb(image: Image.Image) -> Image.Image:
    mode = image.mode
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in image.info):
        # Composite on white: the colour under fully transparent pixels is arbitrary and often black.
        rgba = image.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    if mode.startswith("I;16") or mode in ("I", "F"):
        # 16-bit (or 32-bit) grey: scale to 8 bits; convert("L") would clip everything above 255 to white.
        import numpy as np

        array = np.asarray(image, dtype=np.float64)
        top = 65535.0 if mode != "F" or array.max(initial=0) > 255 else 255.0
        if mode == "I" and array.max(initial=0) > 65535:
            top = float(array.max())
        scaled = np.clip(array / top * 255.0 + 0.5, 0, 255).astype(np.uint8)
        return Image.fromarray(scaled, mode="L").convert("RGB")
    return image.convert("RGB")


def _check_image(job: ImageJob) -> tuple[ImageResult, Any]:
    """The image's checks, and the copy of it that hashing needs when the job asks for a match against an
    evaluation index (else None); the result's eval_match is left to `process_images`."""
    if job.kind == "path":
        try:
            with open(job.payload, "rb") as f:
                raw = f.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return ImageResult("image_file_missing"), None
        except OSError:
            return ImageResult("image_undecodable"), None
    else:
        raw = job.payload
    if not raw:
        return ImageResult("image_zero_size"), None
    raw_sha = job.raw_sha or hashlib.sha256(raw).hexdigest()
    Image.MAX_IMAGE_PIXELS = job.max_pixels
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(raw))
            width, height = image.size
            if width == 0 or height == 0:
                return ImageResult("image_zero_size", raw_sha256=raw_sha), None
            if width * height > job.max_pixels:
                return ImageResult("image_too_many_pixels", raw_sha256=raw_sha, width=width, height=height), None
            if max(width, height) / min(width, height) > job.max_aspect_ratio:
                return ImageResult("image_aspect_ratio", raw_sha256=raw_sha, width=width, height=height), None
            image.load()  # the full decode: finds truncated and corrupt data
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        return ImageResult("image_too_many_pixels", raw_sha256=raw_sha), None
    except OSError as e:
        reason = "image_truncated" if "truncat" in str(e).lower() else "image_undecodable"
        return ImageResult(reason, raw_sha256=raw_sha), None
    except Exception:  # Pillow raises assorted errors (SyntaxError, ValueError, struct.error) on corrupt data
        return ImageResult("image_undecodable", raw_sha256=raw_sha), None

    conversions = []
    orientation = image.getexif().get(ORIENTATION_TAG, 1)  # Pillow reads corrupt EXIF leniently
    if orientation in range(2, 9):
        try:
            image = ImageOps.exif_transpose(image)
        except Exception:
            return ImageResult("image_undecodable", raw_sha256=raw_sha, width=width, height=height), None
        width, height = image.size
        conversions.append(f"image_exif_orientation_{orientation}_applied")
    mode = image.mode
    if mode != "RGB":
        try:
            image = _to_rgb(image)
        except Exception:
            return ImageResult("image_unsupported_mode", raw_sha256=raw_sha, width=width, height=height), None
        conversions.append(f"image_mode_{mode}_to_RGB")
    stored = raw
    if conversions:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")  # lossless and deterministic for the same pixels
        stored = buffer.getvalue()
    sha = raw_sha if stored is raw else hashlib.sha256(stored).hexdigest()
    data = None if stored is raw and job.kind == "bytes" else stored  # the main process has the payload already
    if job.eval_index is None:
        return ImageResult(None, sha, raw_sha, tuple(conversions), width, height, data), None
    # Signed by `process_images` with the rest of the batch, from the decoded upright RGB image, in the worker: no
    # second decode, in no other process. Reduced now: the batch holds small copies until then.
    from rsgen.prepare.perceptual import hashing_copy

    return ImageResult(None, sha, raw_sha, tuple(conversions), width, height, data), hashing_copy(image)


def process_image(job: ImageJob) -> ImageResult:
    """Check one image; store the bytes to keep (the original bytes when already RGB, else a PNG)."""
    return process_images([job])[0]


def process_images(jobs: list[ImageJob]) -> list[ImageResult]:
    """A batch of jobs in one task: fewer round trips to the pool, and the batch's images signed and matched
    against the evaluation index together (hashes, proposal and gate are vectorised over the whole batch)."""
    checked = [_check_image(job) for job in jobs]
    by_index: dict[str, list[int]] = {}
    for n, (_, image) in enumerate(checked):
        if image is not None:
            by_index.setdefault(jobs[n].eval_index, []).append(n)
    results = [result for result, _ in checked]
    if by_index:
        from dataclasses import replace

        from rsgen.prepare.perceptual import image_signatures, open_index

        for directory, positions in by_index.items():
            signatures = image_signatures([checked[n][1] for n in positions])
            matches = open_index(directory).match_many(signatures)
            for n, match in zip(positions, matches):
                results[n] = replace(results[n], eval_match=match)
    return results


_DATA_URI = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
_BASE64 = re.compile(r"^[A-Za-z0-9+/\s]+={0,2}$")
_IMAGE_SIGNATURES = (b"\x89PNG", b"\xff\xd8\xff", b"GIF8", b"BM", b"RIFF", b"II*\x00", b"MM\x00*")
MIN_BASE64_CHARS = 64  # a base64 image is far longer; shorter strings are file names
LONGEST_PATH = 4096  # no file path is longer: a longer base64-looking string is an image, if a broken one


def inline_image(text: str) -> bytes | None:
    """The bytes of an image written inline as a data URI (`data:image/png;base64,...`) or as bare base64 (how
    TSV benchmarks such as MMBench store images); None when `text` is a file path.

    A string of base64 characters counts as an image when it decodes to a known image signature or is longer
    than any path; b"" when it is meant as an image but does not decode (the image check then drops it)."""
    text = text.strip()
    m = _DATA_URI.match(text)
    if m is None and (len(text) < MIN_BASE64_CHARS or not _BASE64.match(text)):
        return None
    payload = "".join(text[m.end() :].split()) if m else "".join(text.split())
    if m is None and len(payload) <= LONGEST_PATH:
        try:
            head = base64.b64decode(payload[:16], validate=True)
        except (binascii.Error, ValueError):
            return None
        if not head.startswith(_IMAGE_SIGNATURES):
            return None
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        return b""


def encode_pil(image: Image.Image) -> bytes:
    """Bytes of an already decoded image (a loader that decoded despite being asked not to)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")  # lossless: re-encoding as JPEG would change the pixels again
    return buffer.getvalue()


def resolve_path(path: str, bases: tuple[str, ...]) -> str:
    """`path` as given when absolute or found under one of `bases` (the source's folders), else under the first."""
    path = os.path.expanduser(path)
    if os.path.isabs(path):
        return path
    for base in bases:
        candidate = os.path.join(base, path)
        if os.path.exists(candidate):
            return candidate
    return os.path.join(bases[0] if bases else os.getcwd(), path)


def image_payload(value: Any, bases: tuple[str, ...]) -> tuple[str, Any, str | None]:
    """(kind, payload, recorded path) with kind "bytes" | "path" | a drop reason."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
        if data:
            return "bytes", bytes(data), path if isinstance(path, str) else None
        if isinstance(path, str) and path.strip():
            return "path", resolve_path(path, bases), path
        return ("image_zero_size" if data is not None else "image_missing"), None, None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(value), None) if len(value) else ("image_zero_size", None, None)
    if isinstance(value, str):
        if not value.strip():
            return "image_missing", None, None
        data = inline_image(value)
        if data is not None:
            return ("bytes", data, None) if data else ("image_undecodable", None, None)
        return "path", resolve_path(value, bases), value
    if value is None:
        return "image_missing", None, None
    if isinstance(value, Image.Image):
        try:
            return "bytes", encode_pil(value), getattr(value, "filename", None) or None
        except Exception:  # a decoded image that cannot be written back
            return "image_undecodable", None, None
    return "image_undecodable", None, None
