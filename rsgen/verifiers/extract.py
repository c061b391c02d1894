"""Final-answer extraction from a raw model response.

1. Reasoning. Everything up to and including the LAST closing reasoning tag (`</think>`, `</thinking>`,
   `</reasoning>`) is dropped. A chat template that pre-fills `<think>` leaves only the closing tag in the
   output; that case is the same rule. An opening tag that is never closed after that point means the model
   was still reasoning when it stopped (usually the token limit): no answer.
2. The last final-answer marker in the text wins, by position. The markers:
   - an answer tag block `<answer>...</answer>`: its content (where the box and phrase rules apply again). An
     `<answer>` never closed keeps what follows it (small models often stop right after the answer); a lone
     `</answer>` keeps what precedes it. A box or phrase after the closing tag is a later marker;
   - a `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, nested braces included. A box cut off before
     its closing brace is skipped in favour of an earlier complete one; an empty box is no answer;
   - an explicit final-answer phrase: "The answer is ...", "Answer: ...", "Final answer: ...", "... answer
     would be ..." (any case, markdown bold allowed around it; the last 256 occurrences of the word "answer"
     are examined). The answer is the rest of that line (or the next non-empty line when the phrase ends its
     line), cut at the first sentence end (". " / "! " / "? "). A phrase with nothing after it does not
     replace a box before it. A box inside the phrase's answer ("The answer is \\boxed{5}") is the later one.
   So intermediate boxes followed by "Final Answer: The final answer is 7" give 7.
3. Otherwise the whole remaining text.

Tag names match in any case (`<ANSWER>`, `</Think>`). The result is trimmed (whitespace, and markdown emphasis
`*`/`_`/backticks around it); an empty result is no answer. Chat end markers some decoders leave at the end
(`<|im_end|>`, `</s>`...) are ignored. Non-string input is `bad_input`. Every step is a linear scan, so very
long responses cost linear time.
"""

from __future__ import annotations

import re

from rsgen.verifiers.decision import BAD_INPUT, NO_ANSWER, Extraction

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
        if "<" in text:
            lower = _ascii_lower(text)
            if "answer>" in lower:
                text = _answer_tag_content(text, lower)
    answer = _last_marker_answer(text)
    text = (text if answer is None else answer).strip(_TRIM_CHARS)
    if not text:
        return _NO_ANSWER
    return _new(Extraction, (text, None))


def _ascii_lower(text: str) -> str:
    """`text` with ASCII letters lowercased and every character at its place (tags are matched on this)."""
    lower = text.lower()
    if len(lower) != len(text):  # a few non-ASCII letters lowercase to two characters ("İ")
        lower = text.encode("ascii", "replace").decode("ascii").lower()
    return lower


def _strip_reasoning(text: str) -> str | None:
    """Text after the last closing reasoning tag, end markers removed; None if reasoning never closed."""
    lower = _ascii_lower(text)
    cut = -1
    i = lower.rfind("</think")  # </think> and </thinking>
    if i >= 0:
        close = lower.find(">", i)
        if close >= 0 and lower[i + 7 : close] in ("", "ing"):
            cut = close + 1
    i = lower.rfind("</reasoning>", max(cut, 0))  # one before the last </think> would not matter
    if i >= 0:
        cut = i + 12
    if cut >= 0:
        text = text[cut:]
        lower = lower[cut:]
    if "<think" in lower or "<reasoning>" in lower:
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


def _answer_tag_content(text: str, lower: str) -> str:
    """The content of the last answer tag block, unless a box or an answer phrase follows the block (the last
    marker wins); `lower` is `_ascii_lower(text)`, so tags match in any case."""
    start = lower.rfind("<answer>")
    if start >= 0:
        start += len("<answer>")
        end = lower.find("</answer>", start)
        if end < 0:
            return text[start:]
    else:
        end = lower.rfind("</answer>")
        if end < 0:
            return text
        start = 0
    after = text[end + len("</answer>") :]
    if _last_marker_answer(after) is not None:
        return after
    return text[start:end]


def _last_marker_answer(text: str) -> str | None:
    """The answer the last final-answer marker of `text` gives (the last complete box, or an answer phrase after
    it), or None when `text` has neither."""
    start = 0
    boxed = None
    if "\\" in text:
        box = _last_boxed(text)
        if box is not None:
            boxed, start = box
    lower_hit = text.rfind("nswer", start)
    upper_hit = text.rfind("NSWER", start)
    if lower_hit > 0 or upper_hit > 0:
        phrase = _after_last_phrase(text, lower_hit, upper_hit)
        # A phrase with nothing after it ("... is my answer:") does not replace a box before it.
        if phrase is not None and (boxed is None or phrase.strip(_TRIM_CHARS)):
            return phrase
    return boxed


def _last_boxed(text: str) -> tuple[str, int] | None:
    """(content, end) of the last complete \\boxed{...}/\\fbox{...} in `text`, nested braces included; `end` is
    the index after its closing brace.

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
        span, opened = _braced_span(text, end, limit)
        if span is not None:
            return text[span[0] : span[1]], span[1] + 1
        if opened:
            limit = i
    return None


def _braced_span(text: str, pos: int, limit: int) -> tuple[tuple[int, int] | None, bool]:
    """((start, end) of the content of the brace group opening at `pos` (after optional spaces), or None if it
    does not close before `limit`; whether a brace group opened there at all)."""
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
            return (start, close), True
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
