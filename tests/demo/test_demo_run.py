"""`rsgen demo` end to end with the shipped model, on a small pool of a seed the model never saw: the README's main
command, shrunk to a few dozen questions."""

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
from card_figures import assert_card_figures_match_stats

pytestmark = [pytest.mark.slow, pytest.mark.floors]  # floors: load_dataset on the output


def hf_home_of(output_dir: Path) -> Path:
    return output_dir.with_name(output_dir.name + "-hf-home")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("demo")
    command = [sys.executable, "-m", "rsgen", "demo", "--output-dir", str(output_dir), "--num-images", "24"]
    # An empty HF home: afterwards it holds only what the run itself cached.
    env = {**os.environ, "HF_HOME": str(hf_home_of(output_dir))}
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert completed.returncode == 0, completed.stderr[-4000:]
    return output_dir, completed.stdout, completed.stderr


def test_prints_the_table_and_where_the_dataset_and_card_are(demo_run):
    output_dir, stdout, _ = demo_run
    assert "accept rate" in stdout and "agreed" in stdout and "known-wrong rejected" in stdout  # both calibration sides
    assert f"dataset: {output_dir / 'dataset'}" in stdout
    assert f"card:    {output_dir / 'dataset' / 'README.md'}" in stdout
    card = (output_dir / "dataset" / "README.md").read_text()
    assert "This is a demo dataset" in card
    assert assert_card_figures_match_stats(card, json.loads((output_dir / "stats.json").read_text())) > 50


def test_answers_split_into_accepted_and_rejected_and_the_judge_agrees(demo_run):
    output_dir, _, _ = demo_run
    stats = json.loads((output_dir / "stats.json").read_text())
    totals = stats["totals"]
    assert 0 < totals["accepted_qa"] and 0 < totals["rejected_qa"], totals
    assert stats["calibration"]["agreed"] >= 0.8 * stats["calibration"]["total"] > 0, stats["calibration"]


def test_rejected_split_holds_the_models_wrong_answers(demo_run):
    output_dir, _, _ = demo_run
    rejected = [
        path.name for path in (output_dir / "dataset" / "data").iterdir() if path.name.endswith("_rejected")
    ]
    assert rejected
    pairs, answered = 0, 0
    for config in rejected:
        split = datasets.load_dataset(
            str(output_dir / "dataset"), config, split="train", download_mode="force_redownload"
        )
        for row in split:
            for qa in row["qa"]:
                pairs += 1
                if qa["wrong_vlm"] is not None:  # None: no final answer could be extracted
                    assert qa["wrong_vlm"] != qa["answer"], qa
                    answered += 1
    assert pairs == json.loads((output_dir / "stats.json").read_text())["totals"]["rejected_qa"]
    assert answered >= 0.9 * pairs


def test_the_prepared_pool_is_read_in_place(demo_run):
    """No second copy of the pool in the HF datasets cache (stages read prepared/ directly)."""
    output_dir, _, _ = demo_run
    prepared = folder_bytes(output_dir / "prepared")
    cache = folder_bytes(hf_home_of(output_dir))
    print(f"prepared pool {prepared} bytes, HF home after the run {cache} bytes")
    assert prepared > 0 and cache < prepared / 4
