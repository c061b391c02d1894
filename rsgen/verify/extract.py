"""Final-answer extraction from a raw model response.

Order (the first step that applies wins, later steps work on what the earlier ones kept):

1. Reasoning. Everything up to and including the LAST closing reasoning tag (`</think>`, `</thinking>`,
   `</reasoning>`) is dropped. A chat template that pre-fills `<think>` leaves only the closing tag in the
   output; that case is the same rule. An opening tag that is never closed after that point means the model
   was still reasoning when it stopped (usually the token limit): no answer.
2. `<answer>...</answer>`: the content of the last such block. An `<answer>` never closed keeps what follows
   it (small models often stop right after the answer); a lone `</answer>` keeps what precedes it.
3. The last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, nested braces included. A box cut off
   before its closing brace is skipped in favour of an earlier complete one; an empty box is no answer.
4. The last explicit final-answer phrase: "The answer is ...", "Answer: ...", "Final answer: ...",
   "... answer would be ..." (any case, markdown bold allowed around it; the last 256 occurrences of the
   word "answer" are examined). The answer is the rest of that line (or the next non-empty line when the
   phrase ends its line), cut at the first sentence end (". " / "! " / "? ").
5. Otherwise the whole remaining text.

The result is trimmed (whitespace, and markdown emphasis `*`/`_`/backticks around it); an empty result
is no answer. Chat end markers some decoders leave at the end (`<|im_end|>`, `</s>`...) are ignored.
Non-string input is `bad_input`. Every step is a linear scan, so very long responses cost linear time.
"""

from __future__ import annotations

import re

from rsgen.verify.decision import BAD_INPUT, NO_ANSWER, Extraction

_END_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|end|>",
    "<end_of_turn>",
    "</s>",
    "<|end_of_text|>",
)

# Tested on a lowercased window right after a case variant of "answer" (rfind is far faster than an
# IGNORECASE search over a long response).
_PHRASE_TAIL_RE = re.compile(r"\**\s*(?:is\b(?!n['’]t)\**\s*:?|would\s+be\b\s*:?|will\s+be\b\s*:?|[:：])\**")
_PHRASE_WINDOW = 48
_MAX_PHRASE_CANDIDATES = 256  # occurrences of "answer" examined from the end; bounds the work on junk text
_SENTENCE_END_RE = re.compile(r"[.!?](?=\s)")
_TRIM_CHARS = " \t\r\n\f\v*_`"

_NO_ANSWER = Extraction(None, NO_ANSWER)
_BAD_INPUT = Extraction(None, BAD_INPUT)
# Extraction(x) goes through a Python-level __new__ that costs twice as much; this is the hot path.
_new = tuple.__new__


def extract_answer(response: str) -> Extraction:
    """The final answer in `response` (see the module docstring for the rules), or a reason there is none."""
    if type(response) is not str:
        if not isinstance(response, str):
            return _BAD_INPUT
        response = str(response)  # a str subclass
    text = response
    if "<" in text:
        text = _strip_reasoning(text)
        if text is None:
            return _NO_ANSWER
        if "answer>" in text:
            text = _answer_tag_content(text)
    if "\\" in text:
        boxed = _last_boxed(text)
        if boxed is not None:
            boxed = boxed.strip()
            return _new(Extraction, (boxed, None)) if boxed else _NO_ANSWER
    lower_hit = text.rfind("nswer")
    upper_hit = text.rfind("NSWER")
    if lower_hit > 0 or upper_hit > 0:
        phrase = _after_last_phrase(text, lower_hit, upper_hit)
        if phrase is not None:
            text = phrase
    text = text.strip(_TRIM_CHARS)
    if not text:
        return _NO_ANSWER
    return _new(Extraction, (text, None))


