"""Known-wrong calibration pairs: near misses and unrelated answers, each rejected by its verifier."""

import random

import pytest

from rsgen.judge.calibration import (
    NEAR_NUMBER,
    NEIGHBOUR_LETTER,
    OTHER_REFERENCE,
    UNRELATED,
    is_known_wrong,
    known_wrong_pairs,
    near_number,
    neighbour_letter,
)
from rsgen.verify import compare


@pytest.mark.parametrize("reference, verifier, tolerance, expected", [
    ("9", "relaxed", None, {"8", "10"}),
    ("0", "relaxed", None, {"1"}),  # never below zero for a non-negative reference
    ("100", "relaxed", None, {"94", "106"}),  # 5% of 100 is 5: six away is just beyond
    ("40", "relaxed", None, {"37", "43"}),
    ("45%", "relaxed", None, {"42%", "48%"}),
    ("12 kg", "relaxed", None, {"11 kg", "13 kg"}),
    ("1000000", "numeric", None, {"999998", "1000002"}),
    ("3", "numeric", 0.5, {"1", "5"}),  # 0.5 * 3 = 1.5: two away is just beyond
])
def test_near_number_is_just_beyond_the_tolerance(reference, verifier, tolerance, expected):
    seen = {near_number(reference, verifier, tolerance, random.Random(seed)) for seed in range(20)}
    assert seen == expected
    for candidate in seen:
        assert not compare(verifier, candidate, reference, numeric_tolerance=tolerance).match


def test_near_number_of_a_fraction_is_rejected():
    for seed in range(20):
        candidate = near_number("0.37", "relaxed", None, random.Random(seed))
        assert not compare("relaxed", candidate, "0.37").match
        assert abs(float(candidate) - 0.37) < 0.05  # still near


def test_near_number_of_a_word_is_none():
    assert near_number("lime", "relaxed", None, random.Random(0)) is None


@pytest.mark.parametrize("reference, options, expected", [
    ("B", ["a", "b", "c"], {"A", "C"}),
    ("A", ["a", "b", "c"], {"B"}),
    ("C", ["a", "b", "c"], {"B"}),  # no D among three options
    ("b", None, {"A", "C"}),
    ("blue", ["red", "blue"], {"A"}),  # a reference given as option text
    ("fig", None, {None}),
])
def test_neighbour_letter(reference, options, expected):
    assert {neighbour_letter(reference, options, random.Random(seed)) for seed in range(20)} == expected


@pytest.mark.parametrize("candidate, references, verifier, options, known_wrong", [
    ("fig", ["lime"], "relaxed", None, True),
    ("10", ["9"], "relaxed", None, True),
    ("9.2", ["9"], "relaxed", None, False),  # within 5%: the verifier accepts it
    ("ten", ["10"], "relaxed", None, False),  # a word that may mean the reference: not known wrong
    ("large", ["large sphere"], "relaxed", None, False),  # contained in the reference
    ("C", ["B"], "mc", ["x", "y", "z"], True),
    ("yes", ["B"], "mc", ["no", "yes", "maybe"], False),  # option B's text: the verifier accepts it
    ("seven", ["7"], "relaxed", None, False),
    ("purple elephant", ["7"], "relaxed", None, True),
    ("", ["B"], "mc", None, False),
])
def test_is_known_wrong(candidate, references, verifier, options, known_wrong):
    assert is_known_wrong(candidate, references, verifier, options, None) is known_wrong


def pool():
    prepared = {}
    for i in range(40):
        prepared[f"num{i:02d}"] = {"family": "Count", "answers": [str(i % 11)], "options": []}
    fruits = ["lime", "fig", "apple", "plum"]
    for i in range(40):
        answer = fruits[i % 4] if i % 2 else str(i % 9 + 1)
        prepared[f"chart{i:02d}"] = {"family": "Chart", "answers": [answer], "options": []}
    for i in range(40):
        prepared[f"mc{i:02d}"] = {"family": "MC", "answers": ["ABCD"[i % 4]], "options": ["w", "x", "y", "z"]}
    return prepared


VERIFIERS = {"Count": "relaxed", "Chart": "relaxed", "MC": "mc"}


def test_known_wrong_pairs_per_family_every_one_rejected_by_its_verifier():
    prepared = pool()
    pairs = known_wrong_pairs(prepared, VERIFIERS.get, size=20, seed=0)
    assert {f: sum(p.family == f for p in pairs) for f in VERIFIERS} == {"Count": 20, "Chart": 20, "MC": 20}
    for p in pairs:
        qa = prepared[p.id]
        assert qa["family"] == p.family
        assert is_known_wrong(p.candidate, qa["answers"], VERIFIERS[p.family], qa["options"] or None, None)
        assert not compare(VERIFIERS[p.family], p.candidate, qa["answers"], options=qa["options"] or None).match
    misses = {(p.family, p.miss) for p in pairs}
    # Near misses of every kind, and unrelated answers, all present.
    assert {("Count", NEAR_NUMBER), ("Count", OTHER_REFERENCE), ("Count", UNRELATED)} <= misses
    assert {("Chart", NEAR_NUMBER), ("Chart", OTHER_REFERENCE), ("Chart", UNRELATED)} <= misses
    assert {("MC", NEIGHBOUR_LETTER), ("MC", OTHER_REFERENCE), ("MC", UNRELATED)} <= misses
    words = [p for p in pairs if p.family == "Chart" and p.miss == OTHER_REFERENCE
             and prepared[p.id]["answers"][0] in ("lime", "fig", "apple", "plum")]
    assert words and all(p.candidate in ("lime", "fig", "apple", "plum") for p in words)  # a word for a word


def test_known_wrong_pairs_are_fixed_by_the_seed():
    prepared = pool()
    first = known_wrong_pairs(prepared, VERIFIERS.get, size=10, seed=3)
    shuffled = dict(sorted(prepared.items(), reverse=True))
    assert known_wrong_pairs(shuffled, VERIFIERS.get, size=10, seed=3) == first  # order of the pool is irrelevant
    assert known_wrong_pairs(prepared, VERIFIERS.get, size=10, seed=4) != first


def test_small_family_gives_what_it_has_and_size_zero_gives_nothing():
    prepared = {"only": {"family": "Tiny", "answers": ["3"], "options": []}}
    assert [p.id for p in known_wrong_pairs(prepared, lambda f: "relaxed", size=5, seed=0)] == ["only"]
    assert known_wrong_pairs(prepared, lambda f: "relaxed", size=0, seed=0) == []
