"""The held-out slice of `rsgen iterate`: a fixed share of each family's images, measured every round and never
trained on.

Chosen by image, not by QA pair: an image's other questions would otherwise teach the model what it is later
measured on. The choice is a hash order of the image sha256, so it depends on nothing but the images themselves:
not on the pool's row order, the process count or a random seed, and an image keeps its side when the pool grows.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from rsgen.schema import PreparedPool

_SALT = b"rsgen-iterate-held-out:"


def _order(sha: str) -> str:
    return hashlib.sha256(_SALT + sha.encode()).hexdigest()


def choose_held_out(pool: PreparedPool, fraction: float) -> set[str]:
    """The image sha256s held out: round(fraction * images) of each family's distinct images (at least one, and
    never all of a family with two or more images). An image in two families is held out in both."""
    by_family: dict[str, set[str]] = {}
    for table in pool.batches(["family", "image_sha256"], batch_size=65536):
        for family, sha in zip(table.column("family").to_pylist(), table.column("image_sha256").to_pylist()):
            by_family.setdefault(family, set()).add(sha)
    held: set[str] = set()
    for shas in by_family.values():
        if len(shas) < 2:
            continue  # one image cannot be both trained on and measured
        count = min(max(round(fraction * len(shas)), 1), len(shas) - 1)
        held.update(sorted(shas, key=_order)[:count])
    return held


def write_held_out(path: Path, held: set[str]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{sha}\n" for sha in sorted(held)), encoding="utf-8")
    tmp.replace(path)


def read_held_out(path: Path) -> set[str]:
    return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
