"""Bounded-memory grouping of the prepared pool by image (the shards are written by `rsgen.shards`).

Grouping QA pairs by image without holding the pool in memory is an external sort: every QA pair (text and the
location of its image in the pack file, never the image itself) is keyed by (family, image sha256) and sorted
in runs of bounded size; merging the runs yields each image's QA pairs together, in (family, sha256) order, the
same order on every run. A handful of run files, not one file per bucket or image: creating many small files
is slow on ordinary disks.
"""

from __future__ import annotations

import heapq
import json
import os
from collections.abc import Iterator
from pathlib import Path

KEY_END = "\x1f"  # separates a sort key from the record; never inside a key (keys are family names and hex)


class ExternalSorter:
    """Sort records larger than memory: buffer up to `max_buffer_bytes`, write each full buffer as a sorted run
    file, then merge the runs in one streaming pass. Records come back in key order (ties in insertion order)."""

    def __init__(self, directory: str | os.PathLike, max_buffer_bytes: int = 8 << 20):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_buffer_bytes = max_buffer_bytes
        self._lines: list[str] = []
        self._buffered = 0
        self._runs: list[Path] = []
        self._count = 0

    def add(self, key: str, record: dict) -> None:
        # The key leads the line, so sorting lines sorts records; a counter keeps equal keys in arrival order.
        line = f"{key}{KEY_END}{self._count:012d}{KEY_END}{json.dumps(record, ensure_ascii=False, separators=(',', ':'))}\n"
        self._count += 1
        self._lines.append(line)
        self._buffered += len(line)
        if self._buffered >= self.max_buffer_bytes:
            self._write_run()

    def _write_run(self) -> None:
        if not self._lines:
            return
        self._lines.sort()
        path = self.directory / f"run-{len(self._runs):05d}.txt"
        with open(path, "w", encoding="utf-8") as f:
            f.writelines(self._lines)
        self._runs.append(path)
        self._lines = []
        self._buffered = 0

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        """(key, record) in key order."""
        if not self._runs:  # everything fit in memory: no need to touch the disk
            self._lines.sort()
            lines: Iterator[str] = iter(self._lines)
            files = []
        else:
            self._write_run()
            files = [open(p, encoding="utf-8") for p in self._runs]
            lines = heapq.merge(*files)
        try:
            for line in lines:
                key, _, rest = line.partition(KEY_END)
                yield key, json.loads(rest.partition(KEY_END)[2])
        finally:
            for f in files:
                f.close()
