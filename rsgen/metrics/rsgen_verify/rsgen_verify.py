"""rsgen_verify: rsgen's answer verifiers (relaxed, exact, numeric, mc, math) as an `evaluate` metric.

`evaluate` copies this file into its module cache and imports it from there, so it imports rsgen by its
absolute name (the package must be installed) and holds no logic of its own: every decision comes from
`rsgen.verifiers.verify_response`, the function the rsgen pipeline and the TRL rewards use.
"""

import datasets
import evaluate

from rsgen.verifiers import VERIFIERS, verify_response

_CITATION = """\
@inproceedings{masry-etal-2022-chartqa,
    title = "{C}hart{QA}: A Benchmark for Question Answering about Charts with Visual and Logical Reasoning",
    author = "Masry, Ahmed and Long, Do and Tan, Jia Qing and Joty, Shafiq and Hoque, Enamul",
    booktitle = "Findings of the Association for Computational Linguistics: ACL 2022",
    year = "2022",
    pages = "2263--2279",
}
"""

_DESCRIPTION = """\
Accuracy of raw model responses against official answers, with the final answer extracted first (reasoning
in <think>...</think> dropped, then the last of <answer>...</answer>, \\boxed{...} and "The answer is ..."
phrases, else the whole text) and compared by one of rsgen's verifiers, chosen as the configuration name:
`relaxed` (ChartQA relaxed accuracy: numbers within 5% of the reference, else normalised string equality),
`exact` (normalised string equality), `numeric` (numbers within a tolerance), `mc` (one option letter),
`math` (math-verify equivalence under a per-item time limit).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): raw model responses (reasoning included); the final answer is extracted.
    references (`list` of `str` or `list` of `list` of `str`): the official answer of each example, or a
        list of acceptable answers (any match counts); text and lists may be mixed in any order. A reference is
        text whatever it says: "nan", "inf", "None" and "null" are compared as written.
    options (`list` of `list` of `str`, optional): multiple-choice option texts per example, in letter order.
        An example with options is checked as multiple choice under every verifier (its letter, or the text of
        one option, against the reference's letter); an example with an empty list is free form.
    numeric_tolerance (`float`, optional): tolerance of `numeric` (default 1e-6; absolute up to 1, relative above).
    timeout_seconds (`float`, optional): per-example time limit of `math` (default 5).
Returns:
    accuracy (`float`): fraction of examples whose answer matches, in [0, 1].
    matches (`list` of `bool`): per example, whether it matches.
    extracted (`list` of `str` or `None`): per example, the answer that was compared (for `mc`, the letter
        when one was found); None when nothing could be extracted.
    reasons (`list` of `str` or `None`): per example, None when it matches, else why not: "wrong_answer",
        "no_answer", "mc_ambiguous", "mc_no_letter", "math_timeout" or "bad_input".
Examples:
    >>> import evaluate
    >>> from rsgen.metrics import metric_path
    >>> metric = evaluate.load(metric_path(), "relaxed")
    >>> results = metric.compute(
    ...     predictions=["<think>The bar reads about 41.</think>The answer is 41.", "Answer: 7"],
    ...     references=["42", "8"],
    ... )
    >>> results["accuracy"], results["matches"], results["extracted"]
    (0.5, [True, False], ['41.', '7'])
"""

DEFAULT_VERIFIER = "relaxed"  # `evaluate.load(path)` without a configuration name


def _as_list(reference):
    """A text reference as the one-element list it means; anything else as it is (a list, or bad input that
    `evaluate` or the verifier reports)."""
    return [reference] if isinstance(reference, str) else reference


def _one_format(predictions, references, kwargs: dict):
    """References as lists and options present, so that every example has the one input format."""
    if isinstance(references, (list, tuple)):
        references = [_as_list(r) for r in references]
    if kwargs.get("options") is None:
        kwargs = {**kwargs, "options": [[] for _ in predictions]}
    return references, kwargs


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class RsgenVerify(evaluate.Metric):
    """Accuracy of raw model responses under one of rsgen's verifiers (the configuration name)."""

    def _info(self):
        verifier = DEFAULT_VERIFIER if self.config_name == "default" else self.config_name
        if verifier not in VERIFIERS:
            raise ValueError(
                f"unknown verifier {self.config_name!r}; load the metric with one of: {', '.join(sorted(VERIFIERS))}"
            )
        # One input format for every example: `evaluate` fixes the format from the first example it sees, so with
        # two formats (text or list references) a list arriving after a text was read as the text "['4', 'four']".
        # `compute`, `add_batch` and `add` turn a text reference into a one-element list and absent options into
        # an empty list before `evaluate` sees them.
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features({
                "predictions": datasets.Value("string"),
                "references": datasets.List(datasets.Value("string")),
                "options": datasets.List(datasets.Value("string")),
            }),
            reference_urls=[
                "https://github.com/vis-nlp/ChartQA",
                "https://github.com/huggingface/Math-Verify",
            ],
        )

    @property
    def verifier(self) -> str:
        return DEFAULT_VERIFIER if self.config_name == "default" else self.config_name

    def compute(self, *, predictions=None, references=None, **kwargs):
        """Compute the metric over the stored and the given examples (`options` optional)."""
        if predictions is not None:
            references, kwargs = _one_format(predictions, references, kwargs)
        return super().compute(predictions=predictions, references=references, **kwargs)

    def add_batch(self, *, predictions=None, references=None, **kwargs):
        """Store a batch of examples (`options` optional)."""
        if predictions is not None:
            references, kwargs = _one_format(predictions, references, kwargs)
        return super().add_batch(predictions=predictions, references=references, **kwargs)

    def add(self, *, prediction=None, reference=None, **kwargs):
        """Store one example (`options` optional)."""
        if kwargs.get("options") is None:
            kwargs = {**kwargs, "options": []}
        return super().add(prediction=prediction, reference=_as_list(reference), **kwargs)

    def _compute(self, predictions, references, options=None, numeric_tolerance=None, timeout_seconds=None):
        matches, extracted, reasons = [], [], []
        for i, (prediction, reference) in enumerate(zip(predictions, references)):
            decision = verify_response(
                self.verifier,
                prediction,
                reference,
                options=(options[i] or None) if options is not None else None,
                numeric_tolerance=numeric_tolerance,
                timeout_seconds=timeout_seconds,
            )
            matches.append(decision.match)
            extracted.append(decision.extracted)
            reasons.append(decision.reason)
        accuracy = sum(matches) / len(matches) if matches else 0.0
        return {"accuracy": accuracy, "matches": matches, "extracted": extracted, "reasons": reasons}
