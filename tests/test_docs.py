"""README.md and docs/: every relative link resolves (file and heading), every page is reachable from the README,
the recipe key tables of docs/recipes.md are the ones rsgen/config.py generates, and the README's recipe loads."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from rsgen.config import RecipeConfig, SourceConfig, keys_markdown, recipe_from_dict

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def outside_code(text: str) -> str:
    """The text with fenced code blocks and inline code removed (a link there is an example, not a link)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped (but `-` and `_`), spaces to `-`."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6} (.+)$", re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S), re.M)
    return {slug(h) for h in headings}


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in LINK.findall(outside_code(page.read_text())):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        if not linked.exists():
            broken.append(f"{target}: no file {linked}")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading '#{anchor}' in {linked.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    (tmp_path / "there.md").write_text("# A heading, with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-heading-with-code) [gone](missing.md) [bad anchor](there.md#nope) "
                    "[web](https://example.com) `[code](not-a-link.md)`\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "there.md#nope"]


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    for page in PAGES[1:]:
        assert f"(docs/{page.name})" in readme, f"docs/{page.name} is not linked from README.md"


def test_recipe_key_tables_are_generated_from_the_metadata():
    page = (ROOT / "docs" / "recipes.md").read_text()
    assert keys_markdown() in page, "docs/recipes.md key tables are stale: run `python scripts/update_readme_keys.py`"
    for f in dataclasses.fields(RecipeConfig) + dataclasses.fields(SourceConfig):
        assert f"| `{f.name}` |" in page


def test_the_readme_recipe_loads():
    """The minimal recipe a newcomer copies is a valid recipe (keys, types, one source)."""
    blocks = re.findall(r"^```yaml\n(.*?)^```", (ROOT / "README.md").read_text(), flags=re.M | re.S)
    assert blocks
    for block in blocks:
        recipe = recipe_from_dict(yaml.safe_load(block), where="README.md")
        assert recipe.sources and recipe.sources[0].family


def fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[a-z]*\n(.*?)^```", text, flags=re.M | re.S)


def test_the_readmes_demo_and_iterate_figures_are_quoted_command_output_in_docs():
    """The README repeats figures its pages quote from a command's output (docs/demo.md: `rsgen demo`'s table and
    truth line, checked by tests/demo/test_truth.py; docs/iterate.md: the iterate report's and bench_iterate_rows'
    tables): they must be those, not a copy left behind when the page was re-measured."""
    readme = (ROOT / "README.md").read_text()
    # `rsgen demo`'s last line (tests/test_demo_command.py): a wall time, so with its machine, load, date and commit
    assert re.search(r"it ends with its wall time: `demo finished in \d+ s` on .{0,40} at load [\d.]+ on "
                     r"\d{4}-\d\d-\d\d, commit [0-9a-f]{7}", " ".join(readme.split()))
    demo_table = next(b for b in fenced_blocks(readme) if b.startswith("family        accepted"))
    assert "truth check:" in demo_table
    assert demo_table in fenced_blocks((ROOT / "docs" / "demo.md").read_text())
    printed = "\n".join(fenced_blocks((ROOT / "docs" / "iterate.md").read_text()))
    prose = " ".join(outside_code(readme).split()).replace("−", "-")
    for in_readme, in_output in [("from 22.6% to 20.9% (-1.8 ± 2.1 points)", "round 3 against the base: -1.8 ± 2.1"),
                                 ("800 held-out QA pairs", "held out: 200 images (25% of each family's), 800 QA pairs"),
                                 ("in only 79 of 565 right samples", "79 of 565 right samples added by the explore"),
                                 ("in 384 of 533 accepted greedy answers", "384 of 533 accepted greedy answers")]:
        assert in_readme in prose, in_readme
        assert in_output in printed, in_output
    # bench_iterate_rows' lines the README quotes: the figure must be that line's `truth vs base`.
    bench_lines = {line[:28].strip(): line.split()[-3:] for line in printed.splitlines() if " ± " in line[-14:]}
    for in_readme, line in [("(accepted answers -0.3 ± 2.1)", "accepted, long"),
                            ("every training question gains +9.0 ± 2.2", "gold, every question")]:
        assert in_readme in prose, in_readme
        assert " ".join(bench_lines[line]) in in_readme, (line, bench_lines[line])
    rounds = [line.split() for line in printed.splitlines() if re.match(r"[03] {10,}", line)]
    assert rounds[0][3] == "22.6%" and rounds[1][3] == "20.9%", rounds  # held-out truth, rounds 0 and 3


def section_of(page: str, heading: str) -> str:
    return page.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize(("heading", "pattern"), [
    ("## The demo, measured", r"[+-]?\d+\.\d ± \d+\.\d|\d+\.\d%|\b0\.\d{3}\b"),  # changes ± se, rates, SFT losses
    ("## What the data is worth: one table", r"\d+\.\d%"),  # its ± figures: the test beside its bench
])
def test_iterates_prose_figures_are_in_the_command_output_it_quotes(heading, pattern):
    """docs/iterate.md's prose about the demo loop reads its figures off the tables quoted beside it (the output of
    `rsgen iterate` / `python -m rsgen.iterate.report`, `bench/bench_iterate_rows.py`, `bench/bench_training_value.py`,
    each checked against its command by the tests those blocks name): a figure typed by hand, or one left behind when
    a table was re-measured, is in no table and fails."""
    section = section_of((ROOT / "docs" / "iterate.md").read_text().replace("−", "-"), heading)
    printed = "\n".join(fenced_blocks(section))
    figures = re.findall(pattern, " ".join(outside_code(section).split()))
    assert len(figures) >= 3, figures
    assert [f for f in figures if f not in printed] == []


def test_iterates_counts_in_prose_are_the_ones_its_commands_print():
    """The demo loop's prose counts: the base's training rows are `train_demo_model.py --show --base`'s (quoted in
    docs/demo.md, tests/demo/test_demo_docs.py), the wrong accepted pairs per round the iterate table's truth check."""
    page = (ROOT / "docs" / "iterate.md").read_text()
    section = section_of(page, "## The demo, measured")
    prose = " ".join(outside_code(section).split())
    rows = re.search(r"the base itself was trained on ([\d,]+) rows from scratch", prose).group(1)
    base_block = next(b for b in fenced_blocks((ROOT / "docs" / "demo.md").read_text()) if b.startswith("base_model:"))
    assert "run 1: from scratch, " in base_block and f", {rows} training rows" in base_block, (rows, base_block)
    printed = "\n".join(fenced_blocks(section))
    truth_line = next(line for line in printed.splitlines() if line.startswith("truth check"))
    wrong = re.findall(r"round \d+ (\d+) of \d+", truth_line)
    assert f"(accepted pairs against the scene: {', '.join(wrong[:-1])}, {wrong[-1]} of about 700)" in prose, wrong


def rate_of_count(shown: str, qa: int) -> float:
    """The rate of the one count of `qa` pairs that prints as `shown` (`22.6%`)."""
    rates = [k / qa for k in range(qa + 1) if f"{k / qa:.1%}" == shown]
    assert len(rates) == 1, shown
    return rates[0]


def test_iterates_demo_table_is_what_the_report_prints_from_its_counts():
    """docs/iterate.md's demo table (`python -m rsgen.iterate.report`) recomputed: the rates it shows are counts of
    its 800 held-out pairs, and `rounds_table` on those counts (with its losses, rows, models and truth checks) must
    print the quoted block exactly: the changes ± se and the last round against the base are computed, not typed."""
    from rsgen.iterate.report import rounds_table

    section = section_of((ROOT / "docs" / "iterate.md").read_text(), "## The demo, measured")
    block = next(b for b in fenced_blocks(section) if b.startswith("round ")).rstrip("\n")
    lines = block.splitlines()
    held = re.match(r"held out: (\d+) images \((\d+)% of each family's\), (\d+) QA pairs", lines[-4])
    qa = int(held[3])

    def count_rate(shown: str) -> float:
        return rate_of_count(shown, qa)

    row = re.compile(r"(\d+) +(\S+%) +(\S+%) +(\S+%) +(?:-|\S+ ± \S+) +(\S+%) +(\d+) +(?:(\d+) pairs|-) +"
                     r"(?:(\S+) -> (\S+)|-) +(\S+)$")
    wrong = dict(re.findall(r"round (\d+) (\d+ of \d+)", lines[-2]))
    rounds = []
    for line in lines[2:-4]:
        r = row.match(line)
        assert r, line
        training = {"rows": int(r[7]), "losses": [[1, float(r[8])], [2, float(r[9])]]} if r[7] else {}
        accepted_wrong, accepted = wrong[r[1]].split(" of ")
        rounds.append({"round": int(r[1]), "model": r[10], "training": training,
                       "train": {"accept_rate": float(r[5][:-1]) / 100},
                       "held_out": {"qa": qa, "verifier_rate": count_rate(r[2]), "accept_rate": count_rate(r[3]),
                                    "truth_rate": count_rate(r[4])},
                       "contributed_accepted": int(r[6]),
                       "truth": {"accepted_wrong": int(accepted_wrong), "accepted": int(accepted)}})
    data = {"rounds": rounds, "held_out": {"images": int(held[1]), "fraction": int(held[2]) / 100},
            "judge_model": re.match(r"judge in every round: (\S+)", lines[-3])[1]}
    assert rounds_table(data) == block


@pytest.mark.parametrize("header", ["line                           rows", "line                                        fine"])
def test_the_bench_tables_changes_against_the_base_are_computed_from_their_counts(header):
    """docs/iterate.md's bench_iterate_rows and bench_training_value tables at the recipe's size: each line's `truth
    vs base` is what the benches print (`change_text(rate_change(...))`) for the counts of 800 pairs its truth rate
    stands for."""
    from rsgen.iterate.report import change_text, rate_change

    page = (ROOT / "docs" / "iterate.md").read_text()
    block = next(b for b in fenced_blocks(page) if b.startswith(header) and "held out: 800 QA pairs" in b)
    qa = 800
    rows = [re.split(r"\s{2,}", line.strip()) for line in block.splitlines()[2:-2]]
    truth_at = max(i for i, cell in enumerate(rows[0]) if cell.endswith("%"))  # verifier, then truth; then the change
    base = {"qa": qa, "truth_rate": rate_of_count(rows[0][truth_at], qa)}
    for row in rows[1:]:
        held = {"qa": qa, "truth_rate": rate_of_count(row[truth_at], qa)}
        assert row[truth_at + 1] == change_text(rate_change(held, base)), row
