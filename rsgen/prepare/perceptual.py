"""Is this image a copy of that one? Signatures propose candidates; a cheap gate, then a pixel check, confirm.

A copy of an evaluation image may be resized, re-encoded, cropped a little at an edge, or padded to another
aspect ratio. Global hashes alone cannot decide: on synthetic scenes (a plain background with a few small
objects, like the demo's) two different scenes hash alike, while a letterboxed copy hashes far from its
original. So the decision has three steps:

1. **Propose** (cheap, vectorised over the whole evaluation index): two 64-bit DCT hashes (pHash: the signs of
   the 8 x 8 lowest frequencies of a 32 x 32 grey thumbnail against their median), one of the whole image and
   one of its *content box* -- the image with uniform borders trimmed, repeatedly, so that letterbox bars and
   then a plain background both go. A candidate is within `PROPOSE_BITS` of either hash and has a content box
   of about the same shape (within the crop a copy may have had).
2. **Gate** (cheap, vectorised over every candidate pair of a batch of images): both content boxes as 8 x 8
   cell averages (from TINY x TINY averages kept per image), aligned as step 3 starts; a pair passes when no
   cell differs by more than GATE_MAX. A copy's cells differ only a little (edges and noise average out);
   another synthetic scene has an object in some cell where the other has background. Of the candidates the
   hashes propose for demo images (11.5-11.9 an image against 10,000 evaluation images), about 1 in 160-180 passes
   (signature version 3).
3. **Confirm** (on the few that pass): both content boxes as `THUMB` x `THUMB` colour thumbnails, aligned --
   the side a crop shortened is cut from the other image at either end, then every box edge is nudged a pixel at
   a time while that lowers the mean difference (trimming a re-encoded copy lands a pixel or two off) -- and
   compared pixel by pixel. A copy differs from its original only along edges (resampling, JPEG ringing, the
   last sub-pixel of misalignment): one or two pixels wide. Another image, or an edited one, differs in solid
   regions: a moved object, a bar one unit taller. So the check erodes the map of strong differences with a
   3 x 3 square, which removes lines up to two pixels wide, and confirms only when nothing is left.

This module imports only numpy and Pillow: image workers compute signatures next to the image checks, on the
image they decoded anyway, reduced by an integer factor (or decoded at reduced size: `decode_for_hashing`).

Longer than most modules (~550 lines): the three steps stay together, since the gate and the pixel check read the
thumbnails and content boxes the signature step keeps, and a change to one is a change to what the others compare.
"""

from __future__ import annotations

import os

import numpy as np
from PIL import Image, ImageFilter

# Hashes, content box and gate averages are measured on a copy reduced to under twice this: fast, and JPEG noise
# averages out. 64 since signature version 3 (version 2: 128): the content box of a 168 x 112 demo image cost 75 us at
# full size, 44 at half, and every promised copy is still found (tests/prepare/test_decontaminate.py).
WORK_SIDE = 64
BORDER_TOLERANCE = 32  # a border line is uniform when its pixels are within this of the line's median colour ...
BORDER_UNIFORM_SHARE = 0.98  # ... this share of them at least
HASH_SIDE = 32
THUMB = 64  # confirmation thumbnail side (the content box, stretched to a square)
TINY = 16  # side of the content box's area averages that the gate compares (TINY x TINY x 3 bytes an image)
GATE_CELLS = TINY // 2  # the gate compares the aligned content boxes as GATE_CELLS x GATE_CELLS cell averages ...
GATE_MAX = 96  # ... and passes a candidate when no cell's mean colour differs by more than this (of 255)
MAX_CROP = 0.2  # a copy may have lost up to this share of one side (checked through the content-box shapes)
PROPOSE_BITS = 14  # hash distance (of 64 bits) under which an evaluation image is a candidate
MAX_CANDIDATES = 64  # candidates confirmed per image, nearest first (bounds the cost on near-identical sets)
PAIRS_AT_ONCE = 1 << 22  # image x index pairs whose hash distances are held at once (~40 MB of temporaries)
# Pairs gated at once (~1 MB a temporary). Not more: a worker gating its batch (~440 pairs against 10,000
# evaluation images) in one block spent 118 us a pool image in the gate and 51 in the proposal, in blocks of 256
# 70 and 27 (measured in process_images, CPU time): temporaries of several MB cost more than the arithmetic.
GATE_AT_ONCE = 256
STRONG_DIFFERENCE = 48  # per-channel difference (of 255) that counts as a real one, after a light blur
SEARCH_BELOW = 100  # solid pixels under which a pair is worth the alignment search (above: no nudge helps)
MAX_SOLID_PIXELS = 8  # of THUMB x THUMB: a copy leaves at most this many (0.2%); other images leave dozens
BASE_SIDE = 256  # every measurement is taken on a copy at most this size on its long side
# Part of the prepared pool's fingerprint and of the signature cache's folder: a new version re-runs
# decontamination. 2: images reduced by an integer factor (Image.reduce, JPEG decoded at reduced size), the content
# hash read off the thumbnail, and the TINY averages the gate compares. 3: hashes, content box and TINY averages
# measured on the copy under twice WORK_SIDE = 64 (it was 128), no longer read off the confirmation thumbnail,
# which is made only for a compared image.
SIGNATURE_VERSION = 3


