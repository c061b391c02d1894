"""A number whose "unit" is another answer glued to it states two answers, not one with a unit: the relaxed and
numeric verifiers reject it (the blind check saw `10twoCORRECT` accepted for the reference 10), while real units,
scale words and ordinals stay units."""

from __future__ import annotations

import pytest

from rsgen.verifiers import compare
from rsgen.verifiers.normalize import holds_another_answer, parse_number

GLUED = ["10twoCORRECT", "10 two", "10CORRECT", "10 yes", "10kgcorrect", "10twothree", "10 incorrect", "10 Wrong"]
UNITS = ["10 apples", "10kg", "10 km/h", "10 million", "10 years old", "10 tents", "10 tennis balls",
         "10 corrections", "10 tenths", "10 tons"]


@pytest.mark.parametrize("verifier", ["relaxed", "numeric"])
@pytest.mark.parametrize("prediction", GLUED)
def test_another_answer_glued_on_is_rejected(verifier, prediction):
    assert not compare(verifier, prediction, ["10"]).match


@pytest.mark.parametrize("verifier", ["relaxed", "numeric"])
@pytest.mark.parametrize("prediction", UNITS)
def test_a_real_unit_still_matches_on_the_number(verifier, prediction):
    assert compare(verifier, prediction, ["10"]).match


def test_the_unit_rule():
    assert parse_number("10twocorrect") is None and parse_number("10 two") is None
    assert parse_number("10 tents").unit == "tents"
    assert holds_another_answer("kgcorrect") and holds_another_answer("twocorrect")
    assert not holds_another_answer("fourths") and not holds_another_answer("years old")
