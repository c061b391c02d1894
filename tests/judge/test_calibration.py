"""Calibration pairs built from the pool (rsgen.judge.calibration): known-wrong pairs in named forms, each rejected
by its verifier and, under `judge_scope: undecided`, left undecided by the decisive rule; known-right pairs,
meaning-preserving rewrites the verifier rejects and the decisive rule leaves to the judge."""

import random

import pytest

from rsgen.judge.calibration import (
    DECISIVE_FORMS,
    KNOWN_RIGHT,
    KNOWN_RIGHT_FORMS,
    KNOWN_WRONG,
    KNOWN_WRONG_FORMS,
    counted_noun,
    form_candidate,
    known_right_pairs,
    known_wrong_pairs,
    near_number,
    neighbour_letter,
    number_word,
    question,
)
from rsgen.verifiers import compare
from rsgen.verifiers.decisive import decisive_mismatch


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


@pytest.mark.parametrize("value, word", [(0, "zero"), (7, "seven"), (19, "nineteen"), (20, "twenty"),
                                         (42, "forty-two"), (99, "ninety-nine"), (100, None), (2.5, None), (-1, None)])
def test_number_word(value, word):
    assert number_word(value) == word


@pytest.mark.parametrize("text, noun", [
    ("How many red cubes are there?", "red cubes"),
    ("Subtract 2 big things. How many big things are left?", "big things"),
    ("How many are left?", None),
    ("Add 1 large metal spheres. How many large metal spheres exist?", "large metal spheres"),
    ("What is the value of fig?", None),
])
def test_counted_noun(text, noun):
    assert counted_noun(text) == noun


COUNT = "How many red cubes are there?"
MC_OPTIONS = ["blue ball", "red cube", "green cylinder"]
FRUITS = ["lime", "fig", "apple", "plum"]


# (side, form, reference, options, question text, verifier, candidates it may give; empty: the form gives none here)
FORM_TABLE = [
    (KNOWN_WRONG, "near_number", "10", None, COUNT, "relaxed", {"9", "11"}),  # decisive: only under `all`
    (KNOWN_WRONG, "number_word", "10", None, COUNT, "relaxed", {"nine", "eleven"}),
    (KNOWN_WRONG, "number_word", "fig", None, "Which fruit?", "relaxed", set()),
    (KNOWN_WRONG, "sentence", "10", None, COUNT, "relaxed", {"There are 9 red cubes.", "There are 11 red cubes."}),
    (KNOWN_WRONG, "sentence", "fig", None, "Which fruit?", "relaxed",
     {"The answer is lime.", "The answer is apple.", "The answer is plum."}),
    (KNOWN_WRONG, "other_word", "fig", None, "Which fruit?", "relaxed", {"lime", "apple", "plum"}),
    (KNOWN_WRONG, "neighbour_letter", "B", MC_OPTIONS, "Which?", "mc", {"A", "C"}),  # decisive
    (KNOWN_WRONG, "option_text", "B", MC_OPTIONS, "Which?", "mc", {"It is the blue ball.", "It is the green cylinder."}),
    (KNOWN_WRONG, "option_text", "10", None, COUNT, "relaxed", set()),
    (KNOWN_RIGHT, "number_word", "10", None, COUNT, "relaxed", {"ten"}),
    (KNOWN_RIGHT, "number_word", "12 kg", None, "How heavy?", "relaxed", set()),
    (KNOWN_RIGHT, "count_noun", "10", None, COUNT, "relaxed", {"ten red cubes"}),  # "10 red cubes" is accepted
    (KNOWN_RIGHT, "article", "fig", None, "Which fruit?", "relaxed", {"a fig"}),
    (KNOWN_RIGHT, "article", "apple", None, "Which fruit?", "exact", {"an apple"}),
    (KNOWN_RIGHT, "plural", "fig", None, "Which fruit?", "relaxed", {"figs"}),
    (KNOWN_RIGHT, "option_text", "B", MC_OPTIONS, "Which?", "mc", set()),  # the verifier accepts the option's text
    (KNOWN_RIGHT, "sentence", "10", None, COUNT, "relaxed", {"There are 10 red cubes."}),
    (KNOWN_RIGHT, "sentence", "fig", None, "Which fruit?", "exact", {"The answer is fig."}),
]


