"""`bench/bench_explore.py` as docs/benchmarks.md quotes it (its default run: 20 demo images, about half a minute):
part 2's samples, pairs and learnable share are keyed per sample, so the same on every machine; the speeds are not
compared, only the lines they sit on."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def words(block: str) -> list[list[str]]:
    """A printed block word by word, the timed columns (seconds, responses/s, shares of time, the ratio of part 1)
    masked."""
    masked = []
    for line in block.splitlines():
        if line.startswith(("separate ", "shared ")):
            line = line.split()[0]
        elif line.startswith(("paired ", "never ")):
            line = line.rsplit(maxsplit=1)[0]  # its seconds
        masked.append(re.sub(r"^shared / separate: [\d.]+x", "shared / separate: #x", line).split())
    return masked


def printed_parts(text: str) -> list[str]:
    """Part 1 (5 lines) and part 2 (5 lines) as printed."""
    lines = text.splitlines()
    return ["\n".join(lines[i:i + 5]) for i, line in enumerate(lines) if re.match(r"1\. \d+ sampled|2\. explore on", line)]


@pytest.mark.slow
def test_docs_quote_what_the_bench_prints():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_explore.py")], cwd=ROOT,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    printed = printed_parts(proc.stdout)
    assert len(printed) == 2, proc.stdout
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    section = docs[docs.index("## Explore"):]
    quoted = printed_parts("\n".join(re.findall(r"^```\n(.*?)^```", section, flags=re.M | re.S)))
    assert [words(b) for b in quoted] == [words(b) for b in printed], proc.stdout
