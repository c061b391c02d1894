"""The `evaluate` metric module: offline loading, outputs, card, and the same decisions as the library and the
TRL rewards."""

import re
from pathlib import Path

import pytest

from rsgen.metrics import METRIC_NAME, metric_path
from rsgen.verifiers import VERIFIERS, reward_function, verify_response

evaluate = pytest.importorskip("evaluate")  # a hard dependency; importorskip only keeps the import local


@pytest.fixture(scope="module")
def metrics():
    return {name: evaluate.load(metric_path(), name) for name in VERIFIERS}


def test_metric_path_points_at_the_module_and_its_card():
    path = Path(metric_path())
    assert path.is_dir() and path.name == METRIC_NAME
    assert (path / f"{METRIC_NAME}.py").is_file()
    assert (path / "README.md").is_file()


def test_loads_offline_from_any_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    metric = evaluate.load(metric_path(), "exact")
    assert metric.compute(predictions=["<think>x</think>Yes."], references=["yes"])["accuracy"] == 1.0


def test_outputs(metrics):
    results = metrics["relaxed"].compute(
        predictions=[
            "<think>The bar reads about 41.</think>The answer is 41.",
            "Answer: 7",
            "<think>cut off",
        ],
        references=["42", "8", "1"],
    )
    assert results == {
        "accuracy": pytest.approx(1 / 3),
        "matches": [True, False, False],
        "extracted": ["41.", "7", None],
        "reasons": [None, "wrong_answer", "no_answer"],
    }


def test_lists_of_references(metrics):
    results = metrics["relaxed"].compute(
        predictions=["12", "13", "x"], references=[["12", "twelve"], ["10", "13"], ["y"]]
    )
    assert results["matches"] == [True, True, False]


def test_mc_options_and_numeric_tolerance_and_math_timeout(metrics):
    mc = metrics["mc"].compute(
        predictions=["blue", "(A)"], references=["B", "B"], options=[["red", "blue"], ["red", "blue"]]
    )
    assert mc["matches"] == [True, False] and mc["extracted"] == ["B", "A"]
    numeric = metrics["numeric"].compute(
        predictions=["3.25", "3.5"], references=["3", "3"], numeric_tolerance=0.1
    )
    assert numeric["matches"] == [True, False]
    math = metrics["math"].compute(
        predictions=["\\boxed{(10^{7})!}", "\\boxed{1/2}"], references=["5", "0.5"], timeout_seconds=0.5
    )
    assert math["reasons"] == ["math_timeout", None]


def test_default_configuration_is_relaxed():
    metric = evaluate.load(metric_path())
    assert metric.verifier == "relaxed"
    assert metric.compute(predictions=["104"], references=["100"])["accuracy"] == 1.0


def test_unknown_configuration_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown verifier 'fuzzy'"):
        evaluate.load(metric_path(), "fuzzy")


def test_options_length_mismatch_is_a_clear_error():
    mc = evaluate.load(metric_path(), "mc")  # evaluate keeps a failed batch's format: a metric of its own
    with pytest.raises(ValueError, match=r"Mismatch in the number of predictions \(2\) and options \(1\)"):
        mc.compute(predictions=["A", "B"], references=["A", "B"], options=[["x", "y"]])


def test_options_are_a_feature_of_every_verifier_kept_by_add_batch(metrics):
    for name in VERIFIERS:
        assert "options" in metrics[name].features, name
    relaxed = metrics["relaxed"]
    relaxed.add_batch(predictions=["blue"], references=["B"], options=[["red", "blue"]])
    relaxed.add_batch(predictions=["green"], references=["B"], options=[["red", "blue"]])
    relaxed.add(prediction="b.", reference="B")  # options may be left out: free form
    relaxed.add(prediction="7", reference="7")
    result = relaxed.compute()
    assert result["matches"] == [True, False, True, True] and result["extracted"] == ["B", "green", "b.", "7"]
    assert metrics["mc"].compute(predictions=["B"], references=["B"])["accuracy"] == 1.0


MIXED = [
    # (prediction, reference, options): text and list references, rows with and without options
    ("4", "4", []),
    ("four", ["4", "four"], []),
    ("5", ["4", "four"], []),
    ("<think>x</think>B", "B", ["red", "blue"]),
    ("red", ["B"], ["red", "blue"]),
    ("nan", "nan", []),
    ("None", ["None", "null"], []),
    ("12", ["12", "twelve"], []),
]


@pytest.mark.parametrize("name", ["relaxed", "exact", "numeric"])
def test_a_rows_result_is_its_own_whatever_the_other_rows(name):
    """Issue #28.1: `evaluate` fixed the input format from the first example, so a list reference after a text one
    was read as the text "['4', 'four']". Each row's result must be what verify_response says for it alone."""
    alone = [verify_response(name, p, r, options=o or None) for p, r, o in MIXED]
    assert {d.match for d in alone} == {True, False}
    orders = [list(range(len(MIXED))), list(reversed(range(len(MIXED)))), [1, 0, 2, 3, 4, 5, 6, 7]]
    for order in orders:
        rows = [MIXED[i] for i in order]
        expected = [alone[i] for i in order]
        metric = evaluate.load(metric_path(), name)  # a fresh module: no format kept from an earlier call
        at_once = metric.compute(predictions=[p for p, _, _ in rows], references=[r for _, r, _ in rows],
                                 options=[o for _, _, o in rows])
        assert at_once["matches"] == [d.match for d in expected], order
        assert at_once["reasons"] == [d.reason for d in expected], order
        metric = evaluate.load(metric_path(), name)
        for p, r, o in rows:  # one example per batch, options left out where there are none
            metric.add_batch(predictions=[p], references=[r], **({"options": [o]} if o else {}))
        assert metric.compute()["matches"] == [d.match for d in expected], order


