"""Final-answer extraction from a raw model response.

Order (the first step that applies wins, later steps work on what the earlier ones kept):

1. Reasoning. Everything up to and including the LAST closing reasoning tag (`</think>`, `</thinking>`,
   `</reasoning>`) is dropped. A chat template that pre-fills `<think>` leaves only the closing tag in the
   output; that case is the same rule. An opening tag that is never closed after that point means the model
   was still reasoning when it stopped (usually the token limit): no answer.
2. `<answer>...</answer>`: the content of the last such block. An `<answer>` never closed keeps what follows
   it (small models often stop right after the answer); a lone `</answer>` keeps what precedes it.
3. The last `\\boxed{...}` (or `\\fbox{...}`) with balanced braces, nested braces included. A box cut off
   before its closing brace is skipped in favour of an earlier complete one.
4. The last explicit final-answer phrase: "The answer is ...", "Answer: ...", "Final answer: ..."
   (any case, markdown bold allowed around it). The answer is the rest of that line (or the next
   non-empty line when the phrase ends its line), cut at the first sentence end (". " / "! " / "? ").
5. Otherwise the whole remaining text.

The result is trimmed (whitespace, and markdown emphasis `*`/`_`/backticks around it); an empty result
is no answer. Chat end markers some decoders leave at the end (`<|im_end|>`, `</s>`...) are ignored.
Non-string input is `bad_input`. Every step is a linear scan, so very long responses cost linear time.
"""

from __future__ import annotations

import re

from rsgen.verify.decision import BAD_INPUT, NO_ANSWER, Extraction

_END_MARKERS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "</s>", "<|end_of_text|>")

# Tested on a lowercased window right after a case variant of "answer" (rfind is far faster than an
# IGNORECASE search over a long response).
_PHRASE_TAIL_RE = re.compile(r"\**\s*(?:is\b(?!n['’]t)\**\s*:?|would\s+be\b\s*:?|will\s+be\b\s*:?|[:：])\**")
_PHRASE_WINDOW = 48
_ANSWER_VARIANTS = ("answer", "Answer", "ANSWER")
_SENTENCE_END_RE = re.compile(r"[.!?](?=\s)")
_TRIM_CHARS = " \t\r\n\f\v*_`"

_NO_ANSWER = Extraction(None, NO_ANSWER)
_BAD_INPUT = Extraction(None, BAD_INPUT)


def extract_answer(response: str) -> Extraction:
    """The final answer in `response` (see the module docstring for the rules), or a reason there is none."""
    if type(response) is not str:
        if isinstance(response, str):
            response = str(response)
        else:
            return _BAD_INPUT
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
            if boxed:
                return Extraction(boxed)
    if "nswer" in text or "NSWER" in text:
        phrase = _after_last_phrase(text)
        if phrase is not None:
            text = phrase
    text = text.strip(_TRIM_CHARS)
    if not text:
        return _NO_ANSWER
    return Extraction(text)


def _strip_reasoning(text: str) -> str | None:
    """Text after the last closing reasoning tag, end markers removed; None if reasoning never closed."""
    cut = -1
    i = text.rfind("</think")  # </think> and </thinking>
    if i >= 0:
        close = text.find(">", i)
        if close >= 0 and text[i + 7 : close] in ("", "ing"):
            cut = close + 1
    i = text.rfind("</reasoning>")
    if i >= 0 and i + 12 > cut:
        cut = i + 12
    if cut >= 0:
        text = text[cut:]
    if "<think" in text or "<reasoning>" in text:
        return None
    if text.endswith(_END_MARKERS) or text.rstrip().endswith(_END_MARKERS):
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
    """Content of the last complete \\boxed{...}/\\fbox{...} in `text`, nested braces included."""
    best_start, best_content = -1, None
    for opener in ("\\boxed", "\\fbox"):
        search_end = len(text)
        while True:
            i = text.rfind(opener, 0, search_end)
            if i <= best_start:  # also i < 0
                break
            content = _braced_content(text, i + len(opener))
            if content is not None:
                best_start, best_content = i, content
                break
            search_end = i
    return best_content


def _braced_content(text: str, pos: int) -> str | None:
    n = len(text)
    while pos < n and text[pos] == " ":
        pos += 1
    if pos >= n or text[pos] != "{":
        return None
    depth = 0
    start = pos + 1
    # Jump between braces with find() instead of walking every character: long boxes stay cheap.
    i = pos
    while True:
        next_open = text.find("{", i + 1)
        next_close = text.find("}", i + 1)
        if next_close < 0:
            return None
        if 0 <= next_open < next_close:
            depth += 1
            i = next_open
        else:
            if depth == 0:
                return text[start:next_close]
            depth -= 1
            i = next_close


def _after_last_phrase(text: str) -> str | None:
    """The answer following the last final-answer phrase, or None if there is no such phrase."""
    search_ends = [len(text)] * len(_ANSWER_VARIANTS)
    while True:
        best, best_variant = -1, -1
        for k, variant in enumerate(_ANSWER_VARIANTS):
            i = text.rfind(variant, 0, search_ends[k])
            if i > best:
                best, best_variant = i, k
        if best < 0:
            return None
        start = best + 6
        m = _PHRASE_TAIL_RE.match(text[start : start + _PHRASE_WINDOW].lower())
        if m is None:
            search_ends[best_variant] = best
            continue
        rest = text[start + m.end() :]
        line_end = rest.find("\n")
        line = rest if line_end < 0 else rest[:line_end]
        if line_end >= 0 and not line.strip(_TRIM_CHARS):
            for next_line in rest[line_end + 1 :].split("\n"):
                if next_line.strip(_TRIM_CHARS):
                    line = next_line
                    break
        if "." in line or "!" in line or "?" in line:
            end = _SENTENCE_END_RE.search(line)
            if end is not None:
                line = line[: end.start()]
        return line