def _dct_matrix(n: int) -> np.ndarray:
    k = np.arange(n)[:, None]
    i = np.arange(n)[None, :]
    m = np.cos(np.pi * (2 * i + 1) * k / (2 * n)) * np.sqrt(2 / n)
    m[0] /= np.sqrt(2)
    return m


_DCT8 = _dct_matrix(HASH_SIDE)[:8]  # only the 8 lowest frequencies are kept: 8 rows of the DCT are enough


class ImageSignature:
    """What the index keeps of an image: two hashes, the content box's shape, its TINY x TINY averages and a small
    thumbnail, kept sharp. The thumbnail is made when first asked for, and blurred when first compared: few images
    are (a pool image only for a candidate that passes the gate, an evaluation image only when it is such a
    candidate), and the two cost about as much as the rest of a signature (~35 us of PIL's resize to THUMB x THUMB,
    ~0.1 ms of its GaussianBlur), so a pool image is signed without them and evaluation images are cached unblurred."""

    __slots__ = ("hash_whole", "hash_content", "aspect", "tiny", "_sharp", "_blurred")

    def __init__(self, hash_whole: int, hash_content: int, aspect: float, tiny: bytes, sharp):
        self.hash_whole = hash_whole  # pHash of the whole image
        self.hash_content = hash_content  # pHash of the content box
        self.aspect = aspect  # width / height of the content box, in the image's pixels
        self.tiny = tiny  # TINY x TINY x 3 uint8: area averages of the content box
        # The THUMB x THUMB thumbnail, unblurred: bytes, or (image, content box) to make it from.
        self._sharp = sharp
        self._blurred: bytes | None = None

    @property
    def sharp(self) -> bytes:
        """THUMB x THUMB x 3 uint8: the content box, stretched (what an index's thumbs.u8 holds)."""
        if not isinstance(self._sharp, bytes):
            image, box = self._sharp
            self._sharp = image.resize((THUMB, THUMB), Image.Resampling.BOX, box=box).tobytes()
        return self._sharp

    def packed(self) -> ImageSignature:
        """Itself, as bytes only (before it is sent to another process)."""
        self.sharp  # noqa: B018 -- the property makes it
        return self

    @property
    def thumb(self) -> bytes:
        """THUMB x THUMB x 3 uint8: the content box, stretched, lightly blurred (what `compare` compares)."""
        if self._blurred is None:
            self._blurred = _view(self.sharp).filter(ImageFilter.GaussianBlur(0.7)).tobytes()
        return self._blurred


def _trims(flags: np.ndarray) -> tuple[int, int]:
    """How many entries are True from the start, and from the end."""
    mixed = np.flatnonzero(~flags)
    return (int(mixed[0]), len(flags) - 1 - int(mixed[-1])) if mixed.size else (len(flags), len(flags))


