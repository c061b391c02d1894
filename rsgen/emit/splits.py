"""Routing: every prepared QA pair goes to exactly one side, accepted (RS_think / RS_nothink) or rejected.

The rules are coded once, in `rsgen.routing.route`:
a sample is accepted when the verifier matched it or the judge said CORRECT; UNSURE never counts. With
`num_samples > 1` a pair is accepted when any of its samples is (the first accepted sample's response is kept),
and a rejected pair is described by sample 0 (its extracted answer and its reason).

Nothing is dropped here: a QA pair without generate records, or whose stored question differs from the text
the model received, is an error that names the pair, because emitting around it would break
accepted + rejected = prepared.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import RecipeError
from rsgen.emit.explored import ExploreOutcome, explore_outcome, load_explore_records, pass_rate_bin
from rsgen.records import (
    CALIBRATION,
    CORRECT,
    KNOWN_RIGHT,
    KNOWN_WRONG,
    WRONG,
    BlindRecord,
    ExploreRecord,
    GenerateRecord,
    JudgeRecord,
    Name,
    read_records,
)
from rsgen.routing import (
    BLIND_SOLVABLE,
    WITHHELD,
    JudgeMissingError,
    goes_to_judge,
    judge_trusted,
    needs_judging,
    route,
)
from rsgen.store import CheckpointStore
from rsgen.verifiers.decision import NO_ANSWER, WRONG_ANSWER

# A response carries reasoning when it closes a reasoning block (a hosted model that hides its reasoning never does).
REASONING_CLOSE_RE = re.compile(r"</(?:think|thinking|thought|reasoning)>")
SPOT_CHECKS = 10  # promoted pairs per family listed on the card for a reader to check


class EmitError(RecipeError):
    """The work on disk cannot be emitted as it is; the message says what is missing and how to fix it.
    (A RecipeError, so the command line prints it as a one-line error.)"""


class Via(Name):
    """How a QA pair left the routing (PairOutcome.via)."""

    VERIFIER = "verifier"  # accepted: a sample the verifier matched
    JUDGE = "judge"  # accepted: a rejection the judge promoted
    REJECTED = "rejected"
    BLIND_DROPPED = "blind_dropped"  # accepted, then left out by `blind_check: drop`


class SamplePath(Name):
    """How one sample was decided (PairOutcome.paths; stats.json counts samples by it)."""

    VERIFIER = "verifier"  # the verifier matched
    DECISIVE = "decisive"  # rejected by a decisive mismatch, not shown to the judge
    JUDGE = "judge"  # graded by the judge
    UNJUDGED = "unjudged"  # rejected with no judge (judge: false, or out of its scope)


@dataclass(frozen=True)
class PairOutcome:
    """Where one QA pair goes, with what the splits need from the model's work."""

    qa_id: str
    accepted: bool
    via: Via  # verifier | judge when accepted, rejected otherwise (blind_dropped: see with_blind)
    response: str | None  # the accepted sample's full output (reasoning included)
    wrong_vlm: str | None  # rejected: sample 0's extracted final answer (None when there was none)
    reason: str | None  # rejected: wrong_answer | judge_unsure | judge_withheld | no_answer | the verifier's reason
    paths: tuple[SamplePath, ...] = ()  # per sample: how it was decided
    withheld: int = 0  # samples whose CORRECT the leniency gate withheld
    promoted: str | None = None  # accepted by the judge: the candidate it promoted
    withheld_candidate: str | None = None  # the first candidate whose CORRECT the gate withheld
    explore: ExploreOutcome | None = None  # with an explore pass: pass rate and on-policy pair (`with_explore`)
    round: int | None = None  # `rsgen iterate`'s final dataset: the round whose model answered
    blind_dropped: bool = False  # accepted, then left out by `blind_check: drop` (neither accepted nor rejected)
    blind_solvable: bool | None = None  # None: no blind check; else whether an accepted pair's blind answer verified


