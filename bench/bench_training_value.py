"""What rsgen's data is worth on the demo: one table, each line a way of training the demo base on the demo pool,
every line measured on the same held-out slice against the scene's truth, with the same training budget per
fine-tuning.

    python bench/bench_training_value.py                       # recipes/demo_iterate.yaml, 3 rounds
    python bench/bench_training_value.py --fast                # 24 images, 1 round, 4 steps: the test's form

Lines (each fine-tuning: `--steps` optimizer steps of the recipe's `iterate_train`, batch and learning rate as
given there; `max_steps` fixes the budget whatever the number of rows):

- base: the recipe's model (`rsgen-demo-base`), round 0 of the ReST-EM run below.
- SFT, official answers: the base fine-tuned on every QA pair of the training slice with the pool's answer as the
  completion (no reasoning, no model output): rsgen's `RS_nothink` and `rejected` splits of round 0 together.
- SFT, accepted RS_think: the base fine-tuned on round 0's accepted `_sft` rows (the model's own reasoning, greedy
  answers only: `iterate_sft_rows: accepted`).
- ReST-EM: `iterate_from: base`, `--rounds` rounds (each round fine-tunes the base on the round's rows, as the
  recipe's `iterate_sft_rows` says: with `explored`, the right samples of the explore pass too).
- STaR: `iterate_from: previous`, `--rounds` rounds (each round fine-tunes the model of the round before). With one
  round it is the ReST-EM run itself (both fine-tune the base on round 0's rows; the table says so).
- STaR round 1 + DPO: round 1 with a DPO step (TRL's `DPOTrainer`, `--steps` steps) on round 0's on-policy pairs
  (`_dpo_onpolicy`, from the explore pass: `explore_samples` 4 unless the recipe has one) after the SFT.

The ReST-EM and STaR runs are `rsgen iterate` runs in `--output-dir`; the STaR and DPO runs start from a copy of the
ReST-EM run's round 0 (the same pool, held-out slice and base answers; a copy's pipeline resumes and redoes
nothing). The single fine-tunings (official answers, accepted RS_think) are measured by a greedy generate + verify
pass on the same pool (no judge, explore or blind check: none of them changes a greedy answer or the verifier's
decision), and every run has the blind check off (with `flag` it changes no training row). The held-out truth is
`rsgen.iterate.measure`'s: greedy answers that state the scene's answer, whatever the verifier said. Changes are
against the base, in points, with a standard error that treats the two as independent samples.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo_iterate.yaml"
DPO_ARGS = {"beta": 0.1, "learning_rate": 1.0e-4, "per_device_train_batch_size": 8, "logging_steps": 5}


def _copy_round_0(source: Path, target: Path) -> None:
    """Seed `target` with `source`'s pool, held-out slice and round 0 (hard links): a run there resumes round 0."""
    from rsgen.layout import OutputLayout

    if target.exists():
        return
    src, dst = OutputLayout(source), OutputLayout(target)
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    copy = OutputLayout(partial)
    shutil.copytree(src.prepared, copy.prepared, copy_function=os.link)
    shutil.copy2(src.held_out_images, copy.held_out_images)
    shutil.copytree(src.round_dir(0), copy.round_dir(0), copy_function=os.link,
                    ignore=shutil.ignore_patterns("*.lock", "dataset", "stats.json"))
    partial.replace(dst.root)


def _iterate(recipe, output_dir: Path, **overrides) -> dict:
    from rsgen.iterate.loop import run_iterate

    return run_iterate(dataclasses.replace(recipe, output_dir=str(output_dir), iterate_stop_when_worse=False,
                                           **overrides))


def official_answer_rows(round_0_dataset: Path, held_out: set[str]):
    """Every QA pair of the training slice as an SFT row whose completion is the pool's answer: round 0's
    `RS_nothink` (accepted) and `rejected` splits together hold every pair once with its official answer."""
    import datasets
    import pyarrow.parquet as pq

    from rsgen.emit.trl_views import SFT_FEATURES, sft_rows

    rows = []
    for config in sorted((round_0_dataset / "data").iterdir()):
        if not config.name.endswith(("_RS_nothink", "_rejected")):
            continue
        for shard in sorted(config.glob("*.parquet")):
            for row in pq.read_table(shard, columns=["image", "image_sha256", "qa"]).to_pylist():
                if row["image_sha256"] not in held_out:
                    rows += sft_rows(row["image"], row["qa"], keep_reasoning=False)
    return datasets.Dataset.from_list(rows, features=SFT_FEATURES)


def trained_line(recipe, rest_em: Path, output_dir: Path, rows_of) -> dict:
    """The base fine-tuned once on `rows_of(round 0's dataset, held-out slice)`, then measured by a greedy generate +
    verify pass on the pool (the judge, the explore pass and the blind check change neither a greedy answer nor the
    verifier's decision, so they are off)."""
    from rsgen.iterate.held_out import read_held_out
    from rsgen.iterate.loop import _link_prepared, round_recipe
    from rsgen.iterate.measure import measure_round
    from rsgen.iterate.train import SFT, train_round
    from rsgen.layout import OutputLayout
    from rsgen.pipeline import run_pipeline
    from rsgen.store import distributed_state

    layout, source = OutputLayout(output_dir), OutputLayout(rest_em)
    held_out = read_held_out(source.held_out_images)
    record_path = output_dir / "line.json"
    if record_path.exists():
        return json.loads(record_path.read_text())
    this = dataclasses.replace(recipe, output_dir=str(output_dir))
    rows = rows_of(source.round_dir(0) / "dataset", held_out)
    training = train_round(this, SFT, recipe.model_name_or_path, rows, layout.round_training(0),
                           layout.model_dir(1), distributed_state())
    measured = dataclasses.replace(round_recipe(this, 1), judge=False, explore_samples=0, blind_check="off")
    _link_prepared(source.prepared, layout.round_dir(1) / "prepared")
    run_pipeline(measured)
    record = {"round": 1, "training": training, **measure_round(measured, held_out)}
    record_path.write_text(json.dumps(record, indent=2, default=str) + "\n")
    return record


