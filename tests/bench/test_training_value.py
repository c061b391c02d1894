"""`bench/bench_training_value.py --fast` (docs/iterate.md's table of what the data is worth, on 24 demo images):
one table, every line measured on the same held-out slice, each fine-tuning held to the same step budget."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from bench_helpers import run_fast_bench

ROOT = Path(__file__).resolve().parents[2]
LINES = ["base", "SFT, official answers", "SFT, accepted RS_think (1 round)", "ReST-EM (1 round, from base)",
         "STaR (1 round, from previous)", "STaR round 1 + DPO (on-policy)"]


@pytest.mark.slow  # 45 s on the 2-core machine at load 7 (OMP_NUM_THREADS=1)
def test_the_fast_table_has_every_line_on_one_held_out_slice(tmp_path):
    out = tmp_path / "tv"
    table = run_fast_bench("bench_training_value.py", out, "training_value.txt")
    rows = table.splitlines()[2:-2]
    assert [row[:34].strip() for row in rows] == LINES
    # The same held-out slice on every line: every model was measured on the held-out pool, which holds exactly the
    # images of held_out_images.txt, and the training pool none of them.
    from rsgen.schema import PreparedPool, open_prepared

    def images(prepared):
        return set(PreparedPool(sorted(prepared.glob("*.parquet"))).column("image_sha256"))

    held = set((out / "held_out_images.txt").read_text().split())
    assert images(out / "pools" / "held_out") == held
    assert held.isdisjoint(images(out / "pools" / "train"))
    assert images(out / "pools" / "train") | held == images(out / "pool" / "prepared")
    # Each slice's report counts its own rows and pairs (its runs' cards show what it holds).
    for name in ("train", "held_out"):
        report = json.loads((out / "pools" / name / "prepare_report.json").read_text())
        pool = PreparedPool(sorted((out / "pools" / name).glob("*.parquet")))
        assert report["rows"] == len(pool) and report["slice"].startswith(name)
        assert report["kept_qa_pairs"] == report["input_qa_pairs"] == sum(map(len, pool.column("qa")))
    for name in ("base", "official", "accepted", "rest_em", "star", "dpo"):
        assert set(open_prepared(out / "measure" / name).column("image_sha256")) == held, name
    measured = {json.loads(p.read_text())["qa"] for p in (out / "measure").glob("*.json")}
    assert len(measured) == 1 and f"held out: {measured.pop()} QA pairs" in table
    # Each fine-tuning ran the budget: 4 steps (the DPO line: 4 SFT + 4 DPO).
    steps = [int(row[58:64]) for row in rows]
    assert steps == [0, 4, 4, 4, 4, 8], table
    assert "with one round STaR is the ReST-EM run" in table
    # docs/iterate.md quotes this command's table: the same header and footnotes, every line; and this --fast
    # table whole, as printed (the latest releases: this tier's environment).
    docs = (ROOT / "docs" / "iterate.md").read_text()
    assert f"```\n{table}\n```" in docs, table
    assert f"\n{table.splitlines()[0]}\n" in docs
    for line in ["base", "SFT, official answers", "SFT, accepted RS_think (1 round)", "ReST-EM (", "STaR (",
                 "STaR round 1 + DPO (on-policy)", "held out: ", "ReST-EM, STaR and DPO fine-tune on iterate_sft_rows: "]:
        assert f"\n{line}" in docs, line
    # Round 0's card (the data the table is about) shows the table.
    card = (out / "round0" / "dataset" / "README.md").read_text()
    assert "## What the data is worth" in card
    for name in LINES:
        assert f"| {name} |" in card, name


def test_the_docs_full_table_is_the_benchs_own_and_its_prose_quotes_it():
    """docs/iterate.md's table at the recipe's size is in the bench's form (its header), each change is the line's
    truth less the base's, and every change ± paired se its prose states is one of the table's lines (a figure
    typed by hand, or left behind by a re-measured table, fails)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_training_value import training_value_table

    docs = (ROOT / "docs" / "iterate.md").read_text()
    section = docs.split("## What the data is worth: one table", 1)[1].split("\n## ", 1)[0]
    block = next(b for b in re.findall(r"^```[a-z]*\n(.*?)^```", section, flags=re.M | re.S) if "held out: 800 QA" in b)
    base = {"qa": 800, "verifier_rate": 0.1, "truth_rate": 0.2}
    assert block.splitlines()[0] == training_value_table([("base", "-", 0, base)], base, "accepted", False).splitlines()[0]
    rows = [re.split(r"\s{2,}", line.strip()) for line in block.splitlines()[2:-2]]
    assert [row[0] for row in rows] == [LINES[0], LINES[1], LINES[2], "ReST-EM (3 rounds, from base)",
                                        "STaR (3 rounds, from previous)", LINES[5]]
    base_truth = float(rows[0][4].rstrip("%"))
    prose = " ".join(section.replace("−", "-").split())
    for row in rows[1:]:
        change, paired = row[5].split(" ± ")[0], row[6]
        assert abs(float(change) - (float(row[4].rstrip("%")) - base_truth)) <= 0.11, row
        assert f"{change} ± {paired}" in prose, row
