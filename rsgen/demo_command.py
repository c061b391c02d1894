"""`rsgen demo`: the whole pipeline on a freshly drawn demo pool with the shipped demo model, offline on a CPU.

An entry point beside cli.py (it runs the pipeline); the `demo` package below the stages keeps what prepare and the
checks read: the pool, the truth check, the model and its recipe."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rsgen.config import load_recipe
from rsgen.layout import OutputLayout

RECIPE = Path(__file__).with_name("demo") / "recipe.yaml"  # recipes/demo.yaml links here


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
        from rsgen.demo.truth import check_demo_run

        layout = OutputLayout(recipe.output_dir)
        print_stats_table(json.loads(layout.stats_json.read_text()))
        # The pool knows every answer: grade what was accepted against the scenes, not against the judge.
        print("\n" + check_demo_run(recipe.output_dir, source.demo_num_images, source.demo_seed).line())
        print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
        configs = sorted(p.name for p in (layout.dataset / "data").iterdir())
        print(f"dataset: {layout.dataset}  (configs: {', '.join(configs)})")
        print(f"         load one with datasets.load_dataset({str(layout.dataset)!r}, {configs[0]!r}, split='train')")
        print(f"card:    {layout.dataset / 'README.md'}")
    return OutputLayout(recipe.output_dir).dataset


def print_stats_table(stats: dict) -> None:
    """Per family: accepted, rejected, accept rate, judge promotions (and withheld ones), and both calibration sides:
    verifier-accepted pairs the judge agreed with, known-wrong pairs it rejected."""
    families = stats["families"]
    header = (f"{'family':<12} {'accepted':>9} {'rejected':>9} {'accept rate':>12} {'judge +':>8} {'withheld':>9} "
              f"{'agreed':>8} {'known-wrong rejected':>21}")
    print("\n" + header)
    print("-" * len(header))
    for name, fam in sorted(families.items()):
        calib = fam.get("calibration") or {}
        judge = fam.get("judge", {})
        agreed = f"{calib['agreed']}/{calib['total']}" if calib.get("total") else "-"
        rejected = f"{calib['known_wrong_rejected']}/{calib['known_wrong_total']}" if calib.get("known_wrong_total") \
            else "-"
        print(
            f"{name:<12} {fam['accepted_qa']:>9} {fam['rejected_qa']:>9} {fam['accept_rate']:>11.1%} "
            f"{judge.get('promoted', 0):>8} {judge.get('withheld', 0):>9} {agreed:>8} {rejected:>21}"
        )
