"""docs/demo.md's figures about the shipped models are what `scripts/train_demo_model.py --show` prints (from the
training records the script wrote), not typed by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flags", [[], ["--base"]])
def test_the_model_figures_in_docs_are_what_show_prints(flags):
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_demo_model.py"), "--show", *flags],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    printed = out.stdout.strip()
    assert "run 1: from scratch" in printed and "evaluation (pool seed" in printed, printed
    docs = (ROOT / "docs" / "demo.md").read_text()
    assert f"```\n{printed}\n```" in docs, printed
