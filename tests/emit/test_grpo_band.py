"""`grpo_pass_rate_band: [low, high]`: the `_grpo` view keeps the questions with low < pass rate < high (both ends
strict, so the default [0, 1] is the former fixed 0 < pass rate < 1); a band that is not two numbers low < high in
[0, 1] is refused when the recipe loads, before any work; the card shows the band and the questions below, inside
and above it. (The band on a real explored demo run: tests/explore/test_explore_views.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

from rsgen.config import RecipeError, load_recipe, recipe_from_dict
from rsgen.emit.card_tables import explore_figures
from rsgen.emit.trl_views import VIEWS, grpo_rows

RATES = [0.0, 0.2, 0.25, 0.5, 0.75, 0.8, 1.0]


def explored(rates):
    return [{"question": f"q{r}", "answer": "3", "options": [], "pass_rate": r} for r in rates]


def kept(rows):
    return [row["pass_rate"] for row in rows]


def test_default_band_is_the_open_interval_zero_one():
    rows, skipped = grpo_rows({"bytes": b""}, explored(RATES))
    assert kept(rows) == [0.2, 0.25, 0.5, 0.75, 0.8]
    assert skipped == {"below_band": 1, "above_band": 1}


def test_band_keeps_exactly_the_rates_strictly_inside():
    rows, skipped = grpo_rows({"bytes": b""}, explored(RATES), (0.25, 0.75))
    assert kept(rows) == [0.5]  # 0.25 and 0.75 sit on the ends: outside
    assert skipped == {"below_band": 3, "above_band": 3}
    rows, skipped = grpo_rows({"bytes": b""}, explored(RATES), (0.0, 0.5))
    assert kept(rows) == [0.2, 0.25] and skipped == {"below_band": 1, "above_band": 4}


def test_the_view_reads_the_band_from_the_recipe(tmp_path):
    recipe = recipe_from_dict({"output_dir": str(tmp_path), "model_name_or_path": "m", "grpo_pass_rate_band": [0.1, 0.3]})
    rows, skipped = VIEWS["grpo"].rows({"bytes": b""}, explored(RATES), recipe)
    assert kept(rows) == [0.2, 0.25] and skipped == {"below_band": 1, "above_band": 4}


@pytest.mark.parametrize(("band", "says"), [
    ([0.8, 0.2], "low >= high"), ([0.5, 0.5], "low >= high"), ([-0.1, 0.5], "outside \\[0, 1\\]"),
    ([0.2, 1.5], "outside \\[0, 1\\]"), ([0.5], "must be \\[low, high\\]"), ("0.2", "must be \\[low, high\\]"),
    ([0.2, "high"], "must be \\[low, high\\]"),
])
def test_bad_band_is_refused_naming_the_value_and_the_fix(tmp_path, band, says):
    with pytest.raises(RecipeError, match=f"grpo_pass_rate_band.*{says}.*e.g. grpo_pass_rate_band: \\[0.2, 0.8\\]"):
        recipe_from_dict({"output_dir": str(tmp_path), "model_name_or_path": "m", "grpo_pass_rate_band": band})


def test_band_from_the_command_line(tmp_path):
    recipe = load_recipe("recipes/demo.yaml", {"grpo_pass_rate_band": [0.2, 0.8], "output_dir": str(tmp_path)})
    assert recipe.grpo_pass_rate_band == [0.2, 0.8]
    out = tmp_path / "refused"
    done = subprocess.run([sys.executable, "-m", "rsgen", "run", "--config", "recipes/demo.yaml", "--output_dir",
                           str(out), "--grpo_pass_rate_band", "[0.9, 0.1]"], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "grpo_pass_rate_band [0.9, 0.1] has low >= high" in done.stderr
    assert not out.exists()  # refused before any work


def test_card_shows_the_band_and_the_questions_below_inside_and_above():
    explore = {"questions": 10, "responses": 40, "explore_samples": 30, "pairs": 4, "samples_per_pair": 7.5,
               "learnable": 6, "learnable_share": 0.6, "mean_pass_rate": 0.5,
               "pass_rate_histogram": {"bins": ["0", "1"], "counts": [2, 2]},
               "grpo_band": {"below": 5, "inside": 3, "above": 2}}
    stats = {"generation": {"grpo_pass_rate_band": [0.25, 0.75]}, "families": {"CLEVRMath": {"explore": explore}}}
    figures = explore_figures(stats)
    assert figures["band"] == "0.25 < pass rate < 0.75"
    assert "| CLEVRMath | 5 | 3 | 2 |" in figures["band_table"]
    assert "below (pass rate ≤ 0.25)" in figures["band_table"] and "above (pass rate ≥ 0.75)" in figures["band_table"]
    explore["grpo_band"] = None  # the _grpo view not written: no band table
    assert explore_figures(stats)["band_table"] is None