@dataclass
class WorkRecords:
    """The generate and judge work of one output directory, indexed for routing."""

    samples: dict[str, list[GenerateRecord]]  # QA id -> generate records ordered by sample
    judge: dict[str, JudgeRecord]  # judge key (= generate key) -> record, rejected pairs only
    calibration: dict[str, JudgeRecord]  # generate key -> calibration judge record
    judge_enabled: bool
    num_samples: int
    known_wrong: dict[str, JudgeRecord] = field(default_factory=dict)  # QA id -> known-wrong judge record
    judge_scope: str = "undecided"
    numeric_tolerance: float | None = None
    min_specificity: float = 0.95
    explore: dict[str, list[ExploreRecord]] | None = None  # QA id -> explore records; None: no explore pass
    blind: dict[str, BlindRecord] | None = None  # QA id -> blind record; None: blind_check off
    blind_drop: bool = False  # blind_check: drop
    known_right: dict[str, JudgeRecord] = field(default_factory=dict)  # QA id -> known-right judge record

    @classmethod
    def load(cls, generate: Iterable[GenerateRecord], judge_dir, *, judge_enabled: bool, num_samples: int,
             judge_scope: str = "undecided",
             numeric_tolerance: float | None = None, min_specificity: float = 0.95, explore_dir=None) -> WorkRecords:
        samples: dict[str, list[GenerateRecord]] = defaultdict(list)
        for rec in generate:  # with the verify stage's decisions (rsgen.decisions.decided_records)
            samples[rec.id].append(rec)
        for recs in samples.values():
            recs.sort(key=lambda r: (r.sample or 0))
        judge: dict[str, JudgeRecord] = {}
        calibration: dict[str, JudgeRecord] = {}
        known_wrong: dict[str, JudgeRecord] = {}
        known_right: dict[str, JudgeRecord] = {}
        if judge_enabled:
            for rec in read_records(CheckpointStore(judge_dir), JudgeRecord):
                if rec.kind == CALIBRATION:
                    calibration[rec.response_key] = rec
                elif rec.kind == KNOWN_WRONG:
                    known_wrong[rec.id] = rec
                elif rec.kind == KNOWN_RIGHT:
                    known_right[rec.id] = rec
                else:
                    judge[rec.key] = rec
        explore = load_explore_records(explore_dir) if explore_dir is not None else None
        return cls(dict(samples), judge, calibration, judge_enabled, num_samples, known_wrong, judge_scope,
                   numeric_tolerance, min_specificity, explore, known_right=known_right)

    def known_wrong_counts(self, family: str) -> tuple[int, int]:
        """(known-wrong pairs the judge called WRONG, known-wrong pairs judged) in `family`."""
        verdicts = [rec.verdict for rec in self.known_wrong.values() if rec.family == family]
        return sum(v == WRONG for v in verdicts), len(verdicts)

    def trusted(self, family: str) -> bool:
        """Whether `family` passes the leniency gate (its judge promotions count)."""
        cache = self.__dict__.setdefault("_trusted", {})
        if family not in cache:
            cache[family] = judge_trusted(*self.known_wrong_counts(family), self.min_specificity)
        return cache[family]

    def outcome(self, qa: dict[str, Any]) -> PairOutcome:
        """Where the QA pair goes by the routing rules (`rsgen iterate` merges rounds by overriding this)."""
        return route_pair(qa, self)

    def judge_needed(self) -> bool:
        """Whether any sample is one the judge must grade (verifier rejection with an extractable answer)."""
        return any(needs_judging(rec) for recs in self.samples.values() for rec in recs)

    def has_judge_records(self) -> bool:
        return bool(self.judge or self.calibration or self.known_wrong)

    # Emit reads the work a batch of prepared rows at a time: held in memory (here) the batch is all of it; emit's
    # on-disk index (rsgen.emit.work_index.IndexedWork) reads only the batch's records, so that emit's memory does not
    # grow with the pool.
    def batch(self, qa_ids: list[str]) -> WorkRecords:
        """The work routing needs for these QA ids (and any other)."""
        return self

    def note_prepared(self, qa_ids: Iterable[str]) -> None:
        """Record QA ids of the prepared pool (every one, once a pass), for `outside_pool`."""
        self.__dict__.setdefault("_prepared_ids", set()).update(qa_ids)

    def outside_pool(self) -> int:
        """How many QA ids have generate records but are not in the prepared pool (`note_prepared`)."""
        return len(set(self.samples) - self.__dict__.get("_prepared_ids", set()))


