"""Judge: a text-only second pass in which a model (the generating VLM, or a separate text-only chat model) grades
the verifier's undecided rejections; only CORRECT promotes. Decisive mismatches never reach it, and its promotions
count only in families where it said WRONG to enough known-wrong calibration pairs (`judge_min_specificity`)."""

from rsgen.judge.prompt import render_judge_prompt
from rsgen.judge.stage import judge_summary, run_judge
from rsgen.judge.verdict import CORRECT, UNSURE, VERDICTS, WRONG, parse_verdict
from rsgen.routing import needs_judging, route

__all__ = [
    "CORRECT",
    "UNSURE",
    "VERDICTS",
    "WRONG",
    "judge_summary",
    "needs_judging",
    "parse_verdict",
    "render_judge_prompt",
    "route",
    "run_judge",
]
