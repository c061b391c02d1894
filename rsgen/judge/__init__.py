"""Judge: a text-only second pass in which a model (the generating VLM, or a separate text-only chat model) grades
the verifier's undecided rejections; only CORRECT promotes. Decisive mismatches never reach it, and its promotions
count only in families where it said WRONG to enough known-wrong calibration pairs (`judge_min_specificity`)."""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(__name__, "judge", work=lambda layout: layout.judge_work, every_process=True,
                         help="re-examine verifier rejections with the model as a text-only judge (resumable)")

__getattr__ = lazy_exports(__name__, {
    "CORRECT": "rsgen.records",
    "UNSURE": "rsgen.records",
    "VERDICTS": "rsgen.records",
    "WRONG": "rsgen.records",
    "judge_summary": "rsgen.judge.stage",
    "needs_judging": "rsgen.routing",
    "parse_verdict": "rsgen.judge.verdict",
    "render_judge_prompt": "rsgen.judge.prompt",
    "route": "rsgen.routing",
    "run_judge": "rsgen.judge.stage",
})
__all__ = [  # noqa: F822 (loaded on first use)
    "CORRECT",
    "STAGE",
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
