"""docs/reasons.md holds every reason rsgen writes: its table is generated from the code's own lists, and those
lists hold every reason the code can write (checked against the code itself)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from rsgen.prepare.reasons import DROP_REASONS, MERGE_REASONS
from rsgen.routing import ROUTING_REASONS
from rsgen.verifiers import REASONS

ROOT = Path(__file__).resolve().parents[1]


def load_script():
    spec = importlib.util.spec_from_file_location("update_reasons_table", ROOT / "scripts" / "update_reasons_table.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_table_is_the_generated_one():
    script = load_script()
    page = (ROOT / "docs" / "reasons.md").read_text()
    assert script.reasons_markdown() in page, "docs/reasons.md is stale: run `python scripts/update_reasons_table.py`"
    for name in [*DROP_REASONS, *MERGE_REASONS, *REASONS, *ROUTING_REASONS]:
        assert f"| `{name}` |" in page, name


def _literals(folder: str, patterns: list[str]) -> set[str]:
    found = set()
    for path in (ROOT / "rsgen" / folder).glob("*.py"):
        text = path.read_text()
        for pattern in patterns:
            found.update(re.findall(pattern, text))
    return found


def test_every_prepare_reason_in_the_code_is_in_the_list():
    """Reasons written as literals where prepare makes them; `f"{what}_missing"` and the like are spelled out."""
    written = _literals("prepare", [
        r'Rejected\("(\w+)"\)', r'ImageResult\("(\w+)"', r'_BadRecord\("(\w+)"', r'row_reason = (?:row\.row_reason or )?"(\w+)"',
        r'return "(provenance_\w+)"', r'else "(provenance_\w+)"', r'return \[\], "(\w+)", \[\]', r'return None, "(\w+)", \[\]',
        r'reason = "(\w+)" if', r'report\.(?:drop|merge)\([^()]*?"(\w+)"',
        r'dropped \+= \[\(c, "(\w+)"\)',
    ])
    written |= {f"{what}_{kind}" for what in ("question", "answer") for kind in ("missing", "not_string")}
    assert len(written) > 30, sorted(written)  # the patterns find the reasons
    assert written - set(DROP_REASONS) - set(MERGE_REASONS) == set()


def test_every_verifier_and_routing_reason_is_in_the_lists():
    import rsgen.verifiers.decision as decision

    constants = {v for k, v in vars(decision).items() if k.isupper() and isinstance(v, str)}
    assert constants == set(REASONS)
    routed = _literals(".", [r'return False, "(\w+)"']) | {"judge_withheld"}
    assert routed <= set(ROUTING_REASONS) | set(REASONS)
