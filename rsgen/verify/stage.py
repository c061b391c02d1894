"""The verify stage: a decision for every response generate stored, made by the family's verifier.

Verification is a pure function of the response, the references and the options, so it is a stage of its own:
changing `verifier`, `numeric_tolerance` or `math_timeout_seconds` after an expensive generation decides the
stored responses again in seconds, with no model loaded, and the generate work stays as it is, byte for byte.
The judge then grades only the pairs whose decision changed (its verdicts on unchanged candidates stand), and
emit writes the dataset again.

Decisions go to work/verify/ with `settings.json`, the settings they were made with. A run with other settings
moves a finished work/verify/ to work/verify.previous/, decides everything again, logs how many decisions
changed, then drops the previous decisions. The keys run through the keyed-work loop
(`rsgen.store.run_keyed_work`) like the model stages: striped over the ranks of an `accelerate launch`, done keys
skipped, so a killed verify resumes where it stopped.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.decisions import describe, same_settings, stored_settings, verify_settings, write_settings
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, VerifyRecord, records_by_key
from rsgen.references import check_references
from rsgen.schema import PreparedQuestion, iter_questions, open_prepared
from rsgen.store import CheckpointStore, KeyedWorkSummary, distributed_state, run_keyed_work
from rsgen.verifiers import verify_response
from rsgen.verifiers.decision import rejected
from rsgen.verify import STAGE

logger = logging.getLogger(__name__)

# Decisions are small and quick to make: fewer, larger parts than a model stage writes.
EVERY_ITEMS = 4096


@dataclass(frozen=True)
class VerifyRequest:
    key: str
    meta: GenerateRecord


class StoredResponses:
    """What the keyed-work loop calls the engine of this stage: the verifiers over stored responses (no model)."""

    revision = None
    stats = None

    def __init__(self, recipe: RecipeConfig, questions: dict[str, PreparedQuestion]):
        self.recipe = recipe
        self.questions = questions

    def generate(self, requests) -> Iterator[tuple[VerifyRequest, tuple[str, Any]]]:
        recipe = self.recipe
        for request in requests:
            question = self.questions[request.meta.id]
            verifier = recipe.verifier_for(question.family)
            drop = request.meta.drop_reason  # refused, failed, no content, cut at the token limit: stays a drop
            if drop:
                yield request, (verifier, rejected(drop, None))
                continue
            decision = verify_response(verifier, request.meta.response, list(question.answers),
                                       options=list(question.options) or None,
                                       numeric_tolerance=recipe.numeric_tolerance,
                                       timeout_seconds=recipe.math_timeout_seconds)
            yield request, (verifier, decision)


class VerifyStage:
    """The verify stage's part of the keyed-work loop: one decision per generate record."""

    name = STAGE.name
    unit = "response"

    def __init__(self, generate_records: dict[str, GenerateRecord]):
        self.generate_records = generate_records
        self.verified = self.accepted = 0

    def keys(self) -> list[str]:
        return sorted(self.generate_records)  # every rank reads the same finished store: the same order

    def requests(self, pending: list[str]) -> Iterator[VerifyRequest]:
        return (VerifyRequest(key, self.generate_records[key]) for key in pending)

    def record(self, request: VerifyRequest, result) -> dict[str, Any]:
        verifier, decision = result
        rec = request.meta
        self.verified += 1
        self.accepted += bool(decision.match)
        return VerifyRecord(key=request.key, id=rec.id, sample=rec.sample, family=rec.family,
                            extracted=decision.extracted, match=bool(decision.match),
                            reason=None if decision.match else decision.reason, verifier=verifier).to_json()

    def progress(self, record: dict[str, Any]) -> dict[str, str]:
        return {"accept": f"{self.accepted / self.verified:.1%}"}


