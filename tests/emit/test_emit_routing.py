"""Routing of QA pairs into accepted / rejected (rsgen.emit.splits), with scripted work records."""

from __future__ import annotations

import pytest

from rsgen.emit.splits import EmitError, WorkRecords, route_pair
from rsgen.records import GenerateRecord, JudgeRecord


def _gen(key, sample=0, match=False, extracted="nine", reason=None, question="q?", response="r", family="Count"):
    qa_id = key.split("#")[0]
    return GenerateRecord.from_json(
        {"key": key, "id": qa_id, "sample": sample, "family": family, "question": question, "response": response,
         "extracted": extracted, "match": match,
         "reason": None if match else (reason or ("no_answer" if extracted is None else "wrong_answer")),
         "verifier": "relaxed", "prompt_tokens": 1, "generated_tokens": 1, "hit_limit": False})


def _verdict(key, verdict, family=None):
    return JudgeRecord(key=key, id=key, kind="rejected", reference="3", candidate="nine", verdict=verdict,
                       response=verdict, prompt_tokens=1, generated_tokens=1, hit_limit=False, model="m",
                       family=family)


def _work(samples, judge=None, judge_enabled=True, num_samples=1, known_wrong=(), **kw):
    """Work records; `known_wrong`: the judge's verdicts on known-wrong pairs of family Count (none: the gate is
    off unless `min_specificity` is given)."""
    by_id = {}
    for rec in samples:
        by_id.setdefault(rec.id, []).append(rec)
    verdicts = {k: _verdict(k, v) for k, v in (judge or {}).items()}
    known = {f"k{i}": _verdict(f"known_wrong:k{i}", v, family="Count") for i, v in enumerate(known_wrong)}
    kw.setdefault("min_specificity", 0.95 if known_wrong else 0.0)
    return WorkRecords(by_id, verdicts, {}, judge_enabled, num_samples, known, **kw)


QA = {"id": "a", "question": "q?", "answers": ["3"]}


@pytest.mark.parametrize(
    "gen, verdict, accepted, via, reason, wrong",
    [
        (_gen("a", match=True, extracted="3", response="R3"), None, True, "verifier", None, None),
        (_gen("a"), "CORRECT", True, "judge", None, None),
        (_gen("a"), "WRONG", False, "rejected", "wrong_answer", "nine"),
        (_gen("a"), "UNSURE", False, "rejected", "judge_unsure", "nine"),
        (_gen("a", extracted=None), None, False, "rejected", "no_answer", None),
    ],
)
def test_route_pair_follows_the_contract(gen, verdict, accepted, via, reason, wrong):
    work = _work([gen], {"a": verdict} if verdict else None)
    out = route_pair(QA, work)
    assert (out.accepted, out.via, out.reason, out.wrong_vlm) == (accepted, via, reason, wrong)
    if accepted:
        assert out.response == gen.response


def test_judge_disabled_keeps_the_verifier_reason():
    work = _work([_gen("a", reason="mc_ambiguous", extracted="B")], judge_enabled=False)
    out = route_pair(QA, work)
    assert (out.accepted, out.reason, out.wrong_vlm) == (False, "mc_ambiguous", "B")


def test_missing_verdict_is_an_error_not_a_silent_rejection():
    with pytest.raises(EmitError, match="rsgen judge"):
        route_pair(QA, _work([_gen("a")], judge={}))


def test_several_samples_first_accepted_response_and_rejection_from_sample_0():
    samples = [_gen("a#0", 0, extracted="seven", response="R0"), _gen("a#1", 1, response="R1"),
               _gen("a#2", 2, match=True, extracted="3", response="R2")]
    # Sample 1 promoted by the judge comes before sample 2's verifier match.
    out = route_pair(QA, _work(samples, {"a#0": "WRONG", "a#1": "CORRECT"}, num_samples=3))
    assert (out.accepted, out.via, out.response) == (True, "judge", "R1")
    out = route_pair(QA, _work(samples[:2], {"a#0": "UNSURE", "a#1": "WRONG"}, num_samples=2))
    assert (out.accepted, out.reason, out.wrong_vlm) == (False, "judge_unsure", "seven")


def test_unfinished_generate_and_foreign_questions_are_errors():
    with pytest.raises(EmitError, match="no generate record"):
        route_pair(QA, _work([]))
    with pytest.raises(EmitError, match="num_samples=2"):
        route_pair(QA, _work([_gen("a#0")], {"a#0": "WRONG"}, num_samples=2))
    with pytest.raises(EmitError, match="differs from the text the model received"):
        route_pair(QA, _work([_gen("a", question="q? ")], {"a": "WRONG"}))


def test_decisive_mismatch_stays_wrong_without_a_verdict():
    out = route_pair(QA, _work([_gen("a", extracted="9")], judge={}))  # no judge record needed
    assert (out.accepted, out.reason, out.wrong_vlm, out.paths) == (False, "wrong_answer", "9", ("decisive",))
    # Even a CORRECT on disk (from a run with judge_scope: all) does not promote it under the default scope.
    out = route_pair(QA, _work([_gen("a", extracted="9")], judge={"a": "CORRECT"}))
    assert (out.accepted, out.reason) == (False, "wrong_answer")
    out = route_pair(QA, _work([_gen("a", extracted="9")], judge={"a": "CORRECT"}, judge_scope="all"))
    assert (out.accepted, out.via, out.paths) == (True, "judge", ("judge",))


def test_leniency_gate_withholds_promotions_of_a_lenient_judge():
    lenient = ["WRONG"] * 18 + ["CORRECT"] * 2  # 90% < 95%
    out = route_pair(QA, _work([_gen("a")], judge={"a": "CORRECT"}, known_wrong=lenient))
    assert (out.accepted, out.reason, out.withheld) == (False, "judge_withheld", 1)
    strict = ["WRONG"] * 19 + ["CORRECT"]  # 95%
    out = route_pair(QA, _work([_gen("a")], judge={"a": "CORRECT"}, known_wrong=strict))
    assert (out.accepted, out.via, out.promoted) == (True, "judge", "nine")
    # Unmeasured is untrusted; min_specificity 0 turns the gate off.
    out = route_pair(QA, _work([_gen("a")], judge={"a": "CORRECT"}, min_specificity=0.95))
    assert out.reason == "judge_withheld"
    out = route_pair(QA, _work([_gen("a")], judge={"a": "CORRECT"}, known_wrong=lenient, min_specificity=0.0))
    assert out.accepted
    # The gate only touches promotions: WRONG stays wrong_answer, UNSURE judge_unsure.
    assert route_pair(QA, _work([_gen("a")], judge={"a": "UNSURE"}, known_wrong=lenient)).reason == "judge_unsure"
