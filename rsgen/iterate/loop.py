"""`rsgen iterate`: rejection-sample with model k, fine-tune model k+1 on what was accepted, and again.

OUTPUT_DIR/
  prepared/                the pool, prepared once (every round answers the same pool)
  held_out_images.txt      the held-out slice (image sha256s), fixed at the start
  rounds/K/                round K: a complete `rsgen run` output answered by model K, plus training/ (TRL's
                           output_dir of the fine-tuning, checkpoints while it runs)
  models/K/                model K (K >= 1), fine-tuned by round K-1; model 0 is the recipe's model
  iterate.json             the loop's record: per round its model, held-out and training-slice accept rates,
                           the training (rows, per-step loss), and why it stopped
  dataset/, stats.json     the final dataset, from every round (rsgen.iterate.merge), its card with the rounds

Resumable at any point like `rsgen run`: each round's pipeline resumes by itself, training resumes from TRL's last
checkpoint, and iterate.json marks each finished part (a round's pipeline, its training), which is never redone.
Pins: every round's run.json pins its pipeline keys as `rsgen run` does (checked for every round on disk before
any work); iterate.json pins `iterate_eval_fraction` once the slice is chosen, and `iterate_train` and
`iterate_from` once a round's training has started.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.emit import run_emit
from rsgen.iterate.held_out import choose_held_out, read_held_out, write_held_out
from rsgen.iterate.measure import measure_round
from rsgen.iterate.merge import merge_rounds
from rsgen.iterate.train import (
    DPO,
    SFT,
    TrainingKind,
    sft_training_rows,
    train_config,
    train_round,
    training_rows,
)
from rsgen.layout import OutputLayout
from rsgen.lock import locked_output_dir
from rsgen.pipeline import STAGES, check_and_write_run_json, check_before_work, run_pipeline, run_stage
from rsgen.schema import open_prepared
from rsgen.store import distributed_state

logger = logging.getLogger(__name__)

ITERATE_VERSION = 1
# The `pin` keys of the iterate group (rsgen.config): the slice's fraction is pinned once the slice is chosen, these
# once a round's training has started.
TRAIN_PINS = ("iterate_train", "iterate_from", "iterate_dpo", "iterate_sft_rows")
PIN_DEFAULTS = {"iterate_sft_rows": "accepted"}  # what a loop recorded before the key existed trained on


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def model_of_round(recipe: RecipeConfig, k: int) -> str:
    """Model k: the recipe's model for k = 0, else OUTPUT_DIR/models/k (a path built from output_dir as given, so
    the same command line pins the same value in the round's run.json)."""
    return recipe.model_name_or_path if k == 0 else str(OutputLayout(recipe.output_dir).model_dir(k))


def judge_of_rounds(recipe: RecipeConfig) -> str:
    """The judge of every round: `judge_model_name_or_path`, else the round-0 model. Never a fine-tuned model: it
    would grade answers it was trained to give, and the loop's accepted data and rates would follow its drift."""
    return recipe.judge_model_name_or_path or recipe.model_name_or_path


def round_recipe(recipe: RecipeConfig, k: int) -> RecipeConfig:
    """Round k's pipeline recipe: the recipe with model k, into OUTPUT_DIR/rounds/k, judged by `judge_of_rounds`;
    only the final dataset is pushed. A fine-tuned model is a local directory: no Hub revision."""
    return dataclasses.replace(
        recipe, output_dir=str(OutputLayout(recipe.output_dir).round_dir(k)), model_name_or_path=model_of_round(recipe, k),
        model_revision=recipe.model_revision if k == 0 else None, push_to_hub=False,
        judge_model_name_or_path=recipe.judge_model_name_or_path if k == 0 else judge_of_rounds(recipe))


