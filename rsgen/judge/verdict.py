"""The strict verdict parser: a judge response counts only when its final answer is exactly one verdict word.

Reading rules (anything else is UNSURE, so an unclear judge can never promote a pair):
1. A response cut off at the token limit (`hit_limit`) is UNSURE, whatever it says so far.
2. Reasoning is stripped: the final answer is the text after the last `</think>`. An opened `<think>` that is
   never closed is unfinished reasoning: UNSURE. A stray `<think>` after the last `</think>` is UNSURE too.
3. Trivial formatting around the one word is allowed: surrounding whitespace, Markdown emphasis or code marks
   (`**CORRECT**`, `` `WRONG` ``), surrounding quotes or brackets, `<answer>...</answer>`, `\\boxed{...}`,
   a single trailing `.` or `!`, and one leading label `Verdict:`, `Final verdict:`, `Answer:` or
   `Final answer:` (bold allowed). Case is ignored (`Correct.` reads as CORRECT).
4. What remains must be exactly `CORRECT`, `WRONG` or `UNSURE`. Two verdicts, no verdict, `INCORRECT`,
   `NOT CORRECT`, a verdict followed by an explanation, or an empty answer are all UNSURE.
"""

from __future__ import annotations

import re

from rsgen.records import CORRECT, UNSURE, VERDICTS, WRONG

__all__ = ["CORRECT", "UNSURE", "VERDICTS", "WRONG", "parse_verdict"]

_THINK_OPEN = "<think>"
_THINK_CLOSE = "</think>"
# One leading label, possibly in bold: "Verdict: ", "**Verdict:** ", "**Final answer**: ".
_LABEL_RE = re.compile(
    r"^(?:\*\*|__)?(?:final\s+)?(?:verdict|answer)(?:\s*[:：](?:\*\*|__)?|(?:\*\*|__)\s*[:：])\s*",
    re.IGNORECASE,
)
_BOXED_RE = re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL)
# Wrappers that only format a word: emphasis, code, quotes, brackets. Stripped as matched pairs.
_WRAPPERS = (("<answer>", "</answer>"), ("**", "**"), ("__", "__"), ("*", "*"), ("_", "_"), ("`", "`"),
             ('"', '"'), ("'", "'"), ("(", ")"), ("[", "]"), ("“", "”"))


def final_answer_text(response: str) -> str | None:
    """The judge's final answer with reasoning removed, or None when the reasoning never finished."""
    lowered = response.lower()
    close = lowered.rfind(_THINK_CLOSE)
    if close >= 0:
        tail = response[close + len(_THINK_CLOSE):]
    else:
        tail = response
    if _THINK_OPEN in tail.lower():
        return None
    return tail


def _unwrap(text: str) -> str:
    """Drop one leading label, then peel formatting layers until nothing changes: boxes, paired wrappers,
    one trailing stop."""
    text = _LABEL_RE.sub("", text.strip(), count=1)
    trailing_stop_used = False
    while True:
        before = text
        text = text.strip()
        boxed = _BOXED_RE.match(text)
        if boxed:
            text = boxed.group(1)
        for left, right in _WRAPPERS:
            if len(text) > len(left) + len(right) and text.startswith(left) and text.endswith(right):
                text = text[len(left):len(text) - len(right)]
                break
        if not trailing_stop_used and text.endswith((".", "!")):
            text = text[:-1]
            trailing_stop_used = True
        if text == before:
            return text


def parse_verdict(response: str | None, hit_limit: bool = False) -> str:
    """CORRECT, WRONG or UNSURE from one raw judge response (see the module docstring for the rules)."""
    if response is None or hit_limit:
        return UNSURE
    tail = final_answer_text(response)
    if tail is None:
        return UNSURE
    word = _unwrap(tail).upper()
    return word if word in VERDICTS else UNSURE
