"""`numeric`: numbers equal within `numeric_tolerance` (absolute up to 1, relative above)."""

import pytest

from rsgen.verifiers import compare

# (prediction, references, tolerance or None for the default 1e-6, match)
CASES = [
    ("3", "3", None, True),
    ("3.0", "3", None, True),
    ("3.0000001", "3", None, True),
    ("3.00001", "3", None, False),
    ("1,000", "1000", None, True),
    ("1000.0005", "1,000", None, True),  # relative above 1: 5e-7
    ("1000.01", "1000", None, False),
    ("+5", "5", None, True),
    ("-5", "5", None, False),
    ("5 kg", "5", None, True),
    ("5 kg", "5 g", None, False),
    ("$5", "5", None, True),
    ("45%", "45", None, True),
    ("45%", "0.45", None, True),
    ("0.45", "45%", None, True),
    ("0", "0", None, True),
    ("0.0000001", "0", None, True),  # absolute tolerance near zero
    ("0.001", "0", None, False),
    ("0.001", "0", 0.01, True),
    ("3.1", "3", 0.05, True),
    ("3.2", "3", 0.05, False),
    ("105", "100", 0.05, True),
    ("106", "100", 0.05, False),
    ("3", "3", 0, True),
    ("3.0000001", "3", 0, False),
    ("three", "3", None, False),  # not a number: wrong
    ("nan", "3", None, False),
    ("inf", "3", None, False),
    ("1e400", "3", None, False),
    ("3", ["4", "3.0"], None, True),
    ("yes", "Yes", None, True),  # a non-numeric reference falls back to exact
    ("no", "Yes", None, False),
    ("3", "yes", None, False),
]


@pytest.mark.parametrize(
    "prediction,references,tolerance,match", CASES, ids=[f"{c[0]!r}-{c[1]!r}-{c[2]}" for c in CASES]
)
def test_numeric_table(prediction, references, tolerance, match):
    decision = compare("numeric", prediction, references, numeric_tolerance=tolerance)
    assert decision.match is match
    assert decision.reason == (None if match else "wrong_answer")


@pytest.mark.parametrize("tolerance", [-1, float("nan"), float("inf"), "0.1", True])
def test_bad_tolerance_is_a_clear_error(tolerance):
    with pytest.raises(ValueError, match="numeric_tolerance"):
        compare("numeric", "3", "3", numeric_tolerance=tolerance)