@pytest.mark.parametrize("side, form, reference, options, text, verifier, expected", FORM_TABLE)
@pytest.mark.parametrize("scope", ["undecided", "all"])
def test_each_form_gives_what_it_names_and_only_usable_candidates(side, form, reference, options, text, verifier,
                                                                 expected, scope):
    seen = set()
    for seed in range(12):
        q = question({"answers": [reference], "options": options, "question": text}, verifier, seed=seed,
                     same_kind=[*FRUITS] if reference in FRUITS else [], other_families=["purple elephant"])
        candidate = form_candidate(side, form, q, scope)
        if candidate is None:
            continue
        seen.add(candidate)
        # Every candidate is a verifier rejection; a known-right one is never decisive, nor a known-wrong one under
        # the default scope (the judge is never shown a decisive mismatch).
        assert not compare(verifier, candidate, [reference], options=options).match
        decisive = decisive_mismatch(verifier, candidate, [reference], options=options)
        assert not decisive or (side == KNOWN_WRONG and scope == "all")
    if side == KNOWN_WRONG and form in DECISIVE_FORMS and scope == "undecided":
        assert seen == set()
    else:
        assert seen == expected


def pool():
    prepared = {}
    for i in range(40):
        prepared[f"num{i:02d}"] = {"family": "Count", "answers": [str(i % 11)], "options": [],
                                   "question": "How many cubes are there?" if i % 2 else "Subtract 1 ball. How many?"}
    for i in range(40):
        answer = FRUITS[i % 4] if i % 2 else str(i % 9 + 1)
        prepared[f"chart{i:02d}"] = {"family": "Chart", "answers": [answer], "options": [], "question": "Which?"}
    for i in range(40):
        prepared[f"mc{i:02d}"] = {"family": "MC", "answers": ["ABCD"[i % 4]], "options": ["w", "x", "y", "z"],
                                  "question": "Which?"}
    return prepared


VERIFIERS = {"Count": "relaxed", "Chart": "relaxed", "MC": "mc"}


@pytest.mark.parametrize("scope", ["undecided", "all"])
def test_known_wrong_pairs_per_family_in_the_forms_the_judge_is_shown(scope):
    prepared = pool()
    pairs = known_wrong_pairs(prepared, VERIFIERS.get, size=20, seed=0, judge_scope=scope)
    assert {f: sum(p.family == f for p in pairs) for f in VERIFIERS} == {"Count": 20, "Chart": 20, "MC": 20}
    for p in pairs:
        qa = prepared[p.id]
        verifier = VERIFIERS[p.family]
        assert qa["family"] == p.family and p.form in KNOWN_WRONG_FORMS
        assert not compare(verifier, p.candidate, qa["answers"], options=qa["options"] or None).match
        decisive = decisive_mismatch(verifier, p.candidate, qa["answers"], options=qa["options"] or None)
        assert decisive is (p.form in DECISIVE_FORMS), p  # the decisive forms are the decisive candidates
    forms = {(p.family, p.form) for p in pairs}
    assert {("Count", "number_word"), ("Count", "sentence"), ("Chart", "other_word"), ("MC", "option_text")} <= forms
    if scope == "undecided":
        assert not {form for _, form in forms} & set(DECISIVE_FORMS)
    else:
        assert {("Count", "near_number"), ("MC", "neighbour_letter")} <= forms


def test_known_right_pairs_are_verifier_rejected_undecided_rewrites():
    prepared = pool()
    pairs = known_right_pairs(prepared, VERIFIERS.get, size=20, seed=0)
    assert {f: sum(p.family == f for p in pairs) for f in VERIFIERS} == {"Count": 20, "Chart": 20, "MC": 0}
    for p in pairs:
        qa = prepared[p.id]
        verifier = VERIFIERS[p.family]
        assert p.form in KNOWN_RIGHT_FORMS
        assert not compare(verifier, p.candidate, qa["answers"], options=qa["options"] or None).match
        assert not decisive_mismatch(verifier, p.candidate, qa["answers"], options=qa["options"] or None)
    forms = {(p.family, p.form) for p in pairs}
    assert {("Count", "number_word"), ("Count", "count_noun"), ("Count", "sentence"), ("Chart", "article"),
            ("Chart", "plural")} <= forms


@pytest.mark.parametrize("build", [known_wrong_pairs, known_right_pairs])
def test_pairs_are_fixed_by_the_seed(build):
    prepared = pool()
    first = build(prepared, VERIFIERS.get, size=10, seed=3)
    shuffled = dict(sorted(prepared.items(), reverse=True))
    assert build(shuffled, VERIFIERS.get, size=10, seed=3) == first  # order of the pool is irrelevant
    assert build(prepared, VERIFIERS.get, size=10, seed=4) != first


def test_small_family_gives_what_it_has_and_size_zero_gives_nothing():
    prepared = {"only": {"family": "Tiny", "answers": ["3"], "options": [], "question": "How many?"}}
    assert [p.id for p in known_wrong_pairs(prepared, lambda f: "relaxed", size=5, seed=0)] == ["only"]
    assert known_wrong_pairs(prepared, lambda f: "relaxed", size=0, seed=0) == []
    assert known_right_pairs(prepared, lambda f: "relaxed", size=0, seed=0) == []
