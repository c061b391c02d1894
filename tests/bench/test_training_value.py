"""`bench/bench_training_value.py --fast` (docs/iterate.md's table of what the data is worth, on 24 demo images):
one table, every line measured on the same held-out slice, each fine-tuning held to the same step budget."""

from __future__ import annotations

import json
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
    for name in ("base", "official", "accepted", "rest_em", "star", "dpo"):
        assert set(open_prepared(out / "measure" / name).column("image_sha256")) == held, name
    measured = {json.loads(p.read_text())["qa"] for p in (out / "measure").glob("*.json")}
    assert len(measured) == 1 and f"held out: {measured.pop()} QA pairs" in table
    # Each fine-tuning ran the budget: 4 steps (the DPO line: 4 SFT + 4 DPO).
    steps = [int(row[58:64]) for row in rows]
    assert steps == [0, 4, 4, 4, 4, 8], table
    assert "with one round STaR is the ReST-EM run" in table
    # docs/iterate.md quotes this command's table: the same header and footnotes, every line.
    docs = (ROOT / "docs" / "iterate.md").read_text()
    assert f"\n{table.splitlines()[0]}\n" in docs
    for line in ["base", "SFT, official answers", "SFT, accepted RS_think (1 round)", "ReST-EM (", "STaR (",
                 "STaR round 1 + DPO (on-policy)", "held out: ", "ReST-EM, STaR and DPO fine-tune on iterate_sft_rows: "]:
        assert f"\n{line}" in docs, line
    # Round 0's card (the data the table is about) shows the table.
    card = (out / "round0" / "dataset" / "README.md").read_text()
    assert "## What the data is worth" in card
    for name in LINES:
        assert f"| {name} |" in card, name
