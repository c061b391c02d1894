"""Decisive mismatches: which verifier rejections are final (the judge never sees them), as a table."""

import pytest

from rsgen.verifiers import compare
from rsgen.verifiers.decisive import decisive_mismatch

OPTIONS = ["red", "blue", "green", "cyan"]

CASES = [
    # verifier, candidate, references, options, tolerance, decisive
    ("relaxed", "10", "9", None, None, True),  # the demo's 9 -> 10
    ("relaxed", "8", ["7"], None, None, True),
    ("relaxed", "106", "100", None, None, True),  # just beyond 5%
    ("relaxed", "105", "100", None, None, False),  # a match is never decisive
    ("relaxed", "1", "0", None, None, True),  # reference 0 needs exactly 0
    ("relaxed", "0.0", "0", None, None, False),
    ("relaxed", "12 apples", "9", None, None, True),  # a unit on one side is still a number
    ("relaxed", "45%", "0.45", None, None, False),  # a percent reading agrees: the verifier matched
    ("relaxed", "12 kg", "12 m", None, None, False),  # values agree, units differ: the judge decides
    ("relaxed", "13 kg", "12 m", None, None, True),
    ("relaxed", "ten", "10", None, None, False),  # a word for a number: the judge's job
    ("relaxed", "10", "ten", None, None, False),
    ("relaxed", "fig", "lime", None, None, False),  # text: undecided
    ("relaxed", "7", ["7.0", "seven"], None, None, False),  # matches one reference
    ("relaxed", "8", ["7", "seven"], None, None, False),  # one reference is not a number
    ("relaxed", "8", ["7", "9"], None, None, True),
    ("relaxed", "5 apples, not 6", "6", None, None, False),  # not a number
    ("relaxed", None, "6", None, None, False),  # no answer
    ("relaxed", "", "6", None, None, False),
    ("numeric", "3.1416", "3.14159", None, 1e-3, False),
    ("numeric", "3.15", "3.14159", None, 1e-3, True),
    ("numeric", "1000001", "1000000", None, None, False),  # relative above 1: within 1e-6
    ("numeric", "1000002", "1000000", None, None, True),
    ("numeric", "yes", "no", None, None, False),
    ("mc", "C", "B", None, None, True),
    ("mc", "(C)", "B", None, None, True),
    ("mc", "c", "B", None, None, True),
    ("mc", "B", "B", None, None, False),
    ("mc", "C", ["B", "C"], None, None, False),
    ("mc", "C", "blue", OPTIONS, None, True),  # the reference is option B's text
    ("mc", "B", "blue", OPTIONS, None, False),
    ("mc", "green", "B", OPTIONS, None, True),  # another option, by its text
    ("mc", "it is green", "B", OPTIONS, None, False),  # a sentence: the judge reads it
    ("mc", "C", "the blue one", OPTIONS, None, False),  # no reference letter: bad input
    ("exact", "10", "9", None, None, False),  # other verifiers: never decisive
    ("math", "10", "9", None, None, False),
    # A row with options is multiple choice under every verifier: another option, by letter or by text, is final.
    *[(v, "A", "B", OPTIONS, None, True) for v in ("relaxed", "exact", "numeric", "math")],
    *[(v, "green", "B", OPTIONS, None, True) for v in ("relaxed", "exact", "numeric", "math")],
    *[(v, "(b)", "blue", OPTIONS, None, False) for v in ("relaxed", "exact", "numeric", "math")],
    ("relaxed", "7", "B", ["7", "8", "9"], None, True),  # option texts that are numbers: the option decides
    ("relaxed", "8", "B", ["7", "8", "9"], None, False),
    ("relaxed", "A", "B", [], None, False),  # no options: free form, two words
]


@pytest.mark.parametrize("verifier, candidate, references, options, tolerance, decisive", CASES)
def test_decisive_mismatch(verifier, candidate, references, options, tolerance, decisive):
    got = decisive_mismatch(verifier, candidate, references, options=options, numeric_tolerance=tolerance)
    assert got is decisive


@pytest.mark.parametrize("verifier, candidate, references, options, tolerance, decisive", CASES)
def test_decisive_implies_the_verifier_rejects(verifier, candidate, references, options, tolerance, decisive):
    if decisive:
        assert not compare(verifier, candidate, references, options=options, numeric_tolerance=tolerance).match
