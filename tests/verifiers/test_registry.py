"""The public API of rsgen.verifiers, its registry, and how light it is to import."""

import subprocess
import sys

import pytest

import rsgen.verifiers as verify
from rsgen.config import RecipeError, recipe_from_dict
from rsgen.verifiers import VERIFIERS, Decision, Extraction, compare, extract_answer, verify_response

RAW = [
    ("<think>a</think>The answer is 41.", "42", {"relaxed": True, "exact": False, "numeric": False}),
    ("Answer: (B) blue", "B", {"mc": True}),
    ("\\boxed{\\frac{2}{4}}", "\\frac{1}{2}", {"math": True, "exact": False}),
    (
        "<think>cut off",
        "42",
        {"relaxed": False, "exact": False, "numeric": False, "mc": False, "math": False},
    ),
]


def test_public_names():
    for name in [
        "VERIFIERS",
        "extract_answer",
        "compare",
        "verify_response",
        "reward_function",
        "Extraction",
        "Decision",
    ]:
        assert hasattr(verify, name), name
    assert set(VERIFIERS) == {"relaxed", "exact", "numeric", "mc", "math"}
    assert all(callable(fn) for fn in VERIFIERS.values())


@pytest.mark.parametrize("response,reference,expected", RAW)
def test_verify_response_is_extraction_then_compare(response, reference, expected):
    extraction = extract_answer(response)
    for name, match in expected.items():
        decision = verify_response(name, response, reference)
        assert decision.match is match
        if extraction.answer is None:
            assert decision == Decision(False, "no_answer", None)
        else:
            assert decision == compare(name, extraction.answer, reference)
            assert decision == VERIFIERS[name](extraction.answer, reference)


def test_value_types():
    decision = compare("relaxed", "5", "5")
    assert decision == Decision(match=True, reason=None, extracted="5")
    assert (decision.match, decision.reason, decision.extracted) == (True, None, "5")
    assert extract_answer("5") == Extraction(answer="5", reason=None)
    with pytest.raises(AttributeError):
        decision.match = False  # immutable


def test_importing_rsgen_verify_stays_light():
    """config.py imports rsgen.verifiers to validate names: that must not pull in torch, trl or math-verify."""
    code = (
        "import sys, rsgen.verifiers, rsgen.config\n"
        "heavy = [m for m in ('torch', 'transformers', 'trl', 'datasets', 'evaluate', 'math_verify', 'sympy') "
        "if m in sys.modules]\n"
        "print(','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_recipes_validate_verifier_names_against_the_registry():
    for name in VERIFIERS:
        assert recipe_from_dict({"verifier": name}).verifier == name
    assert recipe_from_dict({"verifier": {"ChartQA": "relaxed", "default": "mc"}}).verifier_for("X") == "mc"
    with pytest.raises(RecipeError, match="unknown verifier"):
        recipe_from_dict({"verifier": "fuzzy"})
