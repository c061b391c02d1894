"""The judge's safeguards through the judge stage and emit, with judges whose verdicts the test controls (fakes:
these tests are about routing): decisive mismatches never reach the judge, nor do the calibration pairs it is
measured on; a judge that says CORRECT to everything is gated in every family where it is consulted, one that says
WRONG to everything shows known-right recall 0 (stats, card and log say so), and an answer-key judge passes both."""

from __future__ import annotations

import json
import logging

import pytest
from judge_helpers import FakeState, Pair, make_recipe, write_output_dir

from rsgen.emit import run_emit
from rsgen.judge import run_judge
from rsgen.layout import OutputLayout

MC = dict(family="MC", verifier="mc", options=("cube", "sphere", "cylinder"))
FRUITS = ["lime", "fig", "apple", "plum", "berry", "lemon"]
PAIRS = [
    *(Pair(f"c_acc{i}", [str(i)], match=True, extracted=str(i), family="Count") for i in range(10)),
    Pair("c_near", ["9"], match=False, extracted="10", family="Count"),  # decisive
    Pair("c_units", ["3"], match=False, extracted="12 apples", family="Count"),  # decisive
    Pair("c_word", ["3"], match=False, extracted="three", family="Count"),  # undecided: a word
    *(Pair(f"f_acc{i}", [fruit], match=True, extracted=fruit, family="Fruit") for i, fruit in enumerate(FRUITS)),
    Pair("f_other", ["lime"], match=False, extracted="fig", family="Fruit"),  # undecided: text
    Pair("f_num", ["4"], match=False, extracted="7", family="Fruit"),  # decisive
    *(Pair(f"p_acc{i}", [f"{i}.5"], match=True, extracted=f"{i}.5", family="Pi", verifier="numeric") for i in range(4)),
    Pair("p_near", ["3.14159"], match=False, extracted="3.15", family="Pi", verifier="numeric"),  # decisive
    *(Pair(f"m_acc{i}", ["ABC"[i % 3]], match=True, extracted="ABC"[i % 3], **MC) for i in range(6)),
    Pair("m_letter", ["B"], match=False, extracted="C", **MC),  # decisive
    Pair("m_text", ["B"], match=False, extracted="the round one", reason="mc_no_letter", **MC),  # undecided
]
DECISIVE = {"c_near", "c_units", "f_num", "p_near", "m_letter"}
UNDECIDED = {"c_word", "f_other", "m_text"}
VERIFIERS = {"Count": "relaxed", "Fruit": "relaxed", "Pi": "numeric", "MC": "mc"}


class ItemJudge:
    """A fake judge engine: `decide(item)` gives the verdict text for each judge item; every request is kept."""

    def __init__(self, decide):
        self.decide = decide
        self.requests = []

    def generate(self, requests):
        from rsgen.engine import GenerationResult

        for request in requests:
            self.requests.append(request)
            text = self.decide(request.meta)
            yield request, GenerationResult(text=text, prompt_tokens=10, generated_tokens=1, hit_limit=False)


def rubber_stamp(item):
    return "CORRECT"


def naysayer(item):
    return "WRONG"


def answer_key(item):
    """Right on every item here, because it reads the answer key: CORRECT for accepted and known-right pairs and
    for "three" against 3, WRONG for the rest."""
    right = item.kind in ("calibration", "known_right") or (item.candidate, item.reference) == ("three", "3")
    return "CORRECT" if right else "WRONG"


def judge_and_emit(root, decide, **overrides):
    write_output_dir(root, PAIRS)
    recipe = make_recipe(root, verifier=VERIFIERS, judge_calibration_size=8, **overrides)
    engine = ItemJudge(decide)
    run_judge(recipe, FakeState(), engine=engine)
    run_emit(recipe)
    layout = OutputLayout(root)
    return engine, json.loads(layout.stats_json.read_text()), (layout.dataset / "README.md").read_text()


@pytest.mark.parametrize("scope", ["undecided", "all"])
def test_decisive_mismatches_never_reach_the_judge(tmp_path, scope):
    engine, stats, _ = judge_and_emit(tmp_path, rubber_stamp, judge_scope=scope)
    judged = {r.meta.id for r in engine.requests if r.meta.kind == "rejected"}
    if scope == "undecided":
        assert judged == UNDECIDED  # the decisive mismatches were not sent
        assert stats["judge_counts"]["decisive"] == len(DECISIVE)
    else:
        assert judged == UNDECIDED | DECISIVE
        assert stats["judge_counts"]["decisive"] == 0
    assert stats["judge_counts"]["judged"] == len(judged)
    assert stats["judge_scope"] == scope