def check_iterate_recipe(recipe: RecipeConfig) -> None:
    """What `rsgen iterate` needs beyond `rsgen run`, each a one-line RecipeError naming the value and the fix."""
    if recipe.temperature != 0 or recipe.num_samples != 1:
        raise RecipeError(f"rsgen iterate measures every round greedy: set temperature: 0 and num_samples: 1 (got "
                          f"temperature {recipe.temperature}, num_samples {recipe.num_samples}); explore_samples > 0 "
                          "samples beyond the greedy answer")
    if recipe.views is not None and "sft" not in recipe.views:
        raise RecipeError(f"rsgen iterate trains on the `_sft` view: add sft to views (got {recipe.views!r}), or set "
                          "views: null")
    layout = OutputLayout(recipe.output_dir)
    train_config(recipe, SFT, layout.round_training(0))  # a bad iterate_train fails here
    if recipe.iterate_sft_rows == "explored":
        _check_onpolicy_view(recipe, "iterate_sft_rows: explored", "iterate_sft_rows: accepted")
    if recipe.iterate_dpo is not None:
        _check_onpolicy_view(recipe, "iterate_dpo", "iterate_dpo: null")
        train_config(recipe, DPO, layout.round_training(0, DPO.name))


def _check_onpolicy_view(recipe: RecipeConfig, what: str, off: str) -> None:
    """`what` reads the `_dpo_onpolicy` view: it needs an explore pass and the view written."""
    if not recipe.explore_samples:
        raise RecipeError(f"{what} reads the _dpo_onpolicy view, which needs an explore pass: set explore_samples "
                          f"(e.g. 4), or {off}")
    if recipe.views is not None and "dpo_onpolicy" not in recipe.views:
        raise RecipeError(f"{what} reads the _dpo_onpolicy view: add dpo_onpolicy to views (got {recipe.views!r}), "
                          f"or set views: null")


def _training_started(record: dict[str, Any]) -> bool:
    return bool(record.get("training", {}).get("started_at"))


def check_iterate_pins(recipe: RecipeConfig, previous: dict[str, Any]) -> None:
    """Refuse a recipe whose iterate keys contradict what the loop on disk was made with."""
    refused = []
    old_fraction = previous.get("held_out", {}).get("fraction")
    if old_fraction is not None and old_fraction != recipe.iterate_eval_fraction:
        refused.append(f"iterate_eval_fraction: {old_fraction!r} -> {recipe.iterate_eval_fraction!r} (the held-out "
                       "slice in held_out_images.txt was chosen with the old value)")
    for record in previous.get("rounds", []):
        if not _training_started(record):
            continue
        for key in TRAIN_PINS:
            # A key added to the loop later is absent from older records: they were made with its default.
            before, after = record["training"]["pins"].get(key, PIN_DEFAULTS.get(key)), getattr(recipe, key)
            if json.dumps(before, sort_keys=True) != json.dumps(after, sort_keys=True):
                refused.append(f"{key}: {before!r} -> {after!r} (round {record['round']}'s training was started with "
                               "the old value)")
        break  # every started training recorded the same pins
    if refused:
        raise RecipeError(f"output_dir {recipe.output_dir!r} holds an iterate loop that this recipe contradicts: "
                          + "; ".join(refused) + ". Put the old values back, or use a new output_dir.")


def stop_reason(rounds: list[dict[str, Any]], stop_when_worse: bool) -> str | None:
    """Why the loop stops after the last measured round: its held-out verifier accept rate fell (with
    `iterate_stop_when_worse`). The verifier's rate: it is the same rule in every round, while the judge's
    promotions also depend on its calibration gate, which each round measures afresh."""
    if not stop_when_worse or len(rounds) < 2 or "held_out" not in rounds[-1] or "held_out" not in rounds[-2]:
        return None
    now, before = rounds[-1]["held_out"]["verifier_rate"], rounds[-2]["held_out"]["verifier_rate"]
    if now is None or before is None or now >= before:
        return None
    return (f"round {rounds[-1]['round']}'s held-out verifier accept rate {now:.1%} fell below round "
            f"{rounds[-2]['round']}'s {before:.1%} (iterate_stop_when_worse)")


class IterateRecord:
    """iterate.json, written by the main process only, read by every process."""

    def __init__(self, recipe: RecipeConfig, state):
        self.path = OutputLayout(recipe.output_dir).iterate_json
        self.state = state
        self.data: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def round(self, k: int) -> dict[str, Any]:
        rounds = self.data.setdefault("rounds", [])
        while len(rounds) <= k:
            rounds.append({"round": len(rounds)})
        return rounds[k]

    def save(self) -> None:
        if self.state.is_main_process:
            _write_json(self.path, self.data)
        self.state.wait_for_everyone()


