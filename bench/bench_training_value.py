"""What rsgen's data is worth on the demo: one table, each line a way of training the demo base on the demo pool,
every line measured on the same held-out slice against the scene's truth, with the same training budget per
fine-tuning.

    python bench/bench_training_value.py                       # recipes/demo_iterate.yaml: 800 images, 3 rounds
    python bench/bench_training_value.py --fast                # 24 images, 1 round, 4 steps: the test's form

Lines (each fine-tuning: `--steps` optimizer steps of the recipe's `iterate_train`, batch and learning rate as
given there; `max_steps` fixes the budget whatever the number of rows):

- base: the recipe's model (`rsgen-demo-base`).
- SFT, official answers: the base fine-tuned on every QA pair of the training slice with the pool's answer as the
  completion (no reasoning, no model output): round 0's `RS_nothink` and `rejected` splits together.
- SFT, accepted RS_think: the base fine-tuned on round 0's accepted `_sft` rows (the model's own reasoning, greedy
  answers only).
- ReST-EM: `--rounds` rounds, each fine-tuning the base on the rows the model of the round before accepted (as
  `rsgen iterate` with `iterate_from: base` and the recipe's `iterate_sft_rows`).
- STaR: `--rounds` rounds, each fine-tuning the model of the round before (`iterate_from: previous`).
- STaR round 1 + DPO: model 1 with a DPO step (TRL's `DPOTrainer`, `--steps` steps) on round 0's on-policy pairs
  (`_dpo_onpolicy`, from the explore pass: `explore_samples` 4 unless the recipe has one).

Nothing identical by construction is done twice. The pool is prepared once and split by image into the training
slice and the held-out slice (`rsgen.iterate.held_out`, the loop's rule). Round 0 is one `rsgen run` of the base on
the training slice with the recipe's stages (explore and judge included; the blind check off: with `flag` it
changes no row); its `_sft` rows fine-tune model 1, which is the accepted line, ReST-EM's and STaR's round 1 and
the DPO line's SFT step (with `iterate_sft_rows: accepted`, the recipe's). Round k >= 1 (model k on the training
slice, shared by ReST-EM and STaR while their models are the same) runs without the explore pass: its rows are the
accepted greedy answers, which the explore pass does not change (the judge's calibration draws from the greedy
pass only). Every model is measured once, by a greedy generate + verify pass on the held-out slice alone (no
judge, explore or blind check: none changes a greedy answer or the verifier's decision, and no line reads them).
The held-out truth is `rsgen.iterate.measure`'s: greedy answers that state the scene's answer, whatever the
verifier said. Changes are against the base, in points, with a standard error that treats the two as independent
samples (conservative: every line answers the same questions) and the paired one, from the per-question
differences (`paired_se`).

The table goes to OUTPUT_DIR/training_value.txt and, with the held-out size, commit, date, wall time and load, to
OUTPUT_DIR/round0/training_value.json; round 0's dataset (the data the table is about) is then emitted again, and
its card gains the section "What the data is worth" (rsgen.emit.card_tables.training_value_figures).
OMP_NUM_THREADS is 1 unless set: with torch's default threads the fine-tuning ran 10-15 s a step on the shared
2-core machine, with one thread about 1 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Before torch loads (here and in any child process): one thread per process on a shared machine (the docstring).
os.environ.setdefault("OMP_NUM_THREADS", "1")

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "demo_iterate.yaml"
DPO_ARGS = {"beta": 0.1, "learning_rate": 1.0e-4, "per_device_train_batch_size": 8, "logging_steps": 5}


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


def paired_se(now: dict, base: dict) -> float | None:
    """The standard error, in points, of the change in the held-out truth rate between two models that answered the
    same questions (`right_ids`: the ids they got right): the spread of the per-question differences, so the
    questions both get right or both miss cancel out. None without the ids."""
    if "right_ids" not in now or "right_ids" not in base or base["qa"] < 2:
        return None
    n, right_now, right_base = base["qa"], set(now["right_ids"]), set(base["right_ids"])
    gained, lost = len(right_now - right_base), len(right_base - right_now)
    return 100 * math.sqrt((gained + lost - (gained - lost) ** 2 / n) / (n * (n - 1)))


def training_value_table(lines: list[tuple[str, str, int, dict]], base: dict, sft_rows: str, one_round: bool) -> str:
    header = (f"{'line':<34} {'fine-tuned on':>22} {'steps':>6} {'held-out verifier':>18} "
              f"{'held-out truth':>15} {'truth vs base':>14} {'paired se':>10}")
    out = [header, "-" * len(header)]
    for name, rows, steps, held in lines:
        paired = None if held is base else paired_se(held, base)
        out.append(f"{name:<34} {rows:>22} {steps:>6} {held['verifier_rate']:>18.1%} {held['truth_rate']:>15.1%} "
                   f"{_se_change(held, base) if held is not base else '-':>14} "
                   f"{'-' if paired is None else f'{paired:.1f}':>10}")
    out.append(f"held out: {base['qa']} QA pairs (the same slice on every line); truth = greedy answers that state "
               "the scene's answer; truth vs base in points ± se (independent samples); paired se: the same, from "
               "the per-question differences")
    out.append(f"ReST-EM, STaR and DPO fine-tune on iterate_sft_rows: {sft_rows}"
               + ("; with one round STaR is the ReST-EM run (both fine-tune the base on round 0's rows)"
                  if one_round else ""))
    return "\n".join(out)


def _rows(*trainings: dict) -> str:
    """What the line's fine-tunings trained on: `140 + 258 DPO pairs`."""
    parts = [f"{t['rows']} DPO" if t.get("kind") == "dpo" else str(t["rows"]) for t in trainings]
    return " + ".join(parts) + " pairs"


