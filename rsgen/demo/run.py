"""`rsgen demo`: the whole pipeline on a freshly drawn demo pool with the shipped demo model, offline on a CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rsgen.config import load_recipe
from rsgen.layout import OutputLayout

RECIPE = Path(__file__).with_name("recipe.yaml")  # recipes/demo.yaml links here


def run_demo(output_dir: str = "runs/demo", num_images: int | None = None, seed: int | None = None) -> Path:
    from rsgen.pipeline import run_pipeline
    from rsgen.store import distributed_state

    recipe = load_recipe(RECIPE, {"output_dir": output_dir})
    source = recipe.sources[0]
    if num_images is not None:
        source.demo_num_images = num_images
    if seed is not None:
        source.demo_seed = seed
    start = time.perf_counter()
    run_pipeline(recipe)
    if distributed_state().is_main_process:
        layout = OutputLayout(recipe.output_dir)
        print_stats_table(json.loads(layout.stats_json.read_text()))
        print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
        configs = sorted(p.name for p in (layout.dataset / "data").iterdir())
        print(f"dataset: {layout.dataset}  (configs: {', '.join(configs)})")
        print(f"         load one with datasets.load_dataset({str(layout.dataset)!r}, {configs[0]!r}, split='train')")
        print(f"card:    {layout.dataset / 'README.md'}")
    return OutputLayout(recipe.output_dir).dataset


def print_stats_table(stats: dict) -> None:
    families = stats["families"]
    header = f"{'family':<12} {'accepted':>9} {'rejected':>9} {'accept rate':>12} {'judge +':>8} {'calibration':>12}"
    print("\n" + header)
    print("-" * len(header))
    for name, fam in sorted(families.items()):
        calib = fam.get("calibration") or {}
        calib_text = f"{calib.get('agreed', 0)}/{calib.get('total', 0)}" if calib.get("total") else "-"
        print(
            f"{name:<12} {fam['accepted_qa']:>9} {fam['rejected_qa']:>9} {fam['accept_rate']:>11.1%} "
            f"{fam.get('judge', {}).get('promoted', 0):>8} {calib_text:>12}"
        )
