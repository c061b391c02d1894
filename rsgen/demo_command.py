"""`rsgen demo`: the whole pipeline on a freshly drawn demo pool with the shipped demo model, offline on a CPU.

An entry point beside cli.py (it runs the pipeline); the `demo` package below the stages keeps what prepare and the
checks read: the pool, the truth check, the model and its recipe."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

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
        # (emit printed the statistics table.) The pool knows every answer: grade what was accepted against the scenes, not against the judge.
        print("\n" + check_demo_run(recipe.output_dir, source.demo_num_images, source.demo_seed).line())
        blind = blind_line(json.loads(layout.stats_json.read_text()))
        if blind:
            print(blind)
        print(f"\ndemo finished in {time.perf_counter() - start:.0f} s")
        configs = sorted(p.name for p in (layout.dataset / "data").iterdir())
        print(f"dataset: {layout.dataset}  (configs: {', '.join(configs)})")
        print(f"         load one with datasets.load_dataset({str(layout.dataset)!r}, {configs[0]!r}, split='train')")
        print(f"card:    {layout.dataset / 'README.md'}")
    return OutputLayout(recipe.output_dir).dataset


def blind_line(stats: dict[str, Any]) -> str | None:
    """The blind check of a run in one line (docs/blind.md quotes it), None without a blind check."""
    parts = []
    for family, fam in sorted(stats["families"].items()):
        blind = fam.get("blind")
        if blind is None and stats.get("blind_check", "off") == "off":
            continue
        checked, solvable = (blind["checked"], blind["solvable"]) if blind else (0, 0)
        parts.append(f"{family} {solvable} of {checked}")
    if not parts:
        return None
    return f"blind check: accepted pairs the model also answers right without the image: {', '.join(parts)}"