def route_pair(qa: dict[str, Any], work: WorkRecords) -> PairOutcome:
    qa_id = qa["id"]
    samples = work.samples.get(qa_id)
    if not samples:
        raise EmitError(
            f"QA pair {qa_id!r} has no generate record: the generate stage did not finish; "
            "run `rsgen generate` (or `rsgen run`) with the same recipe first"
        )
    if len(samples) != work.num_samples:
        raise EmitError(
            f"QA pair {qa_id!r} has {len(samples)} generate sample(s), the recipe asks for num_samples="
            f"{work.num_samples}; finish the generate stage first"
        )
    for rec in samples:
        if rec.question != qa["question"]:
            raise EmitError(
                f"QA pair {qa_id!r}: the prepared question differs from the text the model received "
                f"(prepared {qa['question']!r}, generate record {rec.key!r} has {rec.question!r}); "
                "the work files belong to another prepared pool"
            )
    paths = []
    decisions = []
    for rec in samples:
        judged = goes_to_judge(rec, qa["answers"], qa.get("options"), work.judge_scope, work.numeric_tolerance)
        if rec.match:
            paths.append(SamplePath.VERIFIER)
        elif work.judge_enabled and judged:
            paths.append(SamplePath.JUDGE)
        elif work.judge_enabled and needs_judging(rec):
            paths.append(SamplePath.DECISIVE)
        else:
            paths.append(SamplePath.UNJUDGED)
        try:
            decisions.append(route(rec, work.judge.get(rec.key), work.judge_enabled, judged=judged,
                                   trusted=work.trusted(rec.family or "") if judged else True))
        except JudgeMissingError as err:
            raise EmitError(str(err)) from err
    withheld = sum(reason == WITHHELD for _, reason in decisions)
    withheld_candidate = next((rec.extracted for rec, (_, reason) in zip(samples, decisions) if reason == WITHHELD),
                              None)
    for rec, (accepted, _reason) in zip(samples, decisions):
        if accepted:
            via = Via.VERIFIER if rec.match else Via.JUDGE
            promoted = rec.extracted if via is Via.JUDGE else None
            return PairOutcome(qa_id, True, via, rec.response, None, None, tuple(paths), withheld, promoted)
    first = samples[0]
    reason = decisions[0][1] or WRONG_ANSWER
    wrong = first.extracted if reason != NO_ANSWER else None
    return PairOutcome(qa_id, False, Via.REJECTED, None, wrong, reason, tuple(paths), withheld,
                       withheld_candidate=withheld_candidate)


def with_blind(outcome: PairOutcome, work: WorkRecords) -> PairOutcome:
    """Under `blind_check: drop`, an accepted pair whose blind answer verified leaves the splits and views."""
    if work.blind is None:
        return outcome
    if not outcome.accepted:
        return dataclasses.replace(outcome, blind_solvable=False)  # only accepted pairs are asked blind
    rec = work.blind.get(outcome.qa_id)
    if rec is None:
        raise EmitError(f"accepted QA pair {outcome.qa_id!r} has no blind record: run `rsgen blind` (or `rsgen run`) "
                        "first, or set blind_check: off")
    if not (work.blind_drop and rec.solvable):
        return dataclasses.replace(outcome, blind_solvable=rec.solvable)
    return dataclasses.replace(outcome, accepted=False, via=Via.BLIND_DROPPED, reason=BLIND_SOLVABLE,
                               blind_dropped=True, blind_solvable=True)


def route_sample(rec: GenerateRecord, qa: dict[str, Any], work: WorkRecords) -> tuple[bool, str | None]:
    """(accepted, reason) of one response (an explore sample, or the greedy answer) by the routing rules: decisive
    mismatches are final, others take the judge's verdict, a CORRECT counts where the family's judge is trusted."""
    judged = goes_to_judge(rec, qa["answers"], qa.get("options"), work.judge_scope, work.numeric_tolerance)
    try:
        return route(rec, work.judge.get(rec.key), work.judge_enabled, judged=judged,
                     trusted=work.trusted(rec.family or "") if judged else True)
    except JudgeMissingError as err:
        raise EmitError(str(err)) from err


def with_explore(outcome: PairOutcome, qa: dict[str, Any], work: WorkRecords) -> PairOutcome:
    """The outcome with what the explore pass found for its QA pair (unchanged without an explore pass)."""
    if work.explore is None:
        return outcome
    explored = work.explore.get(qa["id"], [])
    for rec in explored:
        if rec.question != qa["question"]:
            raise EmitError(f"explore record {rec.key!r} asked {rec.question!r}, the prepared pool has "
                            f"{qa['question']!r}: the work files belong to another prepared pool")
    found = explore_outcome(work.samples[qa["id"]], explored, lambda rec: route_sample(rec, qa, work))
    return dataclasses.replace(outcome, explore=found)