def run_iterate(recipe: RecipeConfig) -> dict[str, Any]:
    """The loop; returns iterate.json's content."""
    check_iterate_recipe(recipe)
    check_before_work(recipe, STAGES)
    state = distributed_state()
    layout = OutputLayout(recipe.output_dir)
    with locked_output_dir(recipe.output_dir, state):
        record = IterateRecord(recipe, state)
        check_iterate_pins(recipe, record.data)
        # Every round on disk is checked against the recipe before any work, finished rounds too: a changed
        # pipeline key must not quietly apply to the later rounds only.
        for k in range(len(record.data.get("rounds", []))):
            if layout.round_dir(k).is_dir() and OutputLayout(layout.round_dir(k)).run_json.exists():
                check_and_write_run_json(round_recipe(recipe, k), state)
        check_and_write_run_json(recipe, state)
        run_stage("prepare", recipe, state, checked=True)  # once, into OUTPUT_DIR/prepared
        held_out = _held_out_slice(recipe, record, state)
        _run_rounds(recipe, record, held_out, state)
        _final_dataset(recipe, record, state)
    return record.data


def _held_out_slice(recipe: RecipeConfig, record: IterateRecord, state) -> set[str]:
    layout = OutputLayout(recipe.output_dir)
    if state.is_main_process and not layout.held_out_images.exists():
        write_held_out(layout.held_out_images, choose_held_out(open_prepared(recipe.output_dir),
                                                               recipe.iterate_eval_fraction))
    state.wait_for_everyone()
    held_out = read_held_out(layout.held_out_images)
    record.data.update({"iterate_version": ITERATE_VERSION, "base_model": recipe.model_name_or_path,
                        "judge_model": judge_of_rounds(recipe),
                        "iterate_from": recipe.iterate_from, "rounds_planned": recipe.iterate_rounds,
                        "held_out": {"fraction": recipe.iterate_eval_fraction, "images": len(held_out),
                                     "file": layout.held_out_images.name}})
    record.data.setdefault("started_at", _now())
    record.save()
    return held_out


def _link_prepared(source: Path, target: Path) -> None:
    """The round's prepared/: the pool's files hard-linked (copied where links fail), so the round's prepare stage
    finds a finished pool for its recipe and reuses it."""
    if target.is_dir():
        return
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for path in source.iterdir():
        try:
            os.link(path, partial / path.name)
        except OSError:
            shutil.copy2(path, partial / path.name)
    partial.replace(target)


def _run_rounds(recipe: RecipeConfig, record: IterateRecord, held_out: set[str], state) -> None:
    layout = OutputLayout(recipe.output_dir)
    record.data["stopped"] = None
    for k in range(recipe.iterate_rounds + 1):
        this = record.round(k)
        this["model"] = model_of_round(recipe, k)
        this["output_dir"] = str(layout.round_dir(k))
        rr = round_recipe(recipe, k)
        if not this.get("pipeline_finished_at"):
            logger.info("iterate: round %d of %d: the pipeline with %s", k, recipe.iterate_rounds, this["model"])
            if state.is_main_process:
                _link_prepared(layout.prepared, layout.round_dir(k) / "prepared")
            state.wait_for_everyone()
            started = time.perf_counter()
            run_pipeline(rr)
            if state.is_main_process:
                this.update(measure_round(rr, held_out))
            this["pipeline_seconds"] = round(time.perf_counter() - started, 1)
            this["pipeline_finished_at"] = _now()
            record.save()
            record.data = json.loads(layout.iterate_json.read_text())  # every rank: the main process's figures
            this = record.round(k)
        rates = this["held_out"]
        logger.info("iterate: round %d held-out accept rate %.1f%% (verifier), %.1f%% (verifier + judge) on %d QA pairs",
                    k, 100 * (rates["verifier_rate"] or 0), 100 * (rates["accept_rate"] or 0), rates["qa"])
        stopped = stop_reason(record.data["rounds"][: k + 1], recipe.iterate_stop_when_worse)
        if stopped:
            record.data["stopped"] = stopped
            logger.warning("iterate: stopping: %s", stopped)
            break
        if k == recipe.iterate_rounds:
            break
        if not _train(recipe, record, k, held_out, state):
            break
    record.data["rounds"] = record.data["rounds"][: k + 1]  # rounds beyond a lowered iterate_rounds are not reported
    record.save()


