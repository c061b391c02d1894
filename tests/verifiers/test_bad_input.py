"""Bad input never crashes a verifier: it is a non-match with a reason (or, for configuration, a clear error)."""

import time

import pytest

from rsgen.verifiers import REASONS, VERIFIERS, Decision, compare, verify_response

NAMES = sorted(VERIFIERS)

# (prediction, references, reason)
BAD = [
    (None, "3", "no_answer"),  # extraction found nothing
    ("", "3", "no_answer"),
    ("   \n", "3", "no_answer"),
    (3, "3", "bad_input"),  # numbers instead of strings
    (3.0, "3", "bad_input"),
    (float("nan"), "3", "bad_input"),
    (True, "3", "bad_input"),
    (b"3", "3", "bad_input"),
    (["3"], "3", "bad_input"),
    ({"content": "3"}, "3", "bad_input"),
    ("3", None, "bad_input"),
    ("3", 3, "bad_input"),
    ("3", 3.0, "bad_input"),
    ("3", float("nan"), "bad_input"),
    ("3", [], "bad_input"),  # empty lists
    ("3", (), "bad_input"),
    ("3", [3], "bad_input"),
    ("3", ["3", 4], "bad_input"),
    ("3", [None], "bad_input"),
    ("3", "", "bad_input"),
    ("3", "  ", "bad_input"),
    ("3", ["", " "], "bad_input"),
    ("3", {"answer": "3"}, "bad_input"),
    ("3", b"3", "bad_input"),
]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("prediction,references,reason", BAD, ids=[f"{c[0]!r}-{c[1]!r}" for c in BAD])
def test_bad_input_is_a_non_match_with_a_reason(name, prediction, references, reason):
    decision = compare(name, prediction, references)
    assert isinstance(decision, Decision)
    assert decision.match is False
    assert decision.reason == reason


TEXT_THAT_LOOKS_MISSING = ["nan", "NaN", "NAN", "inf", "-inf", "Infinity", "None", "null", "NULL"]


@pytest.mark.parametrize("name", ["relaxed", "exact", "numeric"])
@pytest.mark.parametrize("text", TEXT_THAT_LOOKS_MISSING)
def test_references_that_look_missing_are_text(name, text):
    """A reference is text whatever it says (the README says so): it matches itself and nothing else."""
    assert compare(name, text, text) == (True, None, text)
    assert compare(name, text.lower(), [text, "other"]).match is True
    wrong = compare(name, "3", text)
    assert (wrong.match, wrong.reason) == (False, "wrong_answer")
    assert compare(name, "nan", "inf").match is False


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("response", [None, 3, 3.5, float("inf"), b"x", ["x"], {"content": "x"}])
def test_bad_responses(name, response):
    decision = verify_response(name, response, "3")
    assert (decision.match, decision.reason, decision.extracted) == (False, "bad_input", None)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e-400"])
def test_nan_and_inf_text_never_crash(name, text):
    for prediction, references in [(text, "3"), ("3", [text, "4"]), (text, [text, "4"])]:
        decision = compare(name, prediction, references)
        assert isinstance(decision.match, bool)
        assert decision.reason in (None, *REASONS)
        if prediction == text and references == "3":
            assert decision.match is False
    if name in ("relaxed", "numeric"):
        assert compare(name, "1e-400", "0").match is True  # underflows to 0.0, a finite number


@pytest.mark.parametrize("name", NAMES)
def test_very_long_strings(name):
    long_digits = "9" * 1_000_000
    long_text = "word " * 200_000
    start = time.perf_counter()
    for prediction, reference in [
        (long_digits, "9"),
        (long_text, "word"),
        ("9", long_digits),
        (long_text, long_text),
    ]:
        decision = compare(name, prediction, reference, options=["word", "other"] if name == "mc" else None)
        assert isinstance(decision.match, bool)
        assert decision.reason in (None, *REASONS)
    decision = verify_response(name, "<think>" + long_text + "</think>" + long_digits, "9")
    assert decision.match is False
    assert time.perf_counter() - start < 10.0


def test_long_identical_texts_match_under_string_verifiers():
    long_text = "word " * 200_000
    for name in ("relaxed", "exact", "math"):
        assert compare(name, long_text, long_text).match is True


@pytest.mark.parametrize("name", [None, 3, "", "Relaxed", "chartqa", ["relaxed"]])
def test_unknown_verifier_is_a_clear_error(name):
    with pytest.raises(ValueError, match="unknown verifier"):
        compare(name, "3", "3")
    with pytest.raises(ValueError, match="unknown verifier"):
        verify_response(name, "3", "3")


@pytest.mark.parametrize("name", NAMES)
def test_unknown_keyword_is_a_clear_error(name):
    with pytest.raises(TypeError):
        compare(name, "3", "3", tolerance=0.1)


@pytest.mark.parametrize("name", NAMES)
def test_shared_keywords_are_accepted_by_every_verifier(name):
    # The generate stage passes both to whichever verifier a family uses.
    answer = "B" if name == "mc" else "3"
    decision = compare(name, answer, answer, options=None, numeric_tolerance=1e-6, timeout_seconds=5.0)
    assert decision.match is True