def _start(layout: OutputLayout, wanted: dict[str, Any]) -> bool:
    """Main process: make work/verify/ the folder of the wanted settings; whether it is already finished. A
    finished folder of other settings is kept as work/verify.previous/ (to count what changed); an unfinished one
    is dropped."""
    stored = stored_settings(layout.verify_work)
    if same_settings(stored, wanted):
        return bool(stored.get("complete"))  # finished, or a resume
    if stored is not None and stored.get("complete"):
        shutil.rmtree(layout.verify_previous, ignore_errors=True)
        os.replace(layout.verify_work, layout.verify_previous)
    else:
        shutil.rmtree(layout.verify_work, ignore_errors=True)
    write_settings(layout.verify_work, wanted, complete=False)
    return False


def _check_generate_finished(recipe: RecipeConfig, questions: dict[str, PreparedQuestion],
                             generate: dict[str, GenerateRecord]) -> None:
    done = Counter(rec.id for rec in generate.values())
    missing = [qa_id for qa_id in questions if done[qa_id] < recipe.num_samples]
    if missing:
        raise RecipeError(f"generate is not finished in {recipe.output_dir!r}: {len(missing)} of {len(questions)} QA "
                          f"pairs lack a response (e.g. {', '.join(missing[:3])}); run `rsgen generate` first")


def run_verify(recipe: RecipeConfig, state=None) -> KeyedWorkSummary:
    """Decide this rank's pending responses; every rank of an `accelerate launch` calls this."""
    state = state or distributed_state()
    layout = OutputLayout(recipe.output_dir)
    prepared = open_prepared(recipe.output_dir)
    # A verifier that cannot serve a family (a mapping without it, mc on free-form rows) fails here. (Its warnings
    # on references no verifier can use were given by generate; emit's table counts them as bad_input.)
    check_references(recipe, prepared)
    questions = {q.id: q for q in iter_questions(prepared)}
    generate = records_by_key(CheckpointStore(layout.generate_work), GenerateRecord)
    _check_generate_finished(recipe, questions, generate)
    wanted = verify_settings(recipe)
    finished = False
    if state.is_main_process:
        finished = _start(layout, wanted)
    state.wait_for_everyone()
    store = CheckpointStore(layout.verify_work)
    start = time.perf_counter()
    summary = run_keyed_work(VerifyStage(generate), store, state, lambda: StoredResponses(recipe, questions),
                             max(recipe.checkpoint_every_items, EVERY_ITEMS), recipe.checkpoint_every_seconds)
    if state.is_main_process:
        decisions = records_by_key(store, VerifyRecord)
        undecided = [key for key in generate if key not in decisions]
        if undecided:
            raise RuntimeError(f"verify ended with {len(undecided)} responses undecided (e.g. {undecided[:3]})")
        if not finished:
            write_settings(layout.verify_work, wanted, complete=True)
            logger.info(changes_line(layout, generate, decisions, wanted, time.perf_counter() - start))
        shutil.rmtree(layout.verify_previous, ignore_errors=True)
    state.wait_for_everyone()
    return summary


def changes_line(layout: OutputLayout, generate: dict[str, GenerateRecord], decisions: dict[str, VerifyRecord],
                 wanted: dict[str, Any], seconds: float) -> str:
    """How many decisions differ from the ones before: those of the previous settings when this run decided the
    responses again, else those made while generating."""
    previous_settings = stored_settings(layout.verify_previous)
    if previous_settings is not None:
        before: dict[str, Any] = records_by_key(CheckpointStore(layout.verify_previous), VerifyRecord)
        changed_keys = tuple(k for k in wanted if previous_settings.get(k) != wanted[k])
        than = f"the previous decisions ({describe(previous_settings, changed_keys or None)})"
    else:
        before = generate
        than = "the decisions made while generating"

    def decided(rec) -> tuple:
        return rec.match, rec.reason, rec.extracted

    # Counted record by record: no second and third dict of a million tuples.
    changed = accepted_before = accepted_after = 0
    for key, rec in decisions.items():
        old = before.get(key)
        changed += old is None or decided(old) != decided(rec)
        accepted_before += old is not None and bool(old.match)
        accepted_after += bool(rec.match)
    return (f"verify: {len(decisions):,} stored responses decided with {describe(wanted)} in {seconds:.1f} s, no model "
            f"loaded; {changed:,} decisions differ from {than}; verifier-accepted {accepted_before:,} -> "
            f"{accepted_after:,}")