def test_non_text_predictions_are_rejected_by_evaluate_with_a_clear_error(metrics):
    with pytest.raises(ValueError, match="don't match the expected format"):
        metrics["relaxed"].compute(predictions=[3], references=["3"])


def test_metric_card_follows_evaluate_conventions():
    card = (Path(metric_path()) / "README.md").read_text()
    header = re.match(r"---\n(.*?)\n---\n", card, re.DOTALL)
    assert header, "a YAML header between --- lines"
    import yaml

    meta = yaml.safe_load(header.group(1))
    assert meta["title"] and meta["description"]
    assert {"evaluate", "metric"} <= set(meta["tags"])
    for section in [
        "# Metric Card for",
        "## Metric Description",
        "## How to Use",
        "### Inputs",
        "### Output Values",
        "### Examples",
        "## Limitations and Bias",
        "## Citation",
    ]:
        assert section in card, section
    for name in VERIFIERS:
        assert f"`{name}`" in card


def test_module_ships_in_wheels():
    """`evaluate.load(metric_path())` must work from an installed wheel, not only from this checkout."""
    from setuptools import find_packages

    root = Path(__file__).resolve().parents[2]
    assert "rsgen.metrics.rsgen_verify" in find_packages(str(root), include=["rsgen*"])
    pyproject = (root / "pyproject.toml").read_text()  # (tomllib is 3.11+; the project supports 3.10)
    package_data = re.search(r"\[tool\.setuptools\.package-data\]\n\"\*\" = \[(.*?)\]", pyproject)
    assert package_data and '"*.md"' in package_data.group(1)


# ------------------------------------------------------------- one decision, three ways to get it

CORPUS = [
    # (verifier, raw response, references, options)
    ("relaxed", "<think>Reading the axis.</think>The answer is 41.", "42", None),
    ("relaxed", "partial reasoning</think>\n\n45%", "45", None),
    ("relaxed", "1,000", ["1000", "one thousand"], None),
    ("relaxed", "<think>never closed", "3", None),
    ("relaxed", "\\boxed{0.0}", "0", None),
    ("relaxed", "Answer: Blue.", "blue", None),
    ("relaxed", "12 kg", "12 g", None),
    ("exact", "<think>x</think>\n\nYes", "yes", None),
    ("exact", "3.0", "3", None),
    ("numeric", "<answer>3.0000001</answer>", "3", None),
    ("numeric", "three", "3", None),
    ("mc", "<think>A or C?</think>\n(B)", "B", ["red", "blue", "green"]),
    ("mc", "blue", "B", ["red", "blue", "green"]),
    ("mc", "A or B", "B", ["red", "blue", "green"]),
    ("mc", "none of these", "B", ["red", "blue", "green"]),
    ("mc", "The answer is C", "B", ["red", "blue", "green"]),
    ("math", "<think>simplify</think>\\boxed{\\frac{2}{4}}", "0.5", None),
    ("math", "\\boxed{x^2-1}", "(x-1)(x+1)", None),
    ("math", "\\boxed{3}", "4", None),
]


def test_library_metric_and_reward_agree(metrics):
    for name in VERIFIERS:
        rows = [row for row in CORPUS if row[0] == name]
        responses = [row[1] for row in rows]
        references = [row[2] if isinstance(row[2], list) else [row[2]] for row in rows]
        options = [row[3] or [] for row in rows]

        library = [
            verify_response(name, r, refs, options=o or None)
            for r, refs, o in zip(responses, references, options)
        ]
        metric = metrics[name].compute(predictions=responses, references=references, options=options)
        reward = reward_function(name)(
            prompts=["q"] * len(rows), completions=responses, answer=references, options=options
        )
        conversational = reward_function(name)(
            completions=[[{"role": "assistant", "content": r}] for r in responses],
            answer=references,
            options=options,
        )

        assert metric["matches"] == [d.match for d in library], name
        assert metric["reasons"] == [d.reason for d in library], name
        assert metric["extracted"] == [d.extracted for d in library], name
        assert reward == [float(d.match) for d in library], name
        assert conversational == reward, name
        assert metric["accuracy"] == pytest.approx(sum(d.match for d in library) / len(library))
    # The corpus exercises both outcomes of every verifier.
    for name in VERIFIERS:
        outcomes = {verify_response(name, r, refs, options=o).match for n, r, refs, o in CORPUS if n == name}
        assert outcomes == {True, False}, name


def _run_doctests(text: str, name: str) -> None:
    import doctest

    # Code fences are markdown, not expected output.
    text = "\n".join("" if line.strip().startswith("```") else line for line in text.splitlines())
    test = doctest.DocTestParser().get_doctest(
        text, {"evaluate": evaluate, "metric_path": metric_path}, name, None, 0
    )
    assert test.examples, f"no examples in {name}"
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    runner.run(test)
    assert runner.summarize(verbose=False).failed == 0, f"an example in {name} does not do what it says"


def test_examples_in_the_card_and_the_docstring_are_true(metrics, capsys):
    card = (Path(metric_path()) / "README.md").read_text()
    _run_doctests(card, "README.md")
    _run_doctests(metrics["relaxed"].inputs_description, "inputs_description")
    # The "How to Use" snippet (plain code, no prompts) runs and prints what the card says.
    snippet = re.search(r"## How to Use.*?```python\n(.*?)```", card, re.DOTALL).group(1)
    exec(snippet, {})
    assert capsys.readouterr().out.strip().startswith("0.5")
