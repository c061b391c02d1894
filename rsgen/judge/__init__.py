"""Judge: a text-only second pass in which the model grades verifier rejections; only CORRECT promotes."""

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
