"""`rsgen demo` (rsgen/demo_command.py) end to end in this process, on four images: the fast tier's run of every
stage with the shipped demo model. The README's full demo and the 24-image run from a subprocess are in the slow
tier (tests/demo/)."""

from __future__ import annotations

import json

import datasets
from card_figures import assert_card_figures_match_stats

from rsgen.cli import main


def test_rsgen_demo_on_four_images(tmp_path, capsys):
    out = tmp_path / "demo"
    main(["demo", "--output-dir", str(out), "--num-images", "4"])
    stdout = capsys.readouterr().out
    assert "accept rate" in stdout and "truth check:" in stdout and f"card:    {out / 'dataset' / 'README.md'}" in stdout

    stats = json.loads((out / "stats.json").read_text())
    totals = stats["totals"]
    assert totals["prepared_qa"] == totals["accepted_qa"] + totals["rejected_qa"] > 0
    assert stats["calibration"]["total"] > 0 and stats["calibration"]["known_wrong_total"] > 0
    card = (out / "dataset" / "README.md").read_text()
    assert "This is a demo dataset" in card
    assert assert_card_figures_match_stats(card, stats) > 50

    family, fam = next((f, fam) for f, fam in stats["families"].items() if fam["splits"]["rejected"]["rows"])
    rejected = datasets.load_dataset(str(out / "dataset"), f"{family}_rejected", split="train")
    assert len(rejected) == fam["splits"]["rejected"]["rows"]
    assert sum(len(row["qa"]) for row in rejected) == fam["rejected_qa"]
