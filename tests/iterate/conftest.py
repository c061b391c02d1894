"""Iterate tests use emit's scripted output directories (tests/emit/emit_helpers.py) as the rounds' work."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emit"))
