"""Is this image a copy of that one? Perceptual signatures that propose candidates, a pixel check that confirms.

A copy of an evaluation image may be resized, re-encoded, cropped a little at an edge, or padded to another
aspect ratio. Global hashes alone cannot decide: on synthetic scenes (a plain background with a few small
objects, like the demo's) two different scenes hash alike, while a letterboxed copy hashes far from its
original. So the decision has two steps:

1. **Propose** (cheap, vectorised over the whole evaluation index): two 64-bit DCT hashes (pHash: the signs of
   the 8 x 8 lowest frequencies of a 32 x 32 grey thumbnail against their median), one of the whole image and
   one of its *content box* -- the image with uniform borders trimmed, repeatedly, so that letterbox bars and
   then a plain background both go. A candidate is within `PROPOSE_BITS` of either hash and has a content box
   of about the same shape (within the crop a copy may have had).
2. **Confirm** (on the few candidates): both content boxes as `THUMB` x `THUMB` colour thumbnails, aligned --
   the side a crop shortened is cut from the other image at either end, then every box edge is nudged a pixel at
   a time while that lowers the mean difference (trimming a re-encoded copy lands a pixel or two off) -- and
   compared pixel by pixel. A copy differs from its original only along edges (resampling, JPEG ringing, the
   last sub-pixel of misalignment): one or two pixels wide. Another image, or an edited one, differs in solid
   regions: a moved object, a bar one unit taller. So the check erodes the map of strong differences with a
   3 x 3 square, which removes lines up to two pixels wide, and confirms only when nothing is left.

This module imports only numpy and Pillow: image workers compute signatures next to the image checks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

WORK_SIDE = 128  # content boxes are found on a copy this size on its long side: fast, and JPEG noise averages out
BORDER_TOLERANCE = 32  # a border line is uniform when its pixels are within this of the line's median colour ...
BORDER_UNIFORM_SHARE = 0.98  # ... this share of them at least
HASH_SIDE = 32
THUMB = 64  # confirmation thumbnail side (the content box, stretched to a square)
MAX_CROP = 0.2  # a copy may have lost up to this share of one side (checked through the content-box shapes)
PROPOSE_BITS = 14  # hash distance (of 64 bits) under which an evaluation image is a candidate
MAX_CANDIDATES = 64  # candidates confirmed per image, nearest first (bounds the cost on near-identical sets)
STRONG_DIFFERENCE = 48  # per-channel difference (of 255) that counts as a real one, after a light blur
SEARCH_BELOW = 100  # solid pixels under which a pair is worth the alignment search (above: no nudge helps)
MAX_SOLID_PIXELS = 8  # of THUMB x THUMB: a copy leaves at most this many (0.2%); other images leave dozens
BASE_SIDE = 256  # every measurement is taken on a copy at most this size on its long side
SIGNATURE_VERSION = 1  # part of the prepared pool's fingerprint: a new version re-runs decontamination


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


_DCT = _dct_matrix(HASH_SIDE)


@dataclass(frozen=True)
class ImageSignature:
    """What the index keeps of an image: two hashes, the content box's shape and a small thumbnail."""

    hash_whole: int  # pHash of the whole image
    hash_content: int  # pHash of the content box
    aspect: float  # width / height of the content box, in the image's pixels
    thumb: bytes  # THUMB x THUMB x 3 uint8: the content box, stretched, lightly blurred


def _uniform_lines(lines: np.ndarray) -> int:
    """How many lines, from the first inward, are uniform in the colour of the first line."""
    reference = np.median(lines[0], axis=0)
    # Chunks of growing size from the outside in: most lines are never looked at (the first mixed line is near).
    start, size = 0, 4
    while start < len(lines):
        chunk = lines[start : start + size]
        uniform = (np.abs(chunk - reference).max(axis=2) <= BORDER_TOLERANCE).mean(axis=1) >= BORDER_UNIFORM_SHARE
        first_mixed = np.flatnonzero(~uniform)
        if first_mixed.size:
            return start + int(first_mixed[0])
        start, size = start + size, size * 2
    return len(lines)


