"""Running a bench/ command's fast form as a test does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run_fast_bench(script: str, out: Path, table_name: str) -> str:
    """`python bench/SCRIPT --fast --output-dir OUT` with one torch thread (several oversubscribe a shared machine);
    returns the table it wrote, after checking it printed the same."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--fast", "--output-dir", str(out)],
                          cwd=out.parent, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    table = (out / table_name).read_text().rstrip("\n")
    assert table in proc.stdout
    return table
