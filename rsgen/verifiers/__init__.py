"""Verifiers: pull the final answer out of a model response, and decide whether it matches the reference.

    from rsgen.verifiers import VERIFIERS, extract_answer, compare, verify_response, reward_function

Extraction (`extract_answer`) is separate from comparison (`compare`, pure functions on extracted answers,
registered by name in `VERIFIERS`: relaxed, exact, numeric, mc, math); `verify_response` does both.
`reward_function(name)` wraps a verifier as a TRL `GRPOTrainer` reward. The same decisions are available as
an `evaluate` metric: `evaluate.load(rsgen.metrics.metric_path(), name)`.

Importing this package is cheap (regular expressions only): math-verify runs in a worker process started on
the first `math` comparison, and nothing here imports torch, transformers or trl.
"""

from rsgen.verifiers.decision import REASONS, Decision, Extraction
from rsgen.verifiers.extract import extract_answer
from rsgen.verifiers.registry import (
    VERIFIERS,
    clear_caches,
    compare,
    get_verifier,
    unusable_reference,
    verify_response,
)
from rsgen.verifiers.rewards import reward_function

__all__ = [
    "REASONS",
    "VERIFIERS",
    "Decision",
    "Extraction",
    "clear_caches",
    "compare",
    "extract_answer",
    "get_verifier",
    "reward_function",
    "unusable_reference",
    "verify_response",
]