@dataclass
class FamilyRouting:
    """Per-family tallies gathered while routing (the numbers stats.json reports)."""

    prepared_rows: int = 0
    prepared_qa: int = 0
    accepted_qa: int = 0
    verifier_accepted_qa: int = 0
    judge_promoted_qa: int = 0
    rejected_qa: int = 0
    rejected_reasons: Counter = field(default_factory=Counter)
    judge_verdicts: Counter = field(default_factory=Counter)  # over judged samples
    judge_generated_tokens: int = 0
    judge_prompt_tokens: int = 0
    judge_paths: Counter = field(default_factory=Counter)  # samples by path: verifier, decisive, judge, unjudged
    judge_withheld: int = 0  # samples whose CORRECT the leniency gate withheld
    promotions: list[dict[str, str]] = field(default_factory=list)  # up to SPOT_CHECKS promoted pairs
    withheld_promotions: list[dict[str, str]] = field(default_factory=list)  # up to SPOT_CHECKS withheld ones
    calibration_agreed: int = 0
    calibration_total: int = 0
    known_wrong_rejected: int = 0
    known_wrong_total: int = 0
    known_right_promoted: int = 0
    known_right_total: int = 0
    # form -> [verdicts as they should be, pairs judged], and up to SPOT_CHECKS examples per side
    known_wrong_forms: dict[str, list[int]] = field(default_factory=dict)
    known_right_forms: dict[str, list[int]] = field(default_factory=dict)
    calibration_examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    samples: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    hit_limit: int = 0
    with_reasoning: int = 0  # responses that carry reasoning (a closed reasoning block)
    # generated tokens -> samples with that many (the histogram): bounded by max_new_tokens, not by the pool
    response_tokens: Counter = field(default_factory=Counter)
    verifiers: Counter = field(default_factory=Counter)  # verifier names recorded in the generate records
    cleaning_steps: Counter = field(default_factory=Counter)  # rows per clean_meta step
    explore_questions: int = 0
    explore_responses: int = 0  # responses drawn for explored questions, greedy included
    explore_correct: int = 0
    explore_tokens: int = 0  # tokens generated by explore samples
    explore_prompt_tokens: int = 0
    explore_pass_rates: Counter = field(default_factory=Counter)  # questions per pass-rate bin
    blind_checked: int = 0  # accepted pairs with a blind record
    blind_solvable: int = 0
    blind_mc_checked: int = 0  # ... of them multiple choice
    blind_chance: float = 0.0  # sum of 1 / options over the multiple-choice ones
    blind_dropped_qa: int = 0  # left out by blind_check: drop
    blind_examples: list[dict[str, str]] = field(default_factory=list)  # up to SPOT_CHECKS blind-solvable pairs


