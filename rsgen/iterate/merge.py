"""The final dataset of `rsgen iterate`: every round's accepted data, each QA pair once.

A pair accepted in some round comes from the first round that got it right (its response, its judge records); a
pair no round got right comes from the last round (what the last model said instead); an accepted pair's blind
check comes from its round. Each round's decision is
the one its own emit made (`route_pair` on that round's work, its judge gate included), so a pair a round
accepted stays accepted here. Emit then writes the dataset from these outcomes as from any run's, with each
pair's round in `clean_meta.qa_rounds`; accepted + rejected = the prepared pool, as always.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import RecipeConfig
from rsgen.emit.splits import EmitError, PairOutcome, WorkRecords
from rsgen.emit.stage import load_work
from rsgen.records import JudgeRecord
from rsgen.schema import iter_questions, open_prepared


@dataclass
class MergedWork(WorkRecords):
    """Work records of several rounds, one round per QA pair, routed as that round routed them."""

    chosen: dict[str, PairOutcome] = field(default_factory=dict)  # QA id -> its outcome, `round` set

    def outcome(self, qa: dict[str, Any]) -> PairOutcome:
        try:
            return self.chosen[qa["id"]]
        except KeyError:
            raise EmitError(f"QA pair {qa['id']!r} is in no round's work: the rounds belong to another prepared "
                            "pool") from None


def merge_rounds(round_recipes: list[RecipeConfig]) -> tuple[MergedWork, dict[int, int]]:
    """The merged work of the rounds (in order), and the accepted pairs each round contributes."""
    last = round_recipes[-1]
    merged = MergedWork(samples={}, judge={}, calibration={}, judge_enabled=last.judge, num_samples=last.num_samples,
                        known_wrong={}, judge_scope=last.judge_scope, numeric_tolerance=last.numeric_tolerance,
                        min_specificity=last.judge_min_specificity, explore={} if last.explore_samples else None,
                        # the blind check of each accepted pair from its round: the card's blind-check section
                        blind={} if last.blind_check != "off" else None, blind_drop=last.blind_check == "drop")
    questions = [q for q in iter_questions(open_prepared(last.output_dir))]
    contributed: dict[int, int] = {}
    for k, recipe in enumerate(round_recipes):
        work = load_work(recipe)
        judge_keys, calibration_keys = _keys_by_id(work.judge), _keys_by_id(work.calibration)
        is_last = k == len(round_recipes) - 1
        taken = 0
        for q in questions:
            if q.id in merged.chosen:
                continue
            qa = {"id": q.id, "question": q.question, "answers": list(q.answers), "options": list(q.options)}
            outcome = work.outcome(qa)
            if not (outcome.accepted or is_last):
                continue
            # Emit adds what the explore pass found from these records (`with_explore`).
            if merged.explore is not None:
                merged.explore[q.id] = (work.explore or {}).get(q.id, [])
            merged.chosen[q.id] = dataclasses.replace(outcome, round=k)
            taken += outcome.accepted
            merged.samples[q.id] = work.samples[q.id]
            for key in judge_keys.get(q.id, ()):
                merged.judge[key] = work.judge[key]
            for key in calibration_keys.get(q.id, ()):
                merged.calibration[key] = work.calibration[key]
            if merged.blind is not None and q.id in (work.blind or {}):
                merged.blind[q.id] = work.blind[q.id]
            if q.id in work.known_wrong:
                merged.known_wrong[q.id] = work.known_wrong[q.id]
            if q.id in work.known_right:
                merged.known_right[q.id] = work.known_right[q.id]
        contributed[k] = taken
    return merged, contributed


def _keys_by_id(records: dict[str, JudgeRecord]) -> dict[str, list[str]]:
    """QA id -> the keys of its records (greedy and explore samples alike)."""
    out: dict[str, list[str]] = {}
    for key, rec in records.items():
        out.setdefault(rec.id, []).append(key)
    return out