def content_box(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of `pixels` (H x W x 3) once uniform borders are trimmed, again and again (a
    letterbox bar, then a plain background). An image that is uniform all over keeps its full box."""
    a = pixels.astype(np.int16)
    left, top, right, bottom = 0, 0, a.shape[1], a.shape[0]
    while True:
        inner = a[top:bottom, left:right]
        height, width = inner.shape[:2]
        columns = inner.transpose(1, 0, 2)
        t, b = _uniform_lines(inner), _uniform_lines(inner[::-1])
        lft, rgt = _uniform_lines(columns), _uniform_lines(columns[::-1])
        if (t, b, lft, rgt) == (0, 0, 0, 0) or t + b >= height - 1 or lft + rgt >= width - 1:
            return left, top, right, bottom
        left, top, right, bottom = left + lft, top + t, right - rgt, bottom - b


def _phash(grey: Image.Image, box) -> int:
    small = np.asarray(grey.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX, box=box), dtype=np.float64)
    low = (_DCT @ small @ _DCT.T)[:8, :8].ravel()
    bits = low > np.median(low[1:])  # the DC term says only how bright the image is
    return int(np.packbits(bits).view(">u8")[0])


def image_signature(image: Image.Image) -> ImageSignature:
    image = image.convert("RGB")
    if max(image.size) > BASE_SIDE:
        factor = max(image.size) / BASE_SIDE
        image = image.resize((max(1, round(image.width / factor)), max(1, round(image.height / factor))),
                             Image.Resampling.BOX)
    width, height = image.size
    scale = min(1.0, WORK_SIDE / max(width, height))
    work = image if scale == 1.0 else image.resize(
        (max(1, round(width * scale)), max(1, round(height * scale))), Image.Resampling.BOX)
    box = content_box(np.asarray(work))
    box = (min(box[0] / scale, width), min(box[1] / scale, height), min(box[2] / scale, width),
           min(box[3] / scale, height))
    grey = image.convert("L")
    thumb = image.resize((THUMB, THUMB), Image.Resampling.BOX, box=box).filter(ImageFilter.GaussianBlur(0.7))
    return ImageSignature(
        hash_whole=_phash(grey, (0, 0, width, height)),
        hash_content=_phash(grey, box),
        aspect=(box[2] - box[0]) / (box[3] - box[1]),
        thumb=thumb.tobytes(),
    )


# ------------------------------------------------------------------------------------------ confirmation


def _view(thumb: bytes) -> Image.Image:
    return Image.frombytes("RGB", (THUMB, THUMB), thumb)


def _sample(image: Image.Image, box: list[float], size: tuple[int, int]) -> np.ndarray:
    return np.asarray(image.resize(size, Image.Resampling.BILINEAR, box=tuple(box)), dtype=np.int16)


def _starts(ratio: float) -> list[tuple[list[float], list[float]]]:
    """Pairs of boxes (in thumbnail pixels) that undo a crop at one end of the side the shapes say was cut."""
    full = [0.0, 0.0, float(THUMB), float(THUMB)]
    if abs(np.log(ratio)) < 0.01:
        return [(list(full), list(full))]
    # ratio = a's aspect / b's aspect. Below 1, a is relatively taller: a lost width or b lost height.
    kept = THUMB * (ratio if ratio < 1 else 1 / ratio)
    ends = (0.0, THUMB - kept)
    if ratio < 1:
        return ([(list(full), [x, 0.0, x + kept, THUMB]) for x in ends]
                + [([0.0, y, THUMB, y + kept], list(full)) for y in ends])
    return ([(list(full), [0.0, y, THUMB, y + kept]) for y in ends]
            + [([x, 0.0, x + kept, THUMB], list(full)) for x in ends])


def _inside(box: list[float]) -> bool:
    least = THUMB * (1 - MAX_CROP) * 0.9
    return 0 <= box[0] and 0 <= box[1] and box[2] <= THUMB and box[3] <= THUMB and \
        box[2] - box[0] >= least and box[3] - box[1] >= least


def compare(a: ImageSignature, b: ImageSignature) -> int | None:
    """The number of pixels (of a THUMB-sided comparison) in solid regions where the two images differ once
    aligned: at most MAX_SOLID_PIXELS for a copy. None when their shapes rule a copy out."""
    ratio = a.aspect / b.aspect
    if abs(np.log(ratio)) > -np.log(1 - MAX_CROP):
        return None
    size = (THUMB, max(8, round(THUMB / a.aspect))) if a.aspect >= 1 else (max(8, round(THUMB * a.aspect)), THUMB)
    ia, ib = _view(a.thumb), _view(b.thumb)
    coarse = (max(8, size[0] // 2), max(8, size[1] // 2))  # the search runs at half size: 4x fewer pixels

    def cost(box_a, box_b):
        return float(np.abs(_sample(ia, box_a, coarse) - _sample(ib, box_b, coarse)).mean())

    def solid(box_a, box_b) -> int:
        strong = np.abs(_sample(ia, box_a, size) - _sample(ib, box_b, size)).max(axis=2) > STRONG_DIFFERENCE
        # 3 x 3 erosion: a pixel survives when it and its eight neighbours all differ strongly.
        core = strong[1:-1, 1:-1].copy()
        for dy in (0, 1, 2):
            for dx in (0, 1, 2):
                core &= strong[dy : dy + core.shape[0], dx : dx + core.shape[1]]
        return int(core.sum())

    current, box_a, box_b = min(((cost(x, y), x, y) for x, y in _starts(ratio)), key=lambda t: t[0])
    first = solid(box_a, box_b)
    if first == 0 or first > SEARCH_BELOW:
        # Aligned by the content boxes alone: a copy already, or too different for a nudge to help.
        return first
    for _ in range(4):  # nudge edges one thumbnail pixel at a time while the difference drops
        improved = False
        for box in (box_a, box_b):
            for edge in range(4):
                for step in (1.0, -1.0):
                    old = box[edge]
                    box[edge] = old + step
                    if _inside(box):
                        trial = cost(box_a, box_b)
                        if trial < current - 1e-6:
                            current, improved = trial, True
                            continue
                    box[edge] = old
        if not improved:
            break
    return solid(box_a, box_b)


def is_copy(a: ImageSignature, b: ImageSignature) -> bool:
    solid = compare(a, b)
    return solid is not None and solid <= MAX_SOLID_PIXELS


_BITS_IN_BYTE = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def hash_distances(hashes: np.ndarray, value: int) -> np.ndarray:
    """Bits that differ between `value` and each of `hashes` (uint64); a byte table rather than
    np.bitwise_count, which needs numpy 2."""
    differing = (hashes ^ np.uint64(value)).view(np.uint8).reshape(-1, 8)
    return _BITS_IN_BYTE[differing].sum(axis=1, dtype=np.int32)


# ------------------------------------------------------------------------------------------ the index


class ImageIndex:
    """Signatures of the evaluation images: hashes and shapes in memory (17 bytes an image), thumbnails in a
    file read through a memory map (12 KB an image, paged in only for candidates). Image workers open it by
    path, once per process."""

    def __init__(self, hash_whole: np.ndarray, hash_content: np.ndarray, aspect: np.ndarray, thumbs: np.ndarray):
        self.hash_whole, self.hash_content, self.aspect, self.thumbs = hash_whole, hash_content, aspect, thumbs

    def __len__(self) -> int:
        return len(self.aspect)

    @staticmethod
    def write(directory, signatures: list[ImageSignature]) -> None:
        import os

        os.makedirs(directory, exist_ok=True)
        np.savez(os.path.join(directory, "hashes.npz"),
                 hash_whole=np.array([s.hash_whole for s in signatures], dtype=np.uint64),
                 hash_content=np.array([s.hash_content for s in signatures], dtype=np.uint64),
                 aspect=np.array([s.aspect for s in signatures], dtype=np.float64))
        with open(os.path.join(directory, "thumbs.u8"), "wb") as f:
            for s in signatures:
                f.write(s.thumb)

    @classmethod
    def open(cls, directory) -> ImageIndex:
        import os

        arrays = np.load(os.path.join(directory, "hashes.npz"))
        n = len(arrays["aspect"])
        path = os.path.join(directory, "thumbs.u8")
        if n:
            thumbs = np.memmap(path, dtype=np.uint8, mode="r", shape=(n, THUMB * THUMB * 3))
        else:  # np.memmap refuses an empty file
            thumbs = np.zeros((0, THUMB * THUMB * 3), dtype=np.uint8)
        return cls(arrays["hash_whole"], arrays["hash_content"], arrays["aspect"], thumbs)

    def candidates(self, sig: ImageSignature) -> np.ndarray:
        """Evaluation images a copy of `sig` could be, nearest first."""
        distance = np.minimum(hash_distances(self.hash_whole, sig.hash_whole),
                              hash_distances(self.hash_content, sig.hash_content))
        shape = np.abs(np.log(self.aspect / sig.aspect)) <= -np.log(1 - MAX_CROP)
        found = np.flatnonzero((distance <= PROPOSE_BITS) & shape)
        return found[np.argsort(distance[found], kind="stable")]

    def match(self, sig: ImageSignature) -> int | None:
        """The first evaluation image (by index) that `sig` is a copy of, nearest hash first; None if none."""
        for i in self.candidates(sig)[:MAX_CANDIDATES]:
            other = ImageSignature(int(self.hash_whole[i]), int(self.hash_content[i]), float(self.aspect[i]),
                                   self.thumbs[i].tobytes())
            if is_copy(sig, other):
                return int(i)
        return None


_OPEN_INDEX: dict[tuple, ImageIndex] = {}


def open_index(directory: str) -> ImageIndex:
    """The index at `directory`, opened once per process (image workers live for the whole prepare run). Keyed
    by the index file's identity too: a later prepare in the same process rebuilds the index at the same path."""
    import os

    stat = os.stat(os.path.join(directory, "hashes.npz"))
    key = (directory, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if key not in _OPEN_INDEX:
        _OPEN_INDEX.clear()  # one run's index at a time
        _OPEN_INDEX[key] = ImageIndex.open(directory)
    return _OPEN_INDEX[key]
