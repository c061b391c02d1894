"""Engine roles and routing outcomes are typed values (`rsgen.engine.Role`, `rsgen.emit.splits.Via` and
`SamplePath`, all `rsgen.records.Name`): code compares members, never the words, so a misspelt word cannot
silently compare unequal. The words stay what files hold (stats.json, work records)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import rsgen
from rsgen.emit.splits import SamplePath, Via
from rsgen.engine import ROLES, Role

WORDS = {role.value for role in Role} | {via.value for via in Via} | {path.value for path in SamplePath}
WORDS -= {"rejected"}  # also the name of a dataset split kind (`kind == "rejected"`), which is not a routing word


def _word_comparisons(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        words = []
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else [side]
            words += [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
        if set(words) & WORDS:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_role_or_routing_word_is_compared_as_a_string():
    package = Path(rsgen.__file__).parent
    found = [f"{path.relative_to(package.parent)}:{hit}" for path in sorted(package.rglob("*.py"))
             for hit in _word_comparisons(ast.parse(path.read_text()))]
    assert not found, "compare the typed member instead:\n" + "\n".join(found)


def test_the_scan_finds_a_string_comparison():
    assert _word_comparisons(ast.parse('if role == "judge": pass\nif via in ("verifier", "x"): pass')) == [
        "1: role == 'judge'", "2: via in ('verifier', 'x')"]
    assert _word_comparisons(ast.parse("if role is Role.JUDGE: pass")) == []


def test_a_member_is_its_word_in_files_and_lookups():
    assert ROLES == ("generate", "explore", "judge") and Role("judge") is Role.JUDGE
    assert json.dumps({Via.JUDGE: [SamplePath.DECISIVE]}) == '{"judge": ["decisive"]}'
    assert f"{Role.EXPLORE}" == "explore" and str(Via.VERIFIER) == "verifier"
    assert {SamplePath.DECISIVE: 3}.get("decisive") == 3  # stats read counts by the word
