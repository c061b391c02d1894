"""The verifiers as an `evaluate` metric module, loadable offline from the installed package:

import evaluate
from rsgen.metrics import metric_path

metric = evaluate.load(metric_path(), "relaxed")   # or exact, numeric, mc, math
metric.compute(predictions=["<think>...</think>The answer is 12"], references=[["12"]])
"""

from __future__ import annotations

from pathlib import Path

METRIC_NAME = "rsgen_verify"


def metric_path() -> str:
    """Directory of the `rsgen_verify` metric module inside the installed package (for `evaluate.load`)."""
    return str(Path(__file__).resolve().parent / METRIC_NAME)


__all__ = ["METRIC_NAME", "metric_path"]
