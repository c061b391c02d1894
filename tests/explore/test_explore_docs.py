"""docs/explore.md's pass-rate tables are what `rsgen run --config recipes/demo.yaml --explore_samples 4
--explore_temperature 1.0` prints when the explore pass ends: the fast form (the demo pool cut to 10 images) in the
fast tier, the acceptance run (300 images) in the slow tier; not typed by hand."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rsgen.demo_command import RECIPE
from rsgen.explore.stage import explore_summary, format_summary

ROOT = Path(__file__).resolve().parents[2]
HEADER = format_summary(explore_summary([])).splitlines()[0]
COMMAND = ["run", "--explore_samples", "4", "--explore_temperature", "1.0"]


def printed_table(log: str) -> str:
    """The explore pass's closing table as logged (`[rsgen.explore.stage] ` before its header) through the `total`
    line."""
    lines = log.splitlines()
    start = lines.index(f"[rsgen.explore.stage] {HEADER}")
    end = next(i for i in range(start, len(lines)) if lines[i].startswith("total "))
    return "\n".join(lines[start:end + 1])


def explore_table(tmp_path: Path, num_images: int | None) -> str:
    """The table the command prints, on the demo recipe as shipped or with its pool cut to `num_images`."""
    raw = yaml.safe_load(RECIPE.read_text())
    if num_images is not None:
        raw["sources"][0]["demo_num_images"] = num_images
    recipe = tmp_path / "demo.yaml"
    recipe.write_text(yaml.safe_dump(raw))
    out = subprocess.run([sys.executable, "-m", "rsgen", *COMMAND, "--config", str(recipe),
                          "--output_dir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    table = printed_table(out.stderr)  # rsgen's log messages go to stderr
    assert all(family in table for family in ("CLEVRMath", "DemoChart", "DemoMC")), table
    return table


def columns(table: str, upto: int) -> list[list[str]]:
    return [line.split()[:upto] for line in table.splitlines()[1:]]


def test_the_fast_forms_table_in_docs_is_what_it_prints(tmp_path):
    """Families and questions on every install. The sampled columns depend on the installed torch's sampling
    kernels (the declared floors draw other samples: 169 samples, 6 paired where the latest releases give 164, 9),
    so they are compared exactly in the slow tier, which runs on the latest releases."""
    docs = (ROOT / "docs" / "explore.md").read_text()
    assert "`demo_num_images: 10`" in docs
    table = explore_table(tmp_path, 10)
    quoted = printed_table(docs[docs.index("`demo_num_images: 10`"):])
    assert quoted.splitlines()[0] == table.splitlines()[0]
    assert columns(quoted, 2) == columns(table, 2), table


@pytest.mark.slow
def test_the_fast_forms_sampled_figures_in_docs_are_what_it_prints(tmp_path):
    docs = (ROOT / "docs" / "explore.md").read_text()
    table = explore_table(tmp_path, 10)
    assert f"```\n{table}\n```" in docs, table


@pytest.mark.slow
def test_the_acceptance_runs_table_in_docs_is_what_it_prints(tmp_path):
    docs = (ROOT / "docs" / "explore.md").read_text()
    assert "`rsgen run --config recipes/demo.yaml --explore_samples 4 --explore_temperature 1.0`" in docs
    table = explore_table(tmp_path, None)
    assert f"```\n{table}\n```" in docs, table