def content_box(pixels: np.ndarray) -> tuple[int, int, int, int]:
    """(left, top, right, bottom) of `pixels` (H x W x 3, uint8) once uniform borders are trimmed, again and again
    (a letterbox bar, then a plain background). An image that is uniform all over keeps its full box.

    A border line is uniform when BORDER_UNIFORM_SHARE of its pixels are within BORDER_TOLERANCE of the median
    colour of the side's first line. Vectorised: the four sides of a plain background share one reference colour,
    and so does the next round's (its first lines are mostly background too), so one map of the pixels close to
    that colour answers every side of every round."""
    a = np.asarray(pixels, dtype=np.uint8)
    planes = a.transpose(2, 0, 1).copy()  # contiguous planes: numpy compares them ~50x faster than along an axis of 3
    # Reference colour (doubled) -> map of the pixels within tolerance, as float32 0/1: a line's count is a matrix
    # product with ones (exact below 2**24), ~3x cheaper than np.count_nonzero along an axis.
    close_to: dict[tuple, np.ndarray] = {}
    left, top, right, bottom = 0, 0, a.shape[1], a.shape[0]
    while True:
        inner = a[top:bottom, left:right]
        height, width = inner.shape[:2]
        # Twice the median colour of each side's first line (an integer, half-way medians included): top, bottom,
        # left, right.
        lines = np.sort(inner[[0, -1]], axis=1).astype(np.int16)
        doubled = (lines[:, (width - 1) // 2] + lines[:, width // 2]).tolist()
        lines = np.sort(inner[:, [0, -1]], axis=0).astype(np.int16)
        doubled += (lines[(height - 1) // 2] + lines[height // 2]).tolist()
        found: dict[tuple, tuple] = {}
        for key in map(tuple, doubled):
            if key in found:
                continue
            close = close_to.get(key)
            if close is None:
                # |x - m| <= BORDER_TOLERANCE for a median m: x in [lo, hi]; x - lo wraps around (uint8) below lo.
                for plane, twice in zip(planes, key):
                    lo = max(0, -(-(twice - 2 * BORDER_TOLERANCE) // 2))
                    hi = min(255, (twice + 2 * BORDER_TOLERANCE) // 2)
                    within = (plane - np.uint8(lo)) <= np.uint8(hi - lo)
                    close = within if close is None else close & within
                close = close_to[key] = close.astype(np.float32)
            close = close[top:bottom, left:right]
            found[key] = (_trims(close @ np.ones(width, np.float32) >= BORDER_UNIFORM_SHARE * width),
                          _trims(np.ones(height, np.float32) @ close >= BORDER_UNIFORM_SHARE * height))
        t, b, lft, rgt = (found[tuple(doubled[0])][0][0], found[tuple(doubled[1])][0][1],
                          found[tuple(doubled[2])][1][0], found[tuple(doubled[3])][1][1])
        if (t, b, lft, rgt) == (0, 0, 0, 0) or t + b >= height - 1 or lft + rgt >= width - 1:
            return left, top, right, bottom
        left, top, right, bottom = left + lft, top + t, right - rgt, bottom - b


def _phashes(greys: list[Image.Image]) -> list[int]:
    """pHashes of HASH_SIDE x HASH_SIDE grey images, all in one product (a batch's images cost ~1 us each, one
    image alone ~10 us)."""
    small = np.stack([np.asarray(g, dtype=np.float32) for g in greys])
    low = (_DCT8 @ small @ _DCT8.T).reshape(len(greys), 64)
    # Against the median of the 63 terms after the DC term, which says only how bright the image is.
    bits = low > np.partition(low[:, 1:], 31, axis=1)[:, 31:32]
    return np.packbits(bits, axis=1).view(">u8")[:, 0].tolist()


def reduction_factor(size: tuple[int, int], side: int) -> int:
    """The smallest integer factor that reduces an image of `size` to at most `side` on its long side."""
    return max(1, -(-max(size) // side))


def hashing_copy(image: Image.Image) -> Image.Image:
    """What a signature is measured on: the image in RGB, reduced by an integer factor (a box filter, as cheap as it
    gets) to at most BASE_SIDE on its long side; the image itself when it is that already. A batch waiting to be
    signed holds these, not the decoded images: 32 photos of 12 megapixels would hold over 1 GB."""
    if image.mode != "RGB":
        image = image.convert("RGB")
    factor = reduction_factor(image.size, BASE_SIDE)
    return image.reduce(factor) if factor > 1 else image


def image_signature(image: Image.Image) -> ImageSignature:
    """The signature of one decoded image: `image_signatures` of a list of one."""
    return image_signatures([image])[0]


def image_signatures(images: list[Image.Image]) -> list[ImageSignature]:
    """The signatures of decoded images (of any mode; a JPEG may be decoded at reduced size already, see
    `decode_for_hashing`). Each is measured on its `hashing_copy`, and everything but the confirmation thumbnail
    on a copy reduced again, to under twice WORK_SIDE: the content box, the whole image's and the content box's HASH_SIDE x
    HASH_SIDE greys and the TINY averages. Hashing reads only the 8 x 8 lowest frequencies and the gate 8 x 8
    cells, which that many pixels hold; the confirmation thumbnail, made only when an image is compared, is cut
    from the larger copy. The hashes of all the images are computed in one product."""
    made, greys = [], []
    for image in images:
        image = hashing_copy(image)
        scale = max(1, max(image.size) // WORK_SIDE)
        work = image if scale == 1 else image.reduce(scale)
        box = content_box(np.asarray(work))
        # In the larger copy's pixels; the last row or column of a reduced copy may stand for fewer than `scale`.
        width, height = image.size
        large = (box[0] * scale, box[1] * scale, min(box[2] * scale, width), min(box[3] * scale, height))
        content = work.resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX, box=box)
        # Reduced first while both sides stay at least HASH_SIDE: a box filter twice, ~2x cheaper than once.
        first = max(1, min(work.size) // HASH_SIDE)
        whole = (work if first == 1 else work.reduce(first)).resize((HASH_SIDE, HASH_SIDE), Image.Resampling.BOX)
        greys += [whole.convert("L"), content.convert("L")]
        made.append(((large[2] - large[0]) / (large[3] - large[1]), content.reduce(HASH_SIDE // TINY).tobytes(),
                     (image, large)))
    hashes = _phashes(greys) if greys else []
    return [ImageSignature(hashes[2 * n], hashes[2 * n + 1], aspect, tiny, sharp)
            for n, (aspect, tiny, sharp) in enumerate(made)]


def decode_for_hashing(data: bytes) -> Image.Image:
    """The image in `data`, decoded only as large as hashing needs: a JPEG at 1/2, 1/4 or 1/8 of its size in
    the decoder (Image.draft), as long as it stays at least BASE_SIDE on its long side; turned upright by its EXIF
    orientation, as prepare turns pool images before it signs them."""
    import io

    from PIL import ImageOps

    image = Image.open(io.BytesIO(data))
    if image.format == "JPEG" and max(image.size) > 2 * BASE_SIDE:
        scale = max(image.size) / BASE_SIDE
        image.draft(image.mode, (max(1, int(image.width / scale)), max(1, int(image.height / scale))))
    image.load()
    return ImageOps.exif_transpose(image)


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
    # Samples by (image, box): a nudge moves one edge of one box, so the other image's sample is reused (half the
    # resampling of the search), and so is every start's whole box.
    samples: dict[tuple, np.ndarray] = {}

    def sampled(which: int, box: list[float]) -> np.ndarray:
        key = (which, *box)
        if key not in samples:
            samples[key] = _sample(ib if which else ia, box, coarse)
        return samples[key]

    def cost(box_a, box_b):
        return float(np.abs(sampled(0, box_a) - sampled(1, box_b)).mean())

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


# ------------------------------------------------------------------------------------------ the gate


def _cell_weights(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Area weights (..., GATE_CELLS, TINY) that average the TINY grid over GATE_CELLS equal cells of [lo, hi]
    (TINY-grid units, arrays of any shape)."""
    edges = lo[..., None] + (hi - lo)[..., None] * (np.arange(GATE_CELLS + 1) / GATE_CELLS)
    source = np.arange(TINY)
    overlap = np.clip(np.minimum(edges[..., 1:, None], source + 1) - np.maximum(edges[..., :-1, None], source), 0,
                      None)
    return overlap / overlap.sum(axis=-1, keepdims=True)


def gate(tiny_a: np.ndarray, aspect_a: np.ndarray, tiny_b: np.ndarray, aspect_b: np.ndarray) -> np.ndarray:
    """For k pairs of images (their TINY averages, (k, TINY*TINY*3) uint8, and content-box shapes, (k,)), the
    largest difference between GATE_CELLS x GATE_CELLS cell averages of the two content boxes, aligned as
    `compare` starts them (a side the shapes say was cut taken from the other image at either end), at the best of
    those alignments.

    Averages over cells of an eighth of the box do not see what tells a copy from its original (edges, JPEG
    ringing, resampling, a pixel of misalignment all average out: on demo scenes the promised copies reach 63 at
    most), while another scene differs there by a whole object, one where the other has background (99% of the
    unrelated candidates the hashes propose differ by over 100).
    So the gate only ever rejects; what passes it is decided by `compare`, ~100x dearer a pair."""
    ratio = aspect_a / aspect_b
    same = np.abs(np.log(ratio)) < 0.01  # `_starts` has one start for these, both boxes whole: no resampling
    out = np.empty(len(ratio), dtype=np.float32)
    if same.any():
        out[same] = np.abs(_cells(tiny_a[same]) - _cells(tiny_b[same])).max(axis=(1, 2, 3))
    if not same.all():
        out[~same] = _aligned(tiny_a[~same], tiny_b[~same], ratio[~same])
    return out


def _cells(tiny: np.ndarray) -> np.ndarray:
    """(k, 3, GATE_CELLS, GATE_CELLS) cell averages of k TINY averages."""
    planes = tiny.reshape(-1, TINY, TINY, 3).astype(np.float32)
    rows = planes[:, 0::2] + planes[:, 1::2]  # pairs averaged by slicing: .mean over a short axis is ~10x slower
    return ((rows[:, :, 0::2] + rows[:, :, 1::2]) / 4).transpose(0, 3, 1, 2)


def _aligned(tiny_a: np.ndarray, tiny_b: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """`gate` for pairs whose shapes differ: the best of the four starts.

    `_starts`, vectorised. In each start one image is cut along one axis and the other is whole. Of a pair, one
    image is the one cut in x (where a is relatively taller, b) and the other the one cut in y, each against the
    other whole, as cells. The cut one has its other axis paired into cells and the cut axis averaged over the kept
    part at either end: one matrix product a pair, both starts at once ((2 x GATE_CELLS, TINY) weights against
    (TINY, GATE_CELLS x 3)), with the data laid out so that every array's last axes are contiguous; the largest
    cell difference does not depend on the orientation, so the cells are compared as they come. (~1.5x cheaper
    than products per channel and start, with each pair's orientation chosen by np.where after computing both.)"""
    k = len(ratio)
    kept = np.where(ratio < 1, ratio, 1 / ratio)
    wide = (ratio < 1)[:, None, None, None]
    a, b = tiny_a.reshape(k, TINY, TINY, 3), tiny_b.reshape(k, TINY, TINY, 3)  # [y, x, channel]
    cut_x, cut_y = np.where(wide, b, a).astype(np.float32), np.where(wide, a, b).astype(np.float32)
    rows = (cut_x[:, 0::2] + cut_x[:, 1::2]) / 2  # (k, GATE_CELLS, TINY, 3): rows paired (exact: halves)
    columns = (cut_y[:, :, 0::2] + cut_y[:, :, 1::2]) / 2  # (k, TINY, GATE_CELLS, 3)
    cells_x = (rows[:, :, 0::2] + rows[:, :, 1::2]) / 2  # (k, GATE_CELLS, GATE_CELLS, 3)
    cells_y = (columns[:, 0::2] + columns[:, 1::2]) / 2
    offsets = np.stack([np.zeros(k), 1.0 - kept], axis=1)  # (k, 2): the kept part at one end, at the other
    weights = _cell_weights(offsets * TINY, (offsets + kept[:, None]) * TINY).astype(np.float32).reshape(
        k, 2 * GATE_CELLS, TINY)
    shape = (k, 2, GATE_CELLS, GATE_CELLS, 3)
    averaged_x = (weights @ rows.transpose(0, 2, 1, 3).reshape(k, TINY, -1)).reshape(shape)  # [start, x, y, c]
    averaged_y = (weights @ columns.reshape(k, TINY, -1)).reshape(shape)  # [start, y, x, c]
    worst_x = np.abs(averaged_x - cells_y.transpose(0, 2, 1, 3)[:, None]).max(axis=(2, 3, 4))  # (k, 2)
    worst_y = np.abs(averaged_y - cells_x[:, None]).max(axis=(2, 3, 4))
    return np.minimum(worst_x, worst_y).min(axis=1)


# ------------------------------------------------------------------------------------------ the index


_BITS_IN_BYTE = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


def _bit_counts(values: np.ndarray) -> np.ndarray:
    """Set bits of each uint64: np.bitwise_count where numpy has it (2.0 on), else a byte table."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(values)
    return _BITS_IN_BYTE[values.view(np.uint8)].reshape(*values.shape, 8).sum(axis=-1, dtype=np.uint8)


def hash_distances(hashes: np.ndarray, value: int) -> np.ndarray:
    """Bits that differ between `value` and each of `hashes` (uint64)."""
    return _bit_counts(hashes ^ np.uint64(value)).astype(np.int32)


def _memmap(path: str, n: int, width: int) -> np.ndarray:
    if not n:  # np.memmap refuses an empty file
        return np.zeros((0, width), dtype=np.uint8)
    return np.memmap(path, dtype=np.uint8, mode="r", shape=(n, width))


class ImageIndex:
    """Signatures of the evaluation images: hashes and shapes in memory (17 bytes an image); TINY averages (768
    bytes) and sharp thumbnails (12 KB) in files read through memory maps, paged in only for candidates (a map is shared
    by every worker through the page cache). Image workers open it by path, once per process."""

    def __init__(self, hash_whole: np.ndarray, hash_content: np.ndarray, aspect: np.ndarray, tiny: np.ndarray,
                 thumbs: np.ndarray):
        self.hash_whole, self.hash_content, self.aspect, self.tiny, self.thumbs = (
            hash_whole, hash_content, aspect, tiny, thumbs)
        self.log_aspect = np.log(aspect)

    def __len__(self) -> int:
        return len(self.aspect)

    @staticmethod
    def write(directory, signatures: list[ImageSignature]) -> None:
        os.makedirs(directory, exist_ok=True)
        np.savez(os.path.join(directory, "hashes.npz"),
                 hash_whole=np.array([s.hash_whole for s in signatures], dtype=np.uint64),
                 hash_content=np.array([s.hash_content for s in signatures], dtype=np.uint64),
                 aspect=np.array([s.aspect for s in signatures], dtype=np.float64))
        with open(os.path.join(directory, "tiny.u8"), "wb") as f:
            for s in signatures:
                f.write(s.tiny)
        with open(os.path.join(directory, "thumbs.u8"), "wb") as f:
            for s in signatures:
                f.write(s.sharp)

    @staticmethod
    def combine(directory, parts: list[tuple[ImageIndex, list[int]]]) -> None:
        """Write into `directory` the index of the given positions of each part, in order; a few thousand images'
        thumbnails in memory at a time."""
        os.makedirs(directory, exist_ok=True)
        np.savez(os.path.join(directory, "hashes.npz"), **{name: np.concatenate(
            [getattr(index, name)[taken] for index, taken in parts]) for name in ("hash_whole", "hash_content",
                                                                               "aspect")})
        for name, field in (("tiny.u8", "tiny"), ("thumbs.u8", "thumbs")):
            with open(os.path.join(directory, name), "wb") as f:
                for index, taken in parts:
                    for start in range(0, len(taken), 4096):
                        f.write(getattr(index, field)[taken[start : start + 4096]].tobytes())

    @classmethod
    def open(cls, directory) -> ImageIndex:
        with np.load(os.path.join(directory, "hashes.npz")) as npz:  # each array read once (an NpzFile reads on [])
            arrays = {name: npz[name] for name in ("hash_whole", "hash_content", "aspect")}
        n = len(arrays["aspect"])
        return cls(**arrays, tiny=_memmap(os.path.join(directory, "tiny.u8"), n, TINY * TINY * 3),
                   thumbs=_memmap(os.path.join(directory, "thumbs.u8"), n, THUMB * THUMB * 3))

    def candidates(self, sig: ImageSignature) -> np.ndarray:
        """Evaluation images a copy of `sig` could be by their hashes and shapes, nearest first."""
        return self._proposed([sig])[1]

    def _proposed(self, sigs: list[ImageSignature]) -> tuple[np.ndarray, np.ndarray]:
        """(position in `sigs`, evaluation image) of every proposed pair, by image, then nearest hash first, then
        index order. Vectorised over blocks of images x the whole index (PAIRS_AT_ONCE pairs at a time)."""
        whole = np.array([s.hash_whole for s in sigs], dtype=np.uint64)[:, None]
        content = np.array([s.hash_content for s in sigs], dtype=np.uint64)[:, None]
        log_aspect = np.log(np.array([s.aspect for s in sigs], dtype=np.float64))[:, None]
        mine, theirs, distances = [], [], []
        step = max(1, PAIRS_AT_ONCE // max(1, len(self)))
        for start in range(0, len(sigs), step):
            block = slice(start, start + step)
            distance = np.minimum(_bit_counts(whole[block] ^ self.hash_whole),
                                  _bit_counts(content[block] ^ self.hash_content))
            i, j = np.nonzero(distance <= PROPOSE_BITS)
            # The shapes only for the pairs the hashes propose: a float matrix the size of the block costs more.
            shaped = np.abs(self.log_aspect[j] - log_aspect[start + i, 0]) <= -np.log(1 - MAX_CROP)
            i, j = i[shaped], j[shaped]
            mine.append(i + start)
            theirs.append(j)
            distances.append(distance[i, j])
        mine, theirs, distance = (np.concatenate(x) for x in (mine, theirs, distances))
        order = np.lexsort((theirs, distance, mine))
        return mine[order], theirs[order]

    def match(self, sig: ImageSignature) -> int | None:
        """The first evaluation image (by index) that `sig` is a copy of, nearest hash first; None if none."""
        return self.match_many([sig])[0]

    def match_many(self, sigs: list[ImageSignature]) -> list[int | None]:
        """For each signature, the first evaluation image it is a copy of, None if none: of the candidates its
        hashes propose (nearest first), those the gate passes, the first MAX_CANDIDATES of them confirmed by
        `is_copy` one by one. A batch at a time: proposal and gate are vectorised over all its pairs."""
        out: list[int | None] = [None] * len(sigs)
        if not sigs or not len(self):
            return out
        mine, theirs = self._proposed(sigs)
        if not mine.size:
            return out
        tiny_a = np.frombuffer(b"".join(s.tiny for s in sigs), dtype=np.uint8).reshape(len(sigs), -1)
        aspect_a = np.array([s.aspect for s in sigs], dtype=np.float64)
        passed = np.concatenate([
            gate(tiny_a[mine[block]], aspect_a[mine[block]], self.tiny[theirs[block]], self.aspect[theirs[block]])
            <= GATE_MAX for block in (slice(i, i + GATE_AT_ONCE) for i in range(0, len(mine), GATE_AT_ONCE))])
        mine, theirs = mine[passed], theirs[passed]
        tried: dict[int, int] = {}
        others: dict[int, ImageSignature] = {}  # an evaluation image several pool images reach is blurred once
        for position, i in zip(mine.tolist(), theirs.tolist()):
            if out[position] is not None or tried.get(position, 0) >= MAX_CANDIDATES:
                continue
            tried[position] = tried.get(position, 0) + 1
            if i not in others:
                others[i] = ImageSignature(int(self.hash_whole[i]), int(self.hash_content[i]), float(self.aspect[i]),
                                           self.tiny[i].tobytes(), self.thumbs[i].tobytes())
            if is_copy(sigs[position], others[i]):
                out[position] = i
        return out


_OPEN_INDEX: dict[tuple, ImageIndex] = {}


def open_index(directory: str) -> ImageIndex:
    """The index at `directory`, opened once per process (image workers live for the whole prepare run). Keyed
    by the index file's identity too: a later prepare in the same process rebuilds the index at the same path."""
    stat = os.stat(os.path.join(directory, "hashes.npz"))
    key = (directory, stat.st_ino, stat.st_mtime_ns, stat.st_size)
    if key not in _OPEN_INDEX:
        _OPEN_INDEX.clear()  # one run's index at a time
        _OPEN_INDEX[key] = ImageIndex.open(directory)
    return _OPEN_INDEX[key]
