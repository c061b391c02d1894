"""`exact`: relaxed's normalisation, no numeric tolerance."""

import pytest

from rsgen.verifiers import compare

CASES = [
    ("Yes", "yes", True),
    ("yes.", "Yes", True),
    ("  blue ", "Blue", True),
    ("**3**", "3", True),
    ("\\text{cube}", "cube", True),
    ("New  York", "new york", True),
    ("3", "3", True),
    ("3.0", "3", False),
    ("1,000", "1000", False),
    ("+5", "5", False),
    ("45%", "45", False),
    ("105", "100", False),
    ("12 kg", "12", False),
    ("blue..", "blue", False),
    ("light blue", "blue", False),
    ("3", ["2", "3"], True),
    ("4", ["2", "3"], False),
    ("inf", "inf", True),
    ("", "3", False),  # no answer (reason checked below)
]


@pytest.mark.parametrize("prediction,references,match", CASES, ids=[f"{c[0]!r}-{c[1]!r}" for c in CASES])
def test_exact_table(prediction, references, match):
    decision = compare("exact", prediction, references)
    assert decision.match is match
    if not match:
        assert decision.reason == ("no_answer" if not prediction.strip() else "wrong_answer")
