"""A module of rsgen over 500 lines says at its top why it is one module (#37): its docstring holds a paragraph
"Longer than most modules (~N lines)...", with N within 10% of its length, so the reason is read where the length
is felt and is kept up to date with it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import rsgen

LIMIT = 500
PACKAGE = Path(rsgen.__file__).parent


def test_every_module_over_500_lines_gives_its_reason_at_its_top():
    missing, stale = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines <= LIMIT:
            continue
        name = path.relative_to(PACKAGE.parent).as_posix()
        found = re.search(r"Longer than most modules \(~(\d+) lines\)", ast.get_docstring(ast.parse(text)) or "")
        if not found:
            missing.append(f"{name} ({lines} lines)")
        elif abs(int(found.group(1)) - lines) > 0.1 * lines:
            stale.append(f"{name}: says ~{found.group(1)}, has {lines}")
    assert not missing, "modules over 500 lines without a reason at their top: " + ", ".join(missing)
    assert not stale, "reasons that quote a stale length: " + "; ".join(stale)