def _steps(*trainings: dict) -> int:
    return sum(t["steps"] for t in trainings)


def split_pool(prepared: Path, held_out: set[str], train: Path, measured: Path) -> None:
    """The prepared pool `prepared` split by image into two finished pools: `train` (images not held out) and
    `measured` (the held-out images), each with the same rows, order and recipe fingerprint (so a run's prepare
    stage reuses it) and a report of its own (`slice_report`)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rsgen.schema import open_prepared

    if train.is_dir() and measured.is_dir():
        return
    pool = open_prepared(prepared.parent)
    table = pa.concat_tables(list(pool.batches()))
    schema = pq.read_schema(pool.files[0])
    report = json.loads((prepared / "prepare_report.json").read_text())
    is_held = pa.array([sha in held_out for sha in table.column("image_sha256").to_pylist()])
    for target, keep, name in ((train, pa.compute.invert(is_held), "train"), (measured, is_held, "held_out")):
        part = table.filter(keep)
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        shard = "data-00000-of-00001.parquet"
        pq.write_table(part.cast(schema), partial / shard)
        sliced = slice_report(report, part.column("family").to_pylist(), [len(qa) for qa in part.column("qa").to_pylist()],
                              f"{name}: {part.num_rows} of the {table.num_rows} images of {prepared}, split by image by "
                              "bench/bench_training_value.py; the cleaning before the split is that pool's "
                              "prepare_report.json")
        (partial / "prepare_report.json").write_text(json.dumps({**sliced, "shards": [shard]}, indent=2) + "\n")
        partial.replace(target)


def slice_report(report: dict, families: list[str], pairs: list[int], what: str) -> dict:
    """The prepare report of a slice of a one-source pool (rows' `families`, QA `pairs` per row): its own rows and
    QA pairs, all read from the prepared pool and kept (its cards then count what it holds, not the whole pool's
    pairs beside its own); `slice` says where it comes from. The recipe fingerprint, policy and steps are the pool's."""
    if len(report.get("sources", [])) != 1:
        raise SystemExit("bench_training_value splits a pool of one source (the demo pool's)")
    none = {"dropped_qa_pairs": 0, "merged_qa_pairs": 0, "dropped": {}, "merged": {}, "converted": {}}
    per_family: dict[str, list[int]] = {}
    for family, n in zip(families, pairs):
        per_family.setdefault(family, [0, 0])
        per_family[family][0] += 1
        per_family[family][1] += n
    total = sum(pairs)
    return {**report, "slice": what, "rows": len(families), "input_qa_pairs": total, "kept_qa_pairs": total, **none,
            "examples": {}, "images": {"checked": total, "dropped": {}, "converted": {}},
            "families": {f: {"rows": rows, "input_qa_pairs": n, "kept_qa_pairs": n, **none}
                         for f, (rows, n) in sorted(per_family.items())},
            "sources": [{**report["sources"][0], "source_rows": total, "input_qa_pairs": total, "kept_qa_pairs": total,
                         **none}]}


class Lines:
    """The bench's runs in one output directory, each done once and recorded (a rerun resumes, redoing nothing
    finished): pipelines on the training slice, fine-tunings, greedy measurements on the held-out slice."""

    def __init__(self, recipe, out: Path):
        from rsgen.iterate.held_out import choose_held_out, read_held_out, write_held_out
        from rsgen.layout import OutputLayout
        from rsgen.prepare.stage import run_prepare
        from rsgen.schema import open_prepared

        self.recipe, self.out = recipe, out
        self.made: dict = {}  # name -> the recipe of the run made there
        self.seconds: dict[str, float] = {}  # where the time went, by kind of work (done in this invocation)
        self.count: dict[str, int] = {}
        started = time.perf_counter()
        pool = dataclasses.replace(recipe, output_dir=str(out / "pool"))
        run_prepare(pool)
        held_path = out / "held_out_images.txt"
        if not held_path.exists():
            write_held_out(held_path, choose_held_out(open_prepared(pool.output_dir), recipe.iterate_eval_fraction))
        self.held_out = read_held_out(held_path)
        self.pools = {"train": out / "pools" / "train", "held_out": out / "pools" / "held_out"}
        split_pool(OutputLayout(pool.output_dir).prepared, self.held_out, self.pools["train"], self.pools["held_out"])
        self._spent("prepare and split the pool", started)

    def _spent(self, what: str, started: float) -> None:
        self.seconds[what] = self.seconds.get(what, 0.0) + time.perf_counter() - started
        self.count[what] = self.count.get(what, 0) + 1

    def profile(self) -> str:
        return "time: " + "; ".join(f"{what} {seconds:.0f} s ({self.count[what]})"
                                    for what, seconds in self.seconds.items())

    def pipeline(self, name: str, model: str, pool: str, **overrides):
        """`rsgen run` of `model` on one slice into OUTPUT_DIR/name (resumes; emit is redone, a few seconds)."""
        from rsgen.iterate.loop import _link_prepared, judge_of_rounds
        from rsgen.layout import OutputLayout
        from rsgen.pipeline import run_pipeline

        run = dataclasses.replace(self.recipe, output_dir=str(self.out / name), model_name_or_path=model,
                                  model_revision=self.recipe.model_revision if model == self.recipe.model_name_or_path
                                  else None, judge_model_name_or_path=judge_of_rounds(self.recipe), push_to_hub=False,
                                  **overrides)
        _link_prepared(self.pools[pool], OutputLayout(run.output_dir).prepared)
        run_pipeline(run)
        self.made[name] = run
        return run

    def rows(self, name: str, model: str, sft_rows: str):
        """The SFT rows of `model`'s run on the training slice (round 0 keeps the recipe's explore pass: the DPO
        line reads it; later rounds run without it unless `sft_rows` is `explored`)."""
        from rsgen.iterate.train import sft_training_rows
        from rsgen.layout import OutputLayout

        overrides = {} if name == "round0" or sft_rows == "explored" else {"explore_samples": 0}
        started = time.perf_counter()
        run = self.pipeline(name, model, "train", **overrides)
        self._spent("runs on the training slice", started)
        return sft_training_rows(OutputLayout(run.output_dir).dataset, self.held_out, sft_rows)

    def train(self, name: str, start: str, rows, kind=None, recipe=None) -> dict:
        """Fine-tune `start` on `rows` into OUTPUT_DIR/models/name; the training record (with `model`)."""
        from rsgen.iterate.train import SFT, train_round
        from rsgen.store import distributed_state

        record_path = self.out / "models" / f"{name}.json"
        if record_path.exists():
            return json.loads(record_path.read_text())
        model = self.out / "models" / name
        started = time.perf_counter()
        record = train_round(recipe or self.recipe, kind or SFT, start, rows, self.out / "training" / name, model,
                             distributed_state())
        record.update(kind=(kind or SFT).name, model=str(model), from_model=start,
                      seconds=round(time.perf_counter() - started, 1))
        self._spent("fine-tunings", started)
        record_path.write_text(json.dumps(record, indent=2, default=str) + "\n")
        return record

    def measure(self, name: str, model: str) -> dict:
        """`model`'s greedy answers on the held-out slice, verified and graded against the scene (measure_round's
        `held_out`); judge, explore and blind check off."""
        from rsgen.demo.truth import grade_demo_run
        from rsgen.iterate.measure import demo_source, measure_round

        record_path = self.out / "measure" / f"{name}.json"
        if record_path.exists():
            return json.loads(record_path.read_text())
        started = time.perf_counter()
        run = self.pipeline(f"measure/{name}", model, "held_out", judge=False, explore_samples=0, blind_check="off")
        held = measure_round(run, set())["train"]  # the run's pool is the held-out slice: none of it in `held_out`
        source = demo_source(run)
        held["right_ids"] = sorted(pair.qa_id for pair in grade_demo_run(run.output_dir, source.demo_num_images,
                                                                          source.demo_seed) if pair.right)
        held["seconds"] = round(time.perf_counter() - started, 1)
        self._spent("held-out measurements", started)
        record_path.parent.mkdir(parents=True, exist_ok=True)
        record_path.write_text(json.dumps(held, indent=2) + "\n")
        return held


def _commit() -> str:
    import subprocess

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown (not a git checkout)"
    return head + (" (with uncommitted changes)" if dirty else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--output-dir", default="runs/training_value")
    parser.add_argument("--rounds", type=int, default=None, help="ReST-EM and STaR rounds (default: the recipe's "
                        "iterate_rounds, 3)")
    # 64: about the recipe's own budget for round 0's 533 accepted rows (2 epochs at batch 16: 68 steps).
    parser.add_argument("--steps", type=int, default=64, help="optimizer steps of every fine-tuning (max_steps)")
    parser.add_argument("--num-images", type=int, default=None, help="demo pool images (default: the recipe's)")
    parser.add_argument("--fast", action="store_true", help="24 images, 1 round, 4 steps: the test's form")
    args = parser.parse_args(argv)
    if args.fast:
        args.num_images, args.rounds, args.steps = 24, 1, 4

    from rsgen.config import load_recipe
    from rsgen.iterate.train import DPO, sft_training_rows, training_rows
    from rsgen.layout import OutputLayout

    commit = _commit()  # what is measured: the checkout as the run starts
    recipe = load_recipe(args.config, {})
    args.rounds = recipe.iterate_rounds if args.rounds is None else args.rounds
    if args.rounds < 1 or args.steps < 1:
        parser.error("--rounds and --steps must be at least 1")
    if args.num_images:
        recipe.sources[0].demo_num_images = args.num_images
    recipe = dataclasses.replace(recipe, iterate_train={**(recipe.iterate_train or {}), "max_steps": args.steps},
                                 blind_check="off", explore_samples=recipe.explore_samples or 4)
    out = Path(args.output_dir)
    started = time.perf_counter()
    runs = Lines(recipe, out)
    base_model, sft_rows = recipe.model_name_or_path, recipe.iterate_sft_rows
    base = runs.measure("base", base_model)

    round0_rows = runs.rows("round0", base_model, sft_rows)
    round0_dataset = OutputLayout(out / "round0").dataset
    official = runs.train("official", base_model, official_answer_rows(round0_dataset, runs.held_out))
    model1 = runs.train("round1", base_model, round0_rows)
    accepted = model1 if sft_rows == "accepted" else runs.train(
        "accepted", base_model, sft_training_rows(round0_dataset, runs.held_out, "accepted"))
    dpo_recipe = dataclasses.replace(recipe, iterate_dpo={**DPO_ARGS, "max_steps": args.steps})
    pairs = training_rows(round0_dataset, runs.held_out, DPO)
    if not pairs:
        raise SystemExit(f"round 0 ({out / 'round0'}) has no _dpo_onpolicy pair in the training slice: the DPO line "
                         "needs the explore pass's pairs (explore_samples, views with dpo_onpolicy)")
    dpo = runs.train("dpo", model1["model"], pairs, DPO, dpo_recipe)

    # Rounds 2..R: ReST-EM fine-tunes the base, STaR the model before, on the rows of the model before; round 1's
    # model is the same for both, so is its run on the training slice.
    rest_em, star = [model1], [model1]
    for k in range(1, args.rounds):
        same = rest_em[-1]["model"] == star[-1]["model"]
        rows = runs.rows(f"round{k}" if same else f"rest_em_round{k}", rest_em[-1]["model"], sft_rows)
        rest_em.append(runs.train(f"rest_em{k + 1}", base_model, rows))
        if not same:
            rows = runs.rows(f"star_round{k}", star[-1]["model"], sft_rows)
        star.append(runs.train(f"star{k + 1}", star[-1]["model"], rows))

    measured = {name: runs.measure(name, record["model"]) for name, record in
                (("official", official), ("accepted", accepted), ("rest_em", rest_em[-1]), ("star", star[-1]),
                 ("dpo", dpo))}
    rounds = f"{args.rounds} round{'s' if args.rounds != 1 else ''}"
    lines = [
        ("base", "-", 0, base),
        ("SFT, official answers", _rows(official), _steps(official), measured["official"]),
        ("SFT, accepted RS_think (1 round)", _rows(accepted), _steps(accepted), measured["accepted"]),
        (f"ReST-EM ({rounds}, from base)", _rows(rest_em[-1]), _steps(rest_em[-1]), measured["rest_em"]),
        (f"STaR ({rounds}, from previous)", _rows(*star), _steps(*star), measured["star"]),
        ("STaR round 1 + DPO (on-policy)", _rows(model1, dpo), _steps(model1, dpo), measured["dpo"]),
    ]
    table = training_value_table(lines, base, sft_rows, args.rounds == 1)
    seconds = time.perf_counter() - started
    write_table(out / "training_value.txt", table, started)
    record = training_value_record(lines, base, table, seconds, argv, len(runs.held_out), commit)
    (out / "round0" / "training_value.json").write_text(json.dumps(record, indent=2) + "\n")
    # Round 0's dataset is the data the table is about: emitted again, its card shows the table.
    from rsgen.emit import run_emit

    run_emit(runs.made["round0"])
    print(runs.profile())
    print(f"the table is on round 0's card: {OutputLayout(out / 'round0').dataset / 'README.md'}")
    return 0


def training_value_record(lines, base: dict, table: str, seconds: float, argv, images: int, commit: str) -> dict:
    """training_value.json: what the card's section shows (rsgen.emit.card_tables.training_value_figures)."""
    import datetime
    import sys

    from rsgen.iterate.report import rate_change

    def line(name, rows, steps, held):
        change = None if held is base else rate_change(held, base)
        return {"line": name, "fine_tuned_on": rows, "steps": steps, "qa": held["qa"],
                "verifier_rate": held["verifier_rate"], "truth_rate": held["truth_rate"],
                # Unrounded: the card rounds as the printed table does (one decimal), never twice.
                "truth_change_points": None if change is None else change[0],
                "truth_change_se": None if change is None else change[1],
                "truth_change_paired_se": None if held is base else paired_se(held, base)}

    return {"version": 1, "held_out": {"images": images, "qa": base["qa"]},
            "lines": [line(*entry) for entry in lines],
            "notes": table.splitlines()[-2:],
            "command": " ".join(["python bench/bench_training_value.py", *(sys.argv[1:] if argv is None else argv)]),
            "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "wall_seconds": round(seconds), "load_average": [round(x, 1) for x in os.getloadavg()]}


def write_table(path: Path, table: str, started: float) -> int:
    """The bench's table into `path` and on stdout, with the whole run's time."""
    path.write_text(table + "\n")
    print("\n" + table)
    print(f"\nwhole table in {time.perf_counter() - started:.0f} s; runs in {path.parent}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