def _se_change(now: dict, base: dict) -> str:
    from rsgen.iterate.report import change_text, rate_change

    return change_text(rate_change(now, base))


def training_value_table(lines: list[tuple[str, str, int, dict]], base: dict, sft_rows: str, one_round: bool) -> str:
    header = (f"{'line':<34} {'fine-tuned on':>22} {'steps':>6} {'held-out verifier':>18} "
              f"{'held-out truth':>15} {'truth vs base':>14}")
    out = [header, "-" * len(header)]
    for name, rows, steps, held in lines:
        out.append(f"{name:<34} {rows:>22} {steps:>6} {held['verifier_rate']:>18.1%} {held['truth_rate']:>15.1%} "
                   f"{_se_change(held, base) if held is not base else '-':>14}")
    out.append(f"held out: {base['qa']} QA pairs (the same slice on every line); truth = greedy answers that state "
               "the scene's answer; truth vs base in points ± se")
    out.append(f"ReST-EM, STaR and DPO fine-tune on iterate_sft_rows: {sft_rows}"
               + ("; with one round STaR is the ReST-EM run (both fine-tune the base on round 0's rows)"
                  if one_round else ""))
    return "\n".join(out)


def _rows(*rounds: dict) -> str:
    parts = []
    for r in rounds:
        if (r.get("training") or {}).get("rows"):
            parts.append(str(r["training"]["rows"]))
        if (r.get("dpo") or {}).get("rows"):
            parts.append(f"{r['dpo']['rows']} DPO")
    return " + ".join(parts) + " pairs" if parts else "-"


def _steps(*rounds: dict) -> int:
    return sum((r.get(k) or {}).get("steps", 0) for r in rounds for k in ("training", "dpo"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--output-dir", default="runs/training_value")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100, help="optimizer steps of every fine-tuning (max_steps)")
    parser.add_argument("--num-images", type=int, default=None, help="demo pool images (default: the recipe's)")
    parser.add_argument("--fast", action="store_true", help="24 images, 1 round, 4 steps: the test's form")
    args = parser.parse_args(argv)
    if args.fast:
        args.num_images, args.rounds, args.steps = 24, 1, 4

    from rsgen.config import load_recipe
    from rsgen.iterate.train import sft_training_rows

    recipe = load_recipe(args.config, {})
    if args.num_images:
        recipe.sources[0].demo_num_images = args.num_images
    # The blind check is off: no line reads it, and with `flag` it changes no training row. The DPO line needs an
    # explore pass; round 0 of the ReST-EM run has it for every line (copies reuse it).
    recipe = dataclasses.replace(recipe, iterate_train={**(recipe.iterate_train or {}), "max_steps": args.steps},
                                 iterate_rounds=args.rounds, blind_check="off",
                                 explore_samples=recipe.explore_samples or 4)
    out = Path(args.output_dir)
    started = time.perf_counter()
    rest_em = _iterate(recipe, out / "rest_em", iterate_from="base")
    if args.rounds == 1:
        star = rest_em  # one round: STaR's is the same fine-tuning of the base on round 0's rows
    else:
        _copy_round_0(out / "rest_em", out / "star")
        star = _iterate(recipe, out / "star", iterate_from="previous")
    _copy_round_0(out / "rest_em", out / "dpo")
    dpo = _iterate(recipe, out / "dpo", iterate_from="previous", iterate_rounds=1,
                   iterate_dpo={**DPO_ARGS, "max_steps": args.steps})
    official = trained_line(recipe, out / "rest_em", out / "official", official_answer_rows)
    accepted = trained_line(recipe, out / "rest_em", out / "accepted",
                            lambda dataset, held_out: sft_training_rows(dataset, held_out, "accepted"))

    r, s = rest_em["rounds"], star["rounds"]
    rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
    base = r[0]["held_out"]
    lines = [
        ("base", "-", 0, base),
        ("SFT, official answers", _rows(official), _steps(official), official["held_out"]),
        ("SFT, accepted RS_think (1 round)", _rows(accepted), _steps(accepted), accepted["held_out"]),
        (f"ReST-EM ({rounds}, from base)", _rows(r[-2]), _steps(r[-2]), r[-1]["held_out"]),
        (f"STaR ({rounds}, from previous)", _rows(*s[:-1]), _steps(*s[:-1]), s[-1]["held_out"]),
        ("STaR round 1 + DPO (on-policy)", _rows(dpo["rounds"][0]), _steps(dpo["rounds"][0]),
         dpo["rounds"][1]["held_out"]),
    ]
    table = training_value_table(lines, base, recipe.iterate_sft_rows, args.rounds == 1)
    return write_table(out / "training_value.txt", table, started)


def write_table(path: Path, table: str, started: float) -> int:
    """The bench's table into `path` and on stdout, with the whole run's time."""
    path.write_text(table + "\n")
    print("\n" + table)
    print(f"\nwhole table in {time.perf_counter() - started:.0f} s; runs in {path.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