def tally_row(tally: FamilyRouting, qas: Iterable[dict[str, Any]], outcomes: list[PairOutcome],
              steps: Iterable[str], work: WorkRecords) -> None:
    tally.prepared_rows += 1
    tally.cleaning_steps.update(set(steps))
    for qa, outcome in zip(qas, outcomes):
        tally.prepared_qa += 1
        tally.judge_paths.update(outcome.paths)
        tally.judge_withheld += outcome.withheld
        if outcome.explore is not None:
            tally.explore_questions += 1
            tally.explore_responses += outcome.explore.samples
            tally.explore_correct += outcome.explore.correct
            tally.explore_tokens += outcome.explore.explore_tokens
            tally.explore_prompt_tokens += outcome.explore.explore_prompt_tokens
            tally.explore_pass_rates[pass_rate_bin(outcome.explore.pass_rate)] += 1
        blind = work.blind.get(qa["id"]) if work.blind is not None and (outcome.accepted or outcome.blind_dropped) \
            else None
        if blind is not None:
            tally.blind_checked += 1
            tally.blind_solvable += blind.solvable
            if blind.options:
                tally.blind_mc_checked += 1
                tally.blind_chance += 1 / blind.options
            if blind.solvable and len(tally.blind_examples) < SPOT_CHECKS:
                tally.blind_examples.append({"question": qa["question"], "reference": qa["answers"][0],
                                             "blind_answer": blind.extracted})
        if outcome.blind_dropped:
            tally.blind_dropped_qa += 1
        elif outcome.accepted:
            tally.accepted_qa += 1
            if outcome.via is Via.VERIFIER:
                tally.verifier_accepted_qa += 1
            else:
                tally.judge_promoted_qa += 1
                if len(tally.promotions) < SPOT_CHECKS:
                    tally.promotions.append({"question": qa["question"], "reference": qa["answers"][0],
                                             "candidate": outcome.promoted})
        else:
            tally.rejected_qa += 1
            tally.rejected_reasons[outcome.reason] += 1
            if outcome.withheld_candidate is not None and len(tally.withheld_promotions) < SPOT_CHECKS:
                tally.withheld_promotions.append({"question": qa["question"], "reference": qa["answers"][0],
                                                  "candidate": outcome.withheld_candidate})
        for rec, path in zip(work.samples[qa["id"]], outcome.paths):
            tally.samples += 1
            tally.prompt_tokens += int(rec.prompt_tokens or 0)
            tally.generated_tokens += int(rec.generated_tokens or 0)
            tally.hit_limit += bool(rec.hit_limit)
            tally.with_reasoning += bool(REASONING_CLOSE_RE.search(rec.response or ""))
            tally.response_tokens[int(rec.generated_tokens or 0)] += 1
            if rec.verifier:
                tally.verifiers[rec.verifier] += 1
            judged = work.judge.get(rec.key) if path is SamplePath.JUDGE else None
            if judged is not None:
                tally.judge_verdicts[judged.verdict] += 1
                tally.judge_generated_tokens += int(judged.generated_tokens or 0)
                tally.judge_prompt_tokens += int(judged.prompt_tokens or 0)
            calib = work.calibration.get(rec.key)
            if calib is not None:
                tally.calibration_total += 1
                tally.calibration_agreed += calib.verdict == CORRECT
                tally.judge_generated_tokens += int(calib.generated_tokens or 0)
                tally.judge_prompt_tokens += int(calib.prompt_tokens or 0)
                shown = tally.calibration_examples.setdefault("accepted", [])
                if len(shown) < SPOT_CHECKS:
                    shown.append({"question": qa["question"], "reference": qa["answers"][0],
                                  "candidate": calib.candidate, "form": "", "verdict": calib.verdict})
        for side, built, expected in (("known_wrong", work.known_wrong, WRONG),
                                      ("known_right", work.known_right, CORRECT)):
            known = built.get(qa["id"])
            if known is None:
                continue
            as_expected = known.verdict == expected
            if side == "known_wrong":
                tally.known_wrong_total += 1
                tally.known_wrong_rejected += as_expected
            else:
                tally.known_right_total += 1
                tally.known_right_promoted += as_expected
            form = getattr(tally, side + "_forms").setdefault(known.miss or "unrecorded", [0, 0])
            form[0] += as_expected
            form[1] += 1
            tally.judge_generated_tokens += int(known.generated_tokens or 0)
            tally.judge_prompt_tokens += int(known.prompt_tokens or 0)
            shown = tally.calibration_examples.setdefault(side, [])
            if len(shown) < SPOT_CHECKS:
                shown.append({"question": qa["question"], "reference": qa["answers"][0], "candidate": known.candidate,
                              "form": known.miss or "", "verdict": known.verdict})


# ----------------------------------------------------------------------------------------- split rows


def emitted_clean_meta(clean_meta: dict[str, Any], model: str, verifier: str) -> dict[str, Any]:
    return {**clean_meta, "model": model, "verifier": verifier}


def split_qa(kind: str, qas: list[dict[str, Any]], outcomes: list[PairOutcome]) -> list[dict[str, Any]]:
    """The `qa` list of one row for split `kind` (think | nothink | rejected): only the pairs that belong there."""
    out = []
    for qa, outcome in zip(qas, outcomes):
        answer = qa["answers"][0]  # answers[0] is the canonical official answer
        if outcome.blind_dropped:
            continue  # blind_check: drop -- in no split and no view
        if kind == "rejected" and not outcome.accepted:
            out.append({"question": qa["question"], "answer": answer, "wrong_vlm": outcome.wrong_vlm,
                        "reason": outcome.reason})
        elif kind == "think" and outcome.accepted:
            out.append({"question": qa["question"], "answer": answer, "response": outcome.response})
        elif kind == "nothink" and outcome.accepted:
            out.append({"question": qa["question"], "answer": answer})
        elif kind == "explored" and outcome.explore is not None:
            found = outcome.explore
            out.append({"question": qa["question"], "answer": answer, "options": list(qa["options"] or []),
                        "pass_rate": found.pass_rate, "chosen": found.chosen, "rejected": found.rejected})
    return out
