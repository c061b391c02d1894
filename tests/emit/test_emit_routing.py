"""Routing of QA pairs into accepted / rejected (rsgen.emit.splits), with scripted work records."""

from __future__ import annotations

import pytest

from rsgen.emit.splits import EmitError, WorkRecords, route_pair


def _gen(key, sample=0, match=False, extracted="9", reason=None, question="q?", response="r"):
    qa_id = key.split("#")[0]
    return {"key": key, "id": qa_id, "sample": sample, "question": question, "response": response,
            "extracted": extracted, "match": match,
            "reason": None if match else (reason or ("no_answer" if extracted is None else "wrong_answer")),
            "verifier": "relaxed", "prompt_tokens": 1, "generated_tokens": 1, "hit_limit": False}


def _work(samples, judge=None, judge_enabled=True, num_samples=1):
    by_id = {}
    for rec in samples:
        by_id.setdefault(rec["id"], []).append(rec)
    verdicts = {k: {"key": k, "verdict": v, "generated_tokens": 1} for k, v in (judge or {}).items()}
    return WorkRecords(by_id, verdicts, {}, judge_enabled, num_samples)


QA = {"id": "a", "question": "q?", "answers": ["3"]}


@pytest.mark.parametrize(
    "gen, verdict, accepted, via, reason, wrong",
    [
        (_gen("a", match=True, extracted="3", response="R3"), None, True, "verifier", None, None),
        (_gen("a"), "CORRECT", True, "judge", None, None),
        (_gen("a"), "WRONG", False, "rejected", "wrong_answer", "9"),
        (_gen("a"), "UNSURE", False, "rejected", "judge_unsure", "9"),
        (_gen("a", extracted=None), None, False, "rejected", "no_answer", None),
    ],
)
def test_route_pair_follows_the_contract(gen, verdict, accepted, via, reason, wrong):
    work = _work([gen], {"a": verdict} if verdict else None)
    out = route_pair(QA, work)
    assert (out.accepted, out.via, out.reason, out.wrong_vlm) == (accepted, via, reason, wrong)
    if accepted:
        assert out.response == gen["response"]


def test_judge_disabled_keeps_the_verifier_reason():
    work = _work([_gen("a", reason="mc_ambiguous", extracted="B")], judge_enabled=False)
    out = route_pair(QA, work)
    assert (out.accepted, out.reason, out.wrong_vlm) == (False, "mc_ambiguous", "B")


def test_missing_verdict_is_an_error_not_a_silent_rejection():
    with pytest.raises(EmitError, match="rsgen judge"):
        route_pair(QA, _work([_gen("a")], judge={}))


def test_several_samples_first_accepted_response_and_rejection_from_sample_0():
    samples = [_gen("a#0", 0, extracted="7", response="R0"), _gen("a#1", 1, response="R1"),
               _gen("a#2", 2, match=True, extracted="3", response="R2")]
    # Sample 1 promoted by the judge comes before sample 2's verifier match.
    out = route_pair(QA, _work(samples, {"a#0": "WRONG", "a#1": "CORRECT"}, num_samples=3))
    assert (out.accepted, out.via, out.response) == (True, "judge", "R1")
    out = route_pair(QA, _work(samples[:2], {"a#0": "UNSURE", "a#1": "WRONG"}, num_samples=2))
    assert (out.accepted, out.reason, out.wrong_vlm) == (False, "judge_unsure", "7")


def test_unfinished_generate_and_foreign_questions_are_errors():
    with pytest.raises(EmitError, match="no generate record"):
        route_pair(QA, _work([]))
    with pytest.raises(EmitError, match="num_samples=2"):
        route_pair(QA, _work([_gen("a#0")], {"a#0": "WRONG"}, num_samples=2))
    with pytest.raises(EmitError, match="differs from the text the model received"):
        route_pair(QA, _work([_gen("a", question="q? ")], {"a": "WRONG"}))
