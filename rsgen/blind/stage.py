"""The blind stage: the accepted QA pairs (verifier-accepted, or promoted by a trusted judge) asked again through
the engine layer without their image -- the same model, the same question text, the generate sampling settings
(greedy by default) and chat template arguments -- run by the keyed-work loop like generate and judge
(checkpointed in OUTPUT_DIR/work/blind/, striped over ranks, resumable after a kill). The blind answer is checked
with the family's verifier against the official answers; a pair whose blind answer passes is blind-solvable.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from rsgen.blind import STAGE
from rsgen.config import RecipeConfig, RecipeError
from rsgen.decisions import decided_records, verify_settings
from rsgen.engine import ChatRequest, build_engine, check_engine
from rsgen.layout import OutputLayout
from rsgen.records import CALIBRATION, KNOWN_WRONG, BlindRecord, JudgeRecord, read_records
from rsgen.routing import goes_to_judge, judge_trusted, route
from rsgen.schema import PreparedQuestion, iter_questions, open_prepared
from rsgen.store import CheckpointStore, distributed_state, run_keyed_work
from rsgen.verifiers import verify_response

logger = logging.getLogger(__name__)


def settings_digest(recipe: RecipeConfig) -> str:
    return hashlib.sha256(json.dumps(verify_settings(recipe), sort_keys=True, default=str).encode()).hexdigest()[:16]


def text_turn(question: str) -> list[dict]:
    """The blind conversation: the user turn of generate without its image part."""
    return [{"role": "user", "content": [{"type": "text", "text": question}]}]


def accepted_questions(recipe: RecipeConfig) -> list[PreparedQuestion]:
    """The QA pairs emit will accept, by the same routing rules (rsgen.routing), in the pool's order."""
    layout = OutputLayout(recipe.output_dir)
    records = decided_records(recipe)
    samples: dict[str, list] = defaultdict(list)
    for rec in records.values():
        samples[rec.id].append(rec)
    judged: dict[str, JudgeRecord] = {}
    known_wrong: Counter = Counter()
    known_wrong_rejected: Counter = Counter()
    if recipe.judge:
        for rec in read_records(CheckpointStore(layout.judge_work), JudgeRecord):
            if rec.kind == KNOWN_WRONG:
                known_wrong[rec.family] += 1
                known_wrong_rejected[rec.family] += rec.verdict == "WRONG"
            elif rec.kind != CALIBRATION:
                judged[rec.key] = rec
    out = []
    for q in iter_questions(open_prepared(recipe.output_dir)):
        recs = samples.get(q.id)
        if not recs:
            raise RecipeError(f"QA pair {q.id!r} has no generate record: finish `rsgen generate` (or `rsgen run`) "
                              "before the blind check")
        for rec in recs:
            to_judge = goes_to_judge(rec, q.answers, q.options, recipe.judge_scope, recipe.numeric_tolerance)
            trusted = judge_trusted(known_wrong_rejected[q.family], known_wrong[q.family],
                                    recipe.judge_min_specificity) if to_judge else True
            if route(rec, judged.get(rec.key), recipe.judge, judged=to_judge, trusted=trusted)[0]:
                out.append(q)
                break
    return out


class BlindStage:
    """The blind stage's part of the keyed-work loop: one text-only request per accepted QA pair."""

    name = STAGE.name
    unit = "pair"

    def __init__(self, recipe: RecipeConfig, items: list[PreparedQuestion]):
        self.recipe = recipe
        self.by_key = {q.id: q for q in items}
        self.settings = settings_digest(recipe)
        self.solvable = self.done = 0

    def keys(self) -> list[str]:
        return list(self.by_key)

    def requests(self, pending: list[str]) -> Iterator[ChatRequest]:
        for key in pending:
            q = self.by_key[key]
            yield ChatRequest(key, text_turn(q.question), [], meta=q)  # no image part, no image

    def record(self, request: ChatRequest, result) -> dict[str, Any]:
        q: PreparedQuestion = request.meta
        recipe = self.recipe
        verifier = recipe.verifier_for(q.family)
        decision = verify_response(verifier, result.text, list(q.answers), options=list(q.options) or None,
                                   numeric_tolerance=recipe.numeric_tolerance,
                                   timeout_seconds=recipe.math_timeout_seconds)
        # A response that is no answer (refused, failed, cut at the token limit) never makes a pair blind-solvable.
        solvable = bool(decision.match) and result.drop_reason is None
        self.done += 1
        self.solvable += solvable
        return BlindRecord(key=q.id, id=q.id, family=q.family, question=q.question, response=result.text,
                           extracted=decision.extracted, solvable=solvable, verifier=verifier,
                           options=len(q.options), generated_tokens=result.generated_tokens,
                           model=recipe.model_name_or_path, settings=self.settings,
                           failed=result.failed or None).to_json()

    def progress(self, record: dict[str, Any]) -> dict:
        return {"blind-solvable": f"{self.solvable / max(self.done, 1):.1%}"}


def check_blind(recipe: RecipeConfig) -> None:
    """Pre-flight: with the blind check on, its model is one the engine can load (its config only)."""
    if recipe.blind_check != "off":
        check_engine(recipe, "generate")


def run_blind(recipe: RecipeConfig, state=None, engine=None) -> dict[str, Any] | None:
    """Ask this rank's share of the accepted pairs without their image; every rank of a launch calls this.
    `engine` replaces the engine `build_engine` would load (routing tests). Returns the counts on the main
    process."""
    state = state or distributed_state()
    if recipe.blind_check == "off":
        if state.is_main_process:
            logger.info("blind: blind_check is off -- skipping the blind check (no model loaded)")
        return None
    layout = OutputLayout(recipe.output_dir)
    stage = BlindStage(recipe, accepted_questions(recipe))
    store = CheckpointStore(layout.blind_work)
    if state.is_main_process:
        # A record counts only for a pair accepted now, decided under the verifier settings of now (the verify stage
        # and the judge may have changed which pairs are accepted): others are set aside and asked again.
        dropped = store.retain(lambda data: data.get("id") in stage.by_key and data.get("settings") == stage.settings
                               and data.get("question") == stage.by_key[data["id"]].question)
        if dropped:
            logger.info(f"blind: {dropped} records set aside (their pair is no longer accepted, or the verifier "
                        "settings changed); those pairs are asked again")
    state.wait_for_everyone()
    # The same engine as generate: the same model, sampling settings and chat template arguments.
    run_keyed_work(stage, store, state, lambda: engine or build_engine(recipe, "generate", device=state.device),
                   recipe.checkpoint_every_items, recipe.checkpoint_every_seconds)
    if not state.is_main_process:
        return None
    records = [r for r in read_records(store, BlindRecord) if r.key in stage.by_key]
    missing = len(stage.by_key) - len(records)
    if missing:
        raise RuntimeError(f"blind stage ended with {missing} accepted pairs not asked")
    solvable = sum(r.solvable for r in records)
    logger.info(f"blind: {solvable} of {len(records)} accepted pairs answered right without the image "
                f"(blind_check: {recipe.blind_check})")
    return {"checked": len(records), "solvable": solvable}