def _strip_reasoning(text: str) -> str | None:
    """Text after the last closing reasoning tag, end markers removed; None if reasoning never closed."""
    cut = -1
    i = text.rfind("</think")  # </think> and </thinking>
    if i >= 0:
        close = text.find(">", i)
        if close >= 0 and text[i + 7 : close] in ("", "ing"):
            cut = close + 1
    i = text.rfind("</reasoning>", max(cut, 0))  # one before the last </think> would not matter
    if i >= 0:
        cut = i + 12
    if cut >= 0:
        text = text[cut:]
    if "<think" in text or "<reasoning>" in text:
        return None
    if text[-1:] == ">" or (
        text[-1:].isspace() and text.rstrip()[-1:] == ">"
    ):  # cheap test before the markers
        text = text.rstrip()
        while text.endswith(_END_MARKERS):
            for marker in _END_MARKERS:
                if text.endswith(marker):
                    text = text[: -len(marker)].rstrip()
                    break
    return text


def _answer_tag_content(text: str) -> str:
    start = text.rfind("<answer>")
    if start >= 0:
        start += len("<answer>")
        end = text.find("</answer>", start)
        return text[start:] if end < 0 else text[start:end]
    end = text.rfind("</answer>")
    if end >= 0:
        return text[:end]
    return text


def _last_boxed(text: str) -> str | None:
    """Content of the last complete \\boxed{...}/\\fbox{...} in `text`, nested braces included.

    Linear time even on junk like "\\boxed{" repeated: a box that opens and never closes bounds the search
    for earlier ones (an earlier box still open at that point can never close either).
    """
    limit = len(text)
    boxed = text.rfind("\\boxed")
    fbox = text.rfind("\\fbox")
    while boxed >= 0 or fbox >= 0:
        if boxed > fbox:
            i, end = boxed, boxed + 6
            boxed = text.rfind("\\boxed", 0, boxed)
        else:
            i, end = fbox, fbox + 5
            fbox = text.rfind("\\fbox", 0, fbox)
        if i >= limit:
            continue
        content, opened = _braced_content(text, end, limit)
        if content is not None:
            return content
        if opened:
            limit = i
    return None


def _braced_content(text: str, pos: int, limit: int) -> tuple[str | None, bool]:
    """(content of the brace group opening at `pos` (after optional spaces) or None if it does not close
    before `limit`, whether a brace group opened there at all)."""
    while pos < limit and text[pos] == " ":
        pos += 1
    if pos >= limit or text[pos] != "{":
        return None, False
    start = pos + 1
    depth = 1
    next_open = text.find("{", start, limit)
    i = start
    # Jump between braces with find() (each moves forward only): long boxes cost linear time.
    while True:
        close = text.find("}", i, limit)
        if close < 0:
            return None, True
        while 0 <= next_open < close:
            depth += 1
            next_open = text.find("{", next_open + 1, limit)
        depth -= 1
        if depth == 0:
            return text[start:close], True
        i = close + 1


def _after_last_phrase(text: str, lower_hit: int, upper_hit: int) -> str | None:
    """The answer following the last final-answer phrase, or None if there is no such phrase.

    `lower_hit`/`upper_hit` are the last positions of "nswer"/"NSWER" (the "a" of "answer" is checked here).
    """
    for _ in range(_MAX_PHRASE_CANDIDATES):
        if lower_hit <= 0 and upper_hit <= 0:
            break
        if lower_hit > upper_hit:
            i = lower_hit
            lower_hit = text.rfind("nswer", 0, i)
        else:
            i = upper_hit
            upper_hit = text.rfind("NSWER", 0, i)
        if text[i - 1] not in "aA":
            continue
        start = i + 5
        window = text[start : start + _PHRASE_WINDOW]
        m = _PHRASE_TAIL_RE.match(window if window.islower() else window.lower())
        if m is None:
            continue
        rest = text[start + m.end() :]
        line_end = rest.find("\n")
        line = rest if line_end < 0 else rest[:line_end]
        if line_end >= 0 and not line.strip(_TRIM_CHARS):
            for next_line in rest[line_end + 1 :].split("\n"):
                if next_line.strip(_TRIM_CHARS):
                    line = next_line
                    break
        if " " in line or "\t" in line:  # a sentence end is punctuation followed by whitespace
            end = _SENTENCE_END_RE.search(line)
            if end is not None:
                line = line[: end.start()]
        return line
    return None
