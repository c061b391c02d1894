"""`rsgen demo` (rsgen/demo_command.py) end to end in this process, on eight images: the fast tier's run of every
stage with the shipped demo model, graded against the scenes the pool drew (the judge's recall included). The README's full demo and the 24-image run from a subprocess are in the slow
tier (tests/demo/)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import datasets
import yaml
from card_figures import assert_card_figures_match_stats

from rsgen.cli import main
from rsgen.config import load_recipe
from rsgen.demo.truth import check_demo_run
from rsgen.demo_command import RECIPE

ROOT = Path(__file__).resolve().parents[1]
NUM_IMAGES = 8  # 8 images hold a few right answers the verifier rejects (4 hold one); the run costs the same


def test_rsgen_demo_on_eight_images(tmp_path, capsys, caplog):
    out = tmp_path / "demo"
    with caplog.at_level("INFO", logger="rsgen"):
        main(["demo", "--output-dir", str(out), "--num-images", str(NUM_IMAGES)])
    stdout = capsys.readouterr().out
    # docs/architecture.md says what the fast tier runs: this command, on this many images.
    assert f"`rsgen demo --num-images {NUM_IMAGES}` end to end" in (ROOT / "docs" / "architecture.md").read_text()
    # docs/judge.md quotes the judge's closing line of this command (logged as `[rsgen.judge.stage] ...`).
    judged = next(r.getMessage() for r in caplog.records if "; calibration: agreed on " in r.getMessage())
    judge_doc = (Path(__file__).resolve().parents[1] / "docs" / "judge.md").read_text()
    assert "`rsgen demo --num-images 8` logs" in judge_doc and f"\n[rsgen.judge.stage] {judged}\n" in judge_doc, judged
    assert re.search(r"\ndemo finished in \d+ s\n", stdout), stdout  # the line the README quotes (its time: 300 images)
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
    assert_status_says_finished_with_the_work_counts(out, capsys)


def assert_status_says_finished_with_the_work_counts(out, capsys):
    """`rsgen status` (progress.json) on the finished run: "finished", generate done of total and accept rate as
    the generate records on disk have them, every stage done; `--config` finds the same output directory."""
    from rsgen.layout import OutputLayout
    from rsgen.records import GenerateRecord, read_records
    from rsgen.store import CheckpointStore
    from rsgen.store.progress import read_progress

    main(["status", "--output_dir", str(out)])
    text = capsys.readouterr().out
    assert text.startswith("finished (")
    records = list(read_records(CheckpointStore(OutputLayout(out).generate_work), GenerateRecord))
    accepted = sum(r.match for r in records)
    data = read_progress(out)
    gen = data["stages"]["generate"]
    assert gen["done"] == gen["total"] == len(records) > 0 and gen["accepted"] == accepted
    assert gen["generated_tokens"] == sum(r.generated_tokens for r in records)
    row = next(line for line in text.splitlines() if line.startswith("generate ")).split()
    assert row[:7] == ["generate", "done", f"{len(records):,}", "/", f"{len(records):,}", "samples", f"{len(records):,}"]
    assert row[-1] == f"{accepted / len(records):.1%}"
    stages = [line.split()[0] for line in text.splitlines()[3:]]
    assert stages == ["prepare", "generate", "verify", "judge", "blind", "emit"]  # the order they ran
    assert all(data["stages"][s]["state"] == "done" for s in stages)
    recipe = out.parent / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(json.loads((out / "run.json").read_text())["recipe"]))
    main(["status", "--config", str(recipe)])
    assert capsys.readouterr().out == text
    assert_docs_quote_this_status_table(text)


def assert_docs_quote_this_status_table(text: str) -> None:
    """docs/scale.md quotes `rsgen status` on this run (`rsgen demo --num-images 8`): the same table, but for the
    items/s column (the only figure with two decimals), which is a speed on whatever machine ran it (and whose width
    moves the columns: compared word by word)."""
    def table(printed: str) -> list[list[str]]:
        lines = printed[printed.index("stage     state"):].rstrip().splitlines()
        return [re.sub(r"\b\d+\.\d\d\b", "#", line).split() for line in lines]

    docs = (Path(__file__).resolve().parents[1] / "docs" / "scale.md").read_text()
    assert "`rsgen demo --output-dir /tmp/labs_demo8 --num-images 8`" in docs
    quoted = docs[docs.index("finished (/tmp/labs_demo8"):]
    assert table(quoted[:quoted.index("```")]) == table(text), text
