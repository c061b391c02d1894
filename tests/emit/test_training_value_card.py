"""The card's "What the data is worth" section: bench/bench_training_value.py writes its table into its round 0
run (OUTPUT_DIR/training_value.json), emit puts it in stats.json and the card shows it whole: every line, the
held-out size, the command, commit, date, wall time and load. A table missing any of it fails emit."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from emit_helpers import scripted_recipe, write_scripted_run

from rsgen.emit import render_card, run_emit
from rsgen.emit.splits import EmitError
from rsgen.layout import OutputLayout

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

SECTION = "## What the data is worth"


def _held(qa: int, right: range, verifier: int) -> dict:
    return {"qa": qa, "truth_rate": len(right) / qa, "verifier_rate": verifier / qa, "right_ids": list(right)}


def small_table() -> dict:
    """The bench's own record (`training_value_record`) of a small made-up table of three lines."""
    from bench_training_value import training_value_record, training_value_table

    base = _held(400, range(100), 60)
    lines = [("base", "-", 0, base),
             ("SFT, official answers", "1800 pairs", 64, _held(400, range(80), 50)),  # lost 20 of the base's
             ("STaR round 1 + DPO (on-policy)", "533 + 612 DPO pairs", 128, _held(400, range(50, 180), 72))]
    table = training_value_table(lines, base, "accepted", one_round=False)
    return training_value_record(lines, base, table, 754.0, ["--num-images", "400"], 100, "abc1234")


def test_the_card_shows_the_measured_table_with_its_size_commit_and_date(tmp_path):
    write_scripted_run(tmp_path)
    value = small_table()
    OutputLayout(tmp_path).training_value.write_text(json.dumps(value))
    run_emit(scripted_recipe(tmp_path))
    layout = OutputLayout(tmp_path)
    card = (layout.dataset / "README.md").read_text()
    assert json.loads(layout.stats_json.read_text())["training_value"] == value
    assert SECTION in card, "the card lacks the section of what the data is worth"
    section = card.split(SECTION, 1)[1].split("\n## ", 1)[0]
    assert ("Measured by `python bench/bench_training_value.py --num-images 400` (commit `abc1234`, "
            f"{value['date']}; 12.6 minutes; load average ") in section
    assert "same held-out slice of 400 QA pairs (100 images no line trained on)" in section
    rows = [line for line in section.splitlines() if line.startswith("| ")][1:]
    # paired se: 20 lost of 400 -> sqrt((20 - 20**2/400) / (400 * 399)) = 1.1 points; 80 gained and 50 lost -> 2.8
    assert rows == ["| base | - | 0 | 15.0% | 25.0% | – | – |",
                    "| SFT, official answers | 1800 pairs | 64 | 12.5% | 20.0% | -5.0 ± 2.9 | 1.1 |",
                    "| STaR round 1 + DPO (on-policy) | 533 + 612 DPO pairs | 128 | 18.0% | 32.5% | +7.5 ± 3.2 | 2.8 |"]
    for note in value["notes"]:
        assert note in section
    # `rsgen card` re-renders from stats.json alone: the same section.
    render_card(tmp_path)
    assert section in (layout.dataset / "README.md").read_text()


def test_a_run_without_the_table_has_no_section(emitted_run):
    layout = OutputLayout(emitted_run[0])
    assert SECTION not in (layout.dataset / "README.md").read_text()
    assert "training_value" not in json.loads(layout.stats_json.read_text())


@pytest.mark.parametrize("broken, named", [
    (lambda v: v.pop("commit"), "commit"),
    (lambda v: v["held_out"].pop("qa"), "held_out.qa"),
    (lambda v: v["lines"][1].pop("truth_rate"), r"lines\[1\].truth_rate"),
    (lambda v: v.update(lines=[]), "lines"),
])
def test_a_table_missing_a_figure_fails_emit_naming_it(tmp_path, broken, named):
    write_scripted_run(tmp_path)
    value = small_table()
    broken(value)
    OutputLayout(tmp_path).training_value.write_text(json.dumps(value))
    with pytest.raises(EmitError, match=f"lacks .*{named}.*bench_training_value.py"):
        run_emit(scripted_recipe(tmp_path))
    assert not OutputLayout(tmp_path).dataset.exists()  # nothing written: checked before the card


def test_a_table_that_is_not_json_fails_emit(tmp_path):
    write_scripted_run(tmp_path)
    OutputLayout(tmp_path).training_value.write_text("{not json")
    with pytest.raises(EmitError, match="not readable JSON"):
        run_emit(scripted_recipe(tmp_path))
