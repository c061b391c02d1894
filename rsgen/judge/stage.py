"""The judge stage: a text-only second pass over verifier rejections, plus calibration samples on both sides.

Same machinery as generation: an engine from `rsgen.engine.build_engine` (role "judge") run by the keyed-work
loop (`rsgen.store.run_keyed_work`: ranks, resume, checkpoints). This module supplies the judge's items and
prompts and how a verdict becomes a record. The judge sees the prepared question, the official reference and the
candidate (the model's extracted final answer) — never the image, never the model's reasoning — and only grades
text already produced.
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.decisions import decided_records
from rsgen.engine import ChatRequest, build_engine, check_engine, judge_model_name
from rsgen.judge import STAGE
from rsgen.judge.calibration import known_right_pairs, known_wrong_pairs
from rsgen.judge.prompt import format_reference, load_template, render_judge_prompt
from rsgen.judge.verdict import parse_verdict
from rsgen.layout import OutputLayout
from rsgen.records import (
    CALIBRATION,
    CORRECT,
    KNOWN_RIGHT,
    KNOWN_WRONG,
    REJECTED,
    UNSURE,
    WRONG,
    ExploreRecord,
    GenerateRecord,
    JudgeRecord,
    judge_key,
    known_right_key,
    known_wrong_key,
    model_output,
    read_records,
    records_by_key,
)
from rsgen.routing import gate_lines, goes_to_judge, needs_judging
from rsgen.schema import open_prepared
from rsgen.store import CheckpointStore, distributed_state, run_keyed_work


@dataclass(frozen=True)
class JudgeItem:
    key: str  # judge record key
    id: str  # QA id
    sample: int | None
    kind: str  # rejected | calibration | known_wrong | known_right
    family: str
    question: str
    reference: str
    candidate: str
    miss: str | None = None  # known_wrong / known_right: the form of the candidate (rsgen.judge.calibration)


logger = logging.getLogger(__name__)


def _log(state, message: str, level: int = logging.INFO) -> None:
    if state is None or state.is_main_process:
        logger.log(level, message)


def calibration_sample(keys: Iterable[str], size: int, seed: int) -> list[str]:
    """A fixed-seed sample of `size` keys: the keys with the smallest sha256(seed:key). It depends only on the
    set of keys and the seed (not on their order, the process count or Python's random module)."""
    ranked = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    return sorted(ranked[: max(0, size)])


def prepared_index(output_dir: str | Path) -> dict[str, dict[str, Any]]:
    """QA id -> {question, answers, options, family} from the prepared pool (images are not read)."""
    index: dict[str, dict[str, Any]] = {}
    for table in open_prepared(output_dir).batches(["family", "qa"], 1000):
        for family, qas in zip(table.column("family").to_pylist(), table.column("qa").to_pylist()):
            for qa in qas:
                index[qa["id"]] = {"question": qa["question"], "answers": list(qa["answers"]),
                                   "options": list(qa.get("options") or []), "family": family}
    return index


def _qa_of(rec: GenerateRecord, prepared: dict[str, dict[str, Any]], recipe: RecipeConfig):
    qa = prepared.get(rec.id)
    if qa is None:
        raise RecipeError(
            f"generate record {rec.key!r} names QA id {rec.id!r}, which is not in the prepared pool of "
            f"{recipe.output_dir!r}: the work files do not belong to this prepared pool"
        )
    if not qa["answers"]:
        raise RecipeError(f"prepared QA {rec.id!r} has no official answer")
    return qa


def select_items(
    generate_records: dict[str, GenerateRecord], prepared: dict[str, dict[str, Any]], recipe: RecipeConfig,
    explore_records: dict[str, ExploreRecord] | None = None,
) -> list[JudgeItem]:
    """Every item of the stage in one global order: rejected pairs the judge grades (sorted by key; decisive
    mismatches left out unless `judge_scope: all`), the calibration sample of verifier-accepted pairs (sorted by
    key), then the known-wrong and the known-right pairs (each by family, id). Every rank computes the same list. Rejected explore samples
    (keys "{id}#{sample}") are graded like greedy answers; calibration draws from the greedy pass only."""
    graded: dict[str, GenerateRecord] = {**generate_records, **(explore_records or {})}
    rejected = []
    for gen_key in sorted(k for k, rec in graded.items() if needs_judging(rec)):
        rec = graded[gen_key]
        qa = _qa_of(rec, prepared, recipe)
        if goes_to_judge(rec, qa["answers"], qa["options"], recipe.judge_scope, recipe.numeric_tolerance):
            rejected.append(gen_key)
    accepted = [k for k, rec in generate_records.items() if rec.match]
    calibration = calibration_sample(accepted, recipe.judge_calibration_size, recipe.judge_calibration_seed)
    items = []
    for kind, keys in ((REJECTED, rejected), (CALIBRATION, calibration)):
        for gen_key in keys:
            rec = graded[gen_key]
            qa = _qa_of(rec, prepared, recipe)
            items.append(
                JudgeItem(
                    key=judge_key(gen_key, kind),
                    id=rec.id,
                    sample=rec.sample,
                    kind=kind,
                    family=rec.family or qa["family"],
                    question=qa["question"],
                    reference=format_reference(qa["answers"]),
                    # A calibration pair's candidate is what the verifier accepted; a rejected pair's is the
                    # answer it refused. Either way only the final answer, never the reasoning.
                    candidate=rec.extracted if rec.extracted is not None else "",
                )
            )
    size, seed, tolerance = recipe.judge_calibration_size, recipe.judge_calibration_seed, recipe.numeric_tolerance
    built = [(KNOWN_WRONG, known_wrong_key, known_wrong_pairs(prepared, recipe.verifier_for, size, seed, tolerance,
                                                              recipe.judge_scope)),
             (KNOWN_RIGHT, known_right_key, known_right_pairs(prepared, recipe.verifier_for, size, seed, tolerance))]
    for kind, key_of, pairs in built:
        for pair in pairs:
            qa = prepared[pair.id]
            items.append(JudgeItem(key=key_of(pair.id), id=pair.id, sample=None, kind=kind, family=pair.family,
                                   question=qa["question"], reference=format_reference(qa["answers"]),
                                   candidate=pair.candidate, miss=pair.form))
    return items


def _check_generate_finished(
    generate_records: dict[str, GenerateRecord], prepared: dict[str, dict[str, Any]], recipe: RecipeConfig
) -> None:
    """The calibration sample and the rejected set are defined over the finished generate stage; judging a
    partial one would later mix two samples. Refuse instead."""
    done_ids = Counter(rec.id for rec in generate_records.values())
    missing = [qid for qid in prepared if done_ids.get(qid, 0) < recipe.num_samples]
    if missing:
        raise RecipeError(
            f"generate is not finished in {recipe.output_dir!r}: {len(missing)} of {len(prepared)} QA pairs lack "
            f"a generate record (e.g. {', '.join(missing[:3])}); run `rsgen generate` (or `rsgen run`) first"
        )


class JudgeStage:
    """The judge stage's part of the keyed-work loop: the rejected pairs and both calibration samples."""

    name = STAGE.name
    unit = "pair"

    def __init__(self, items: list[JudgeItem], template: str, model: str):
        self.items = items
        self.by_key = {item.key: item for item in items}
        self.template = template
        self.model = model
        self.verdicts: Counter = Counter()

    def keys(self) -> list[str]:
        return [item.key for item in self.items]

    def requests(self, pending: list[str]) -> Iterator[ChatRequest]:
        for key in pending:
            item = self.by_key[key]
            prompt = render_judge_prompt(item.question, item.reference, item.candidate, template=self.template)
            # Text only: no image part, no images.
            yield ChatRequest(key, [{"role": "user", "content": [{"type": "text", "text": prompt}]}], [], meta=item)

    def record(self, request: ChatRequest, result) -> dict[str, Any]:
        item: JudgeItem = request.meta
        verdict = parse_verdict(result.text, result.hit_limit)
        self.verdicts[verdict] += 1
        # A request the server refused, or that failed every retry, has no verdict text (UNSURE); model_output
        # keeps the server's message (a failed one is asked again by the next run).
        return JudgeRecord(key=item.key, id=item.id, sample=item.sample, kind=item.kind, family=item.family,
                           reference=item.reference, candidate=item.candidate, verdict=verdict, miss=item.miss or None,
                           **model_output(result), model=self.model).to_json()

    def progress(self, record: dict[str, Any]) -> dict[str, int]:
        return {v: self.verdicts[v] for v in (CORRECT, WRONG, UNSURE)}


def _still_applies(items: dict[str, JudgeItem]):
    """Whether a stored verdict is one on a current item, as that item is now (its candidate and reference)."""

    def keep(data: dict[str, Any]) -> bool:
        rec = JudgeRecord.from_json(data)
        item = items.get(rec.key)
        return item is not None and (rec.candidate, rec.reference) == (item.candidate, item.reference)

    return keep


def check_judge(recipe: RecipeConfig) -> None:
    """Pre-flight: with the judge on, its model is one the engine can load (its config only)."""
    if recipe.judge:
        check_engine(recipe, "judge")


def run_judge(recipe: RecipeConfig, state=None, engine=None) -> dict[str, Any] | None:
    """Judge this rank's share of the items not yet on disk; every rank of an `accelerate launch` calls this.
    `engine` replaces the engine `build_engine` would load (tests). Returns `judge_summary` on the main process,
    else None."""
    state = state or distributed_state()
    layout = OutputLayout(recipe.output_dir)
    if not recipe.judge:
        _log(state, "judge: false in the recipe — skipping the judge stage (no model loaded); "
                    "verifier rejections keep the verifier's reason")
        return None
    template = load_template(recipe.judge_prompt_file)  # fail on a bad template before any model work
    if not layout.generate_work.is_dir():
        raise RecipeError(f"no generate work in {str(layout.generate_work)!r}: run `rsgen generate` first")
    generate_records = decided_records(recipe)  # with the verify stage's decisions
    prepared = prepared_index(recipe.output_dir)
    _check_generate_finished(generate_records, prepared, recipe)
    # The explore pass (before this stage) adds sampled responses that need a verdict too.
    explore_records = (records_by_key(CheckpointStore(layout.explore_work), ExploreRecord) if recipe.explore_samples
                       else {})
    items = select_items(generate_records, prepared, recipe, explore_records)
    store = CheckpointStore(layout.judge_work)
    if state.is_main_process:
        dropped = store.retain(_still_applies({item.key: item for item in items}))
        if dropped:
            _log(state, f"judge: {dropped} verdicts set aside: the verify stage's decisions changed their pairs (now "
                        "accepted, out of the calibration sample, or another candidate); only these are judged again")
    state.wait_for_everyone()
    kinds = Counter(item.kind for item in items)
    decisive = sum(needs_judging(rec) for rec in [*generate_records.values(), *explore_records.values()]) - kinds[REJECTED]
    done = len(store.done_keys() & {item.key for item in items})
    _log(state, f"{kinds[REJECTED]} rejected pairs to judge ({decisive} decisive mismatches stay wrong_answer "
                f"unjudged, judge_scope: {recipe.judge_scope}) + {kinds[CALIBRATION]} verifier-accepted and "
                f"{kinds[KNOWN_WRONG]} known-wrong and {kinds[KNOWN_RIGHT]} known-right calibration pairs; {done} already done; "
                f"{state.num_processes} process(es)")

    stage = JudgeStage(items, template, judge_model_name(recipe))
    summary = run_keyed_work(stage, store, state, lambda: engine or build_engine(recipe, "judge", device=state.device),
                             recipe.checkpoint_every_items, recipe.checkpoint_every_seconds)
    if not state.is_main_process:
        return None
    done_keys = store.done_keys()  # once: read inside the comprehension it was one scan of every part per pair
    missing = [k for k in stage.by_key if k not in done_keys]
    if missing:
        raise RuntimeError(f"judge stage ended with {len(missing)} items unjudged (e.g. {missing[:3]})")
    result = judge_summary(recipe.output_dir)
    _log(state, format_summary(result))
    gate = {family: {**counts, "withheld": counts["promotions"]} for family, counts in result["families"].items()}
    for level, line in gate_lines(gate, recipe.judge_min_specificity, recipe.judge_min_recall):
        _log(state, line, level)
    if summary.done_now:
        _log(state, f"this run (rank {state.process_index}): {summary.done_now} pairs in {summary.seconds:.1f} s "
                    f"({summary.done_now / max(summary.seconds, 1e-9):.2f} pairs/s)")
    return result


# ------------------------------------------------------------------ summary


def _empty_counts() -> dict[str, int]:
    return {"judged": 0, "promotions": 0, "wrong": 0, "unsure": 0,
            "calibration_agreed": 0, "calibration_wrong": 0, "calibration_unsure": 0, "calibration_total": 0,
            "known_wrong_rejected": 0, "known_wrong_total": 0, "known_right_promoted": 0, "known_right_total": 0}


def _count(counts: dict[str, int], rec: JudgeRecord) -> None:
    verdict = rec.verdict
    if rec.kind == CALIBRATION:
        counts["calibration_total"] += 1
        counts["calibration_agreed"] += verdict == CORRECT
        counts["calibration_wrong"] += verdict == WRONG
        counts["calibration_unsure"] += verdict == UNSURE
    elif rec.kind == KNOWN_WRONG:
        counts["known_wrong_total"] += 1
        counts["known_wrong_rejected"] += verdict == WRONG
    elif rec.kind == KNOWN_RIGHT:
        counts["known_right_total"] += 1
        counts["known_right_promoted"] += verdict == CORRECT
    else:
        counts["judged"] += 1
        counts["promotions"] += verdict == CORRECT
        counts["wrong"] += verdict == WRONG
        counts["unsure"] += verdict == UNSURE


def judge_summary(output_dir: str | Path) -> dict[str, Any]:
    """Counts from the judge work records, overall and per family:
    judged (rejected pairs judged), promotions (CORRECT), wrong, unsure, calibration_agreed (calibration pairs
    called CORRECT), calibration_wrong, calibration_unsure, calibration_total, known_wrong_rejected (known-wrong
    pairs called WRONG), known_wrong_total, known_right_promoted (known-right pairs called CORRECT),
    known_right_total; plus "families": {family: same}.
    All zero when the judge never ran (e.g. `judge: false`)."""
    summary: dict[str, Any] = _empty_counts()
    families: dict[str, dict[str, int]] = {}
    for rec in read_records(CheckpointStore(OutputLayout(output_dir).judge_work), JudgeRecord):
        _count(summary, rec)
        _count(families.setdefault(rec.family or "unknown", _empty_counts()), rec)
    summary["families"] = dict(sorted(families.items()))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"judged {summary['judged']} rejected pairs: CORRECT {summary['promotions']} (promoted), "
        f"WRONG {summary['wrong']}, UNSURE {summary['unsure']}; calibration: agreed on "
        f"{summary['calibration_agreed']}/{summary['calibration_total']} verifier-accepted pairs, said WRONG to "
        f"{summary['known_wrong_rejected']}/{summary['known_wrong_total']} known-wrong pairs and CORRECT to "
        f"{summary['known_right_promoted']}/{summary['known_right_total']} known-right pairs"
    )
