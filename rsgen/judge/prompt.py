"""The judge prompt: a short template with `{question}`, `{reference}` and `{candidate}` placeholders.

The candidate is model output, so it is untrusted text: it is fenced between `<<<CANDIDATE>>>` and `<<<END>>>`
and every run of three or more `<` or `>` inside it (and inside the question and reference) is broken up, so no
field can close the fence early or open a fake one. Placeholders are filled in one pass, so a field that itself
contains `{candidate}` is left as it is. The fencing is done here, not in the template, so a custom template
(recipe key `judge_prompt_file`) gets it too.

The demo model is trained on prompts rendered by `render_judge_prompt`; keep the template short.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from rsgen.config import RecipeError

DEFAULT_TEMPLATE_PATH = Path(__file__).with_name("prompt.txt")
PLACEHOLDERS = ("question", "reference", "candidate")
CANDIDATE_OPEN = "<<<CANDIDATE>>>"
CANDIDATE_CLOSE = "<<<END>>>"

_PLACEHOLDER_RE = re.compile(r"\{(question|reference|candidate)\}")
_ANGLE_RUN_RE = re.compile(r"<{3,}|>{3,}")


class JudgePromptError(RecipeError):
    """A judge template that cannot be used (missing file or placeholder); a recipe error, so the command line
    reports it as one."""


def load_template(path: str | Path | None = None) -> str:
    """The template at `path` (recipe key `judge_prompt_file`), or the default shipped next to this module."""
    p = Path(path) if path is not None else DEFAULT_TEMPLATE_PATH
    if not p.is_file():
        raise JudgePromptError(f"judge_prompt_file {str(p)!r} does not exist")
    template = p.read_text(encoding="utf-8")
    check_template(template, where=str(p))
    return template


def check_template(template: str, where: str = "judge template") -> None:
    found = set(_PLACEHOLDER_RE.findall(template))
    missing = [name for name in PLACEHOLDERS if name not in found]
    if missing:
        raise JudgePromptError(
            f"{where} lacks the placeholder(s) {', '.join('{' + m + '}' for m in missing)}; "
            "a judge template must contain {question}, {reference} and {candidate}"
        )


def neutralise_markers(text: str) -> str:
    """Break every run of 3+ '<' or '>' into spaced characters ("<<<" -> "< < <"): the fence markers need
    "<<<" and ">>>", so afterwards no text can contain (or complete) a marker."""
    return _ANGLE_RUN_RE.sub(lambda m: " ".join(m.group()), text)


def format_reference(answers: str | Sequence[str]) -> str:
    """One official answer as it is; several acceptable answers as `"a" or "b"` (JSON-quoted, so an answer
    containing the word "or" or a quote stays unambiguous)."""
    if isinstance(answers, str):
        return answers
    answers = list(answers)
    if not answers:
        raise ValueError("a reference needs at least one answer")
    if len(answers) == 1:
        return answers[0]
    return " or ".join(json.dumps(a, ensure_ascii=False) for a in answers)


def fence_candidate(candidate: str) -> str:
    return f"{CANDIDATE_OPEN}\n{neutralise_markers(candidate)}\n{CANDIDATE_CLOSE}"


def render_judge_prompt(
    question: str, reference: str | Sequence[str], candidate: str, template: str | None = None
) -> str:
    """The user text of one judge request. `reference` may be a list of acceptable answers."""
    if template is None:
        template = load_template()
    else:
        check_template(template)
    values = {
        "question": neutralise_markers(question),
        "reference": neutralise_markers(format_reference(reference)),
        "candidate": fence_candidate(candidate),
    }
    return _PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], template).strip()
