"""`rsgen demo` (rsgen/demo_command.py) end to end in this process, on eight images: the fast tier's run of every
stage with the shipped demo model, graded against the scenes the pool drew (the judge's recall included). The README's full demo and the 24-image run from a subprocess are in the slow
tier (tests/demo/)."""

from __future__ import annotations

import json

import datasets
from card_figures import assert_card_figures_match_stats

from rsgen.cli import main
from rsgen.config import load_recipe
from rsgen.demo.truth import check_demo_run
from rsgen.demo_command import RECIPE

NUM_IMAGES = 8  # 8 images hold a few right answers the verifier rejects (4 hold one); the run costs the same


def test_rsgen_demo_on_eight_images(tmp_path, capsys):
    out = tmp_path / "demo"
    main(["demo", "--output-dir", str(out), "--num-images", str(NUM_IMAGES)])
    stdout = capsys.readouterr().out
    assert "accept rate" in stdout and "truth check:" in stdout and f"card:    {out / 'dataset' / 'README.md'}" in stdout

    # Against the truth: the right answers the verifier rejected (`two`, `five bars`) are the judge's to recover.
    report = check_demo_run(out, NUM_IMAGES, load_recipe(RECIPE).sources[0].demo_seed)
    assert report.line() in stdout
    assert report.verifier_missed >= 3 and report.recovered + len(report.still_rejected) == report.verifier_missed
    assert report.recall >= 0.8, (report.line(), report.still_rejected)
    assert report.accepted > 0 and report.wrong_rate <= 0.1, (report.line(), report.wrong)

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