def _train(recipe: RecipeConfig, record: IterateRecord, k: int, held_out: set[str], state) -> bool:
    """Round k's fine-tuning into model k+1: SFT, then DPO with `iterate_dpo`; each step's record (`training`,
    `dpo`) marks it finished, and a finished step is not redone. False when there is nothing to train on (the loop
    ends)."""
    layout = OutputLayout(recipe.output_dir)
    this = record.round(k)
    dpo = recipe.iterate_dpo is not None
    # With DPO after it, the SFT model is an intermediate beside the round: model k+1 is only ever a finished one.
    sft_out = layout.round_sft_model(k) if dpo else layout.model_dir(k + 1)
    if not this.get("training", {}).get("finished_at"):
        start = recipe.model_name_or_path if recipe.iterate_from == "base" else model_of_round(recipe, k)
        if not _train_step(recipe, record, k, SFT, start, sft_out, held_out, state):
            record.data["stopped"] = (f"round {k} accepted no QA pair of the training slice: nothing to fine-tune "
                                      "on (a stronger model_name_or_path, or a larger pool)")
            logger.warning("iterate: stopping: %s", record.data["stopped"])
            return False
    if dpo and not this.get("dpo", {}).get("finished_at"):
        if not _train_step(recipe, record, k, DPO, str(sft_out), layout.model_dir(k + 1), held_out, state):
            # No on-policy pair in the training slice: the SFT model is model k+1.
            if state.is_main_process:
                shutil.rmtree(layout.model_dir(k + 1), ignore_errors=True)
                sft_out.replace(layout.model_dir(k + 1))
            state.wait_for_everyone()
            this["dpo"] = {"rows": 0, "finished_at": _now(),
                           "skipped": f"round {k} has no _dpo_onpolicy pair in the training slice: model {k + 1} is "
                                      "the SFT model"}
            logger.warning("iterate: %s", this["dpo"]["skipped"])
            record.save()
        elif state.is_main_process:
            shutil.rmtree(sft_out, ignore_errors=True)  # spent: model k+1 is written
    return True


def _train_step(recipe: RecipeConfig, record: IterateRecord, k: int, kind: TrainingKind, start: str, model_out: Path,
                held_out: set[str], state) -> bool:
    """One training step of round k (kind SFT or DPO) from `start` into `model_out`; False when the round has no
    rows of its view in the training slice."""
    layout = OutputLayout(recipe.output_dir)
    with state.main_process_first():
        dataset = layout.round_dir(k) / "dataset"
        rows = (sft_training_rows(dataset, held_out, recipe.iterate_sft_rows) if kind is SFT
                else training_rows(dataset, held_out, kind))
    if rows is None or len(rows) == 0:
        return False
    this = record.round(k)
    training = this.setdefault("training" if kind is SFT else kind.name, {})
    training.setdefault("started_at", _now())
    training["pins"] = {key: getattr(recipe, key) for key in TRAIN_PINS}
    training["from_model"] = start
    training["model_out"] = str(model_out)
    record.save()
    logger.info("iterate: round %d: %s of %s on %d pairs of the training slice", k, kind.trainer, start, len(rows))
    started = time.perf_counter()
    result = train_round(recipe, kind, start, rows, layout.round_training(k, kind.name), model_out, state)
    training.update(result)
    training["seconds"] = round(time.perf_counter() - started, 1) + training.get("seconds", 0.0)
    training["finished_at"] = _now()
    record.save()
    return True


def _final_dataset(recipe: RecipeConfig, record: IterateRecord, state) -> None:
    """OUTPUT_DIR/dataset/ and stats.json from every measured round; the card shows the rounds."""
    rounds = record.data["rounds"]
    if state.is_main_process:
        merged, contributed = merge_rounds([round_recipe(recipe, r["round"]) for r in rounds])
        for r in rounds:
            r["contributed_accepted"] = contributed[r["round"]]
        record.data["finished_at"] = _now()
        run_emit(recipe, work=merged, extra_stats={"iterate": summary(record.data)})
    record.save()


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """What stats.json and the card carry of iterate.json: everything but the recipe pins of each training step."""
    def unpinned(step: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in step.items() if k != "pins"}

    return {**data, "rounds": [{**r, "training": unpinned(r.get("training", {})),
                                **({"dpo": unpinned(r["dpo"])} if "dpo" in r else {})} for r in data["rounds"]]}
