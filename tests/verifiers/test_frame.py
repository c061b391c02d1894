"""The frame every verifier shares: one signature, the input checks before the rule, settings checked loudly."""

import inspect

import pytest

from rsgen.verifiers import VERIFIERS, Decision, compare
from rsgen.verifiers.frame import verifier

NAMES = sorted(VERIFIERS)


def test_every_registered_verifier_has_the_one_signature():
    signatures = {name: str(inspect.signature(fn)) for name, fn in VERIFIERS.items()}
    assert len(set(signatures.values())) == 1, signatures
    parameters = inspect.signature(VERIFIERS["relaxed"]).parameters
    assert list(parameters) == ["prediction", "references", "options", "numeric_tolerance", "timeout_seconds"]
    assert all(parameters[k].kind is inspect.Parameter.KEYWORD_ONLY for k in list(parameters)[2:])


def test_a_rule_sees_checked_inputs_only():
    seen = []

    @verifier
    def spy(prediction, references, options, numeric_tolerance, timeout_seconds):
        """A rule that records what reaches it."""
        seen.append((prediction, references, options, numeric_tolerance, timeout_seconds))
        return Decision(True, None, prediction)

    assert spy.__name__ == "spy" and spy.__doc__ == "A rule that records what reaches it."
    assert spy("5", "5") == Decision(True, None, "5")
    assert spy("5", ["", " ", "6", "7"], options=[], numeric_tolerance=0.5, timeout_seconds=2) == (
        Decision(True, None, "5")
    )
    assert seen == [("5", ("5",), None, None, None), ("5", ("6", "7"), [], 0.5, 2)]
    # A row with options is multiple choice: mc's rule decides it, whatever rule the verifier has.
    assert spy("(A)", "B", options=["x", "y"]) == Decision(False, "wrong_answer", "A")
    assert spy("yes", "B", options=["no", "yes"]) == Decision(True, None, "B")
    # Bad data never reaches the rule: it is a non-match with a reason.
    assert spy(None, "5").reason == "no_answer"
    assert spy(" ", "5").reason == "no_answer"
    assert spy(5, "5").reason == "bad_input"
    assert spy("5", [None]).reason == "bad_input"
    assert spy("5", "5", options="a,b").reason == "bad_input"
    assert len(seen) == 2


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("options", ["red,blue", [1, 2], [None, "x"], 5, {"A": "red"}])
def test_bad_options_are_bad_input_for_every_verifier(name, options):
    decision = compare(name, "B", "B", options=options)
    assert (decision.match, decision.reason) == (False, "bad_input")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "setting,value",
    [
        ("numeric_tolerance", -1e-3),
        ("numeric_tolerance", float("nan")),
        ("numeric_tolerance", float("inf")),
        ("numeric_tolerance", "0.1"),
        ("numeric_tolerance", True),
        ("timeout_seconds", 0),
        ("timeout_seconds", -1.0),
        ("timeout_seconds", float("inf")),
        ("timeout_seconds", "5"),
    ],
)
def test_bad_settings_are_a_clear_error_for_every_verifier(name, setting, value):
    # A recipe mistake: it raises even on rows without an answer, so the first rows cannot hide it.
    for prediction in ("B", None):
        with pytest.raises(ValueError, match=f"{setting} must be a finite number"):
            compare(name, prediction, "B", **{setting: value})


@pytest.mark.parametrize("name", NAMES)
def test_options_tuples_and_defaults_are_accepted(name):
    assert compare(name, "B", "B", options=("red", "blue"), numeric_tolerance=0, timeout_seconds=1).match
    answer = "B" if name == "mc" else "3"
    assert compare(name, answer, answer, options=(), numeric_tolerance=0, timeout_seconds=1).match