def test_a_judge_that_says_correct_to_everything_is_withheld_in_every_family(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rsgen")
    engine, stats, card = judge_and_emit(tmp_path, rubber_stamp, judge_scope="all")
    out = caplog.text
    for family, fam in stats["families"].items():
        assert fam["calibration"]["known_right_promoted"] == fam["calibration"]["known_right_total"]
        calib = fam["calibration"]
        assert calib["known_wrong_total"] > 0 and calib["known_wrong_rejected"] == 0, family
        assert fam["judge"]["gate"]["withheld"] is True
        assert fam["judge"]["promoted"] == 0 and fam["accepted_qa"] == fam["verifier_accepted_qa"]
        assert fam["judge"]["withheld"] == fam["judge"]["correct"] > 0
        assert fam["rejected_reasons"]["judge_withheld"] == fam["judge"]["withheld"]
        assert f"Warning — {family}:** the judge said `WRONG` to only 0/{calib['known_wrong_total']}" in card
        assert f"family {family}: the judge said WRONG to only 0/{calib['known_wrong_total']}" in out
    assert stats["calibration"]["known_wrong_rejected"] == 0
    assert stats["judge_counts"]["promoted"] == 0
    assert "false-promotion rate of 100.0%" in card
    # What the gate withheld is listed for a reader to check: "fig" for "lime" among it.
    withheld = stats["families"]["Fruit"]["judge"]["withheld_promotions"]
    assert {"question": next(p for p in PAIRS if p.id == "f_other").question, "reference": "lime",
            "candidate": "fig"} in withheld
    assert "**Fruit** — 2 withheld by the leniency gate:" in card and "| lime | fig |" in card
    # Under `judge_scope: all`, known-wrong pairs came from every family, decisive near misses among them.
    forms = {(r.meta.family, r.meta.miss) for r in engine.requests if r.meta.kind == "known_wrong"}
    assert {family for family, _ in forms} == set(VERIFIERS)
    assert {("Count", "near_number"), ("Fruit", "other_word"), ("MC", "neighbour_letter")} <= forms


def test_under_the_default_scope_the_rubber_stamp_is_withheld_where_consulted(tmp_path):
    """Pi's only rejection is decisive: the judge is never consulted there, and the card and stats say so instead of
    calling it untrusted; every family where it is consulted withholds its CORRECTs."""
    engine, stats, card = judge_and_emit(tmp_path, rubber_stamp)
    for family, fam in stats["families"].items():
        gate = fam["judge"]["gate"]
        assert gate["consulted"] is (family != "Pi"), family
        assert gate["withheld"] is (family != "Pi")
        assert fam["judge"]["promoted"] == 0
    assert "**Pi:** the judge was never consulted" in card and "Warning — Pi" not in card
    # The known-wrong pairs the judge was shown are all ones the decisive rule leaves undecided.
    shown = [r.meta for r in engine.requests if r.meta.kind == "known_wrong"]
    assert shown and not {item.miss for item in shown} & {"near_number", "neighbour_letter"}


def test_a_judge_that_says_wrong_to_everything_has_known_right_recall_zero(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="rsgen")
    engine, stats, card = judge_and_emit(tmp_path, naysayer)
    calib = stats["calibration"]
    assert calib["known_right_total"] > 0 and calib["known_right_promoted"] == 0
    assert calib["known_wrong_rejected"] == calib["known_wrong_total"] > 0  # the other side it passes
    for family in ("Count", "Fruit"):
        fam = stats["families"][family]
        c = fam["calibration"]
        assert c["known_right_total"] > 0 and fam["judge"]["gate"]["recall"] == 0.0, family
        assert fam["judge"]["gate"]["adds_little"] is True
        assert f"**Note — {family}:** the judge said `CORRECT` to only 0/{c['known_right_total']}" in card
        assert f"family {family}: the judge said CORRECT to only 0/{c['known_right_total']} known-right" in caplog.text
    assert f"it said `CORRECT` to 0/{calib['known_right_total']} right answers rewritten" in card
    assert "**recall of 0.0%**" in card


def test_an_answer_key_judge_passes_the_gate_and_its_promotions_are_listed(tmp_path):
    _, stats, card = judge_and_emit(tmp_path, answer_key)
    count = stats["families"]["Count"]
    assert count["judge"]["gate"] == {"min_specificity": 0.95, "specificity": 1.0, "withheld": False,
                                      "consulted": True, "min_recall": 0.5, "recall": 1.0, "adds_little": False}
    assert count["calibration"]["known_right_promoted"] == count["calibration"]["known_right_total"] > 0
    for side in ("accepted", "known_wrong", "known_right"):
        assert count["calibration"]["examples"][side], side  # examples of each side, shown on the card
    assert "**Count** — known-right pairs (should be `CORRECT`):" in card
    assert count["calibration"]["agreed"] == count["calibration"]["total"] > 0
    assert count["judge"]["promoted"] == 1 and count["judge"]["withheld"] == 0
    assert count["judge"]["promotions"] == [
        {"question": next(p for p in PAIRS if p.id == "c_word").question, "reference": "3", "candidate": "three"}]
    assert "| three |" in card and "Warning —" not in card
    fruit = stats["families"]["Fruit"]
    assert fruit["judge"]["promoted"] == 0 and fruit["rejected_reasons"]["wrong_answer"] == 2
    assert "false-promotion rate of 0.0%" in card
    assert "`judge_scope: undecided`: 5 decisive mismatches" in card
