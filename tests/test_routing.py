"""rsgen.routing: who the judge sees (decisive mismatches aside) and the leniency gate, as tables."""

import logging

import pytest

from rsgen.records import GenerateRecord, JudgeRecord
from rsgen.routing import gate_lines, goes_to_judge, is_decisive, judge_trusted, route, specificity


def record(extracted, verifier="relaxed", match=False, reason="wrong_answer"):
    return GenerateRecord(key="k", id="k", sample=0, family="F", question="q", response="r", extracted=extracted,
                          match=match, reason=None if match else reason, verifier=verifier, prompt_tokens=1,
                          generated_tokens=1, hit_limit=False)


@pytest.mark.parametrize("rec, answers, options, scope, judged", [
    (record("10"), ["9"], None, "undecided", False),  # decisive
    (record("10"), ["9"], None, "all", True),
    (record("ten"), ["9"], None, "undecided", True),
    (record("C", "mc"), ["B"], ["x", "y", "z"], "undecided", False),
    (record("the round one", "mc", reason="mc_no_letter"), ["B"], ["x", "y", "z"], "undecided", True),
    (record(None, reason="no_answer"), ["9"], None, "all", False),  # nothing to judge
    (record("9", match=True), ["9"], None, "all", False),  # accepted
])
def test_goes_to_judge(rec, answers, options, scope, judged):
    assert goes_to_judge(rec, answers, options, scope, None) is judged


def test_only_wrong_answer_rejections_can_be_decisive():
    assert is_decisive(record("10"), ["9"], None, None)
    assert not is_decisive(record("10", reason="bad_input"), ["9"], None, None)


@pytest.mark.parametrize("rejected, total, minimum, trusted", [
    (58, 60, 0.95, True),
    (57, 60, 0.95, True),  # exactly 95%
    (56, 60, 0.95, False),
    (0, 0, 0.95, False),  # unmeasured is untrusted
    (0, 0, 0.0, True),  # the gate off
    (10, 60, 0.0, True),
])
def test_leniency_gate(rejected, total, minimum, trusted):
    assert judge_trusted(rejected, total, minimum) is trusted


def test_specificity_and_withheld_route():
    assert specificity(3, 4) == 0.75 and specificity(0, 0) is None
    correct = JudgeRecord(key="k", id="k", kind="rejected", reference="9", candidate="ten", verdict="CORRECT",
                          response="CORRECT", prompt_tokens=1, generated_tokens=1, hit_limit=False, model="m")
    assert route(record("ten"), correct, True, judged=True, trusted=True) == (True, None)
    assert route(record("ten"), correct, True, judged=True, trusted=False) == (False, "judge_withheld")
    assert route(record("10"), None, True, judged=False, trusted=True) == (False, "wrong_answer")  # decisive
    with pytest.raises(TypeError, match="trusted"):  # no default: a caller cannot skip the gate by forgetting it
        route(record("ten"), correct, True, judged=True)


def counts(judged=3, withheld=0, kw=(60, 60), kr=(40, 50)):
    return {"judged": judged, "withheld": withheld, "known_wrong_rejected": kw[0], "known_wrong_total": kw[1],
            "known_right_promoted": kr[0], "known_right_total": kr[1]}


@pytest.mark.parametrize("family, expected", [
    (counts(), []),
    (counts(judged=0, kw=(0, 10)), [(logging.INFO, "was never consulted")]),  # says so instead of "untrusted"
    (counts(kw=(10, 60), withheld=2), [(logging.WARNING, "said WRONG to only 10/60")]),
    (counts(kw=(0, 0)), [(logging.WARNING, "could not be measured")]),
    (counts(kr=(0, 50)), [(logging.WARNING, "said CORRECT to only 0/50 known-right pairs")]),
    (counts(kr=(25, 50)), []),  # exactly judge_min_recall
    (counts(kr=(0, 0)), []),  # recall unmeasured: nothing to report
    (counts(kw=(0, 60), kr=(50, 50)), [(logging.WARNING, "said WRONG to only 0/60")]),
])
def test_gate_lines(family, expected):
    lines = gate_lines({"F": family}, 0.95, 0.5)
    assert [level for level, _ in lines] == [level for level, _ in expected]
    for (_, line), (_, part) in zip(lines, expected):
        assert part in line and line.startswith("family F: ")
