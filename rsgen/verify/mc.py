"""`mc` -- multiple choice: one option letter from the answer, compared with the reference letter.

The reference is the bare letter ("B"; "(B)", "b" and "B." are read as B; with `options`, a reference equal
to one option's text is read as that option's letter; anything else is `bad_input`).

The answer's letter, tried in this order (the first rule that finds something decides):

1. The whole answer is a letter: "B", "b", "(B)", "[B]", "B.", "B)", "B:", also inside markdown/LaTeX
   ("**B**", "$B$", "\\text{B}").
2. Explicit letter forms anywhere: a leading "B) foo" / "B. foo" / "B: foo" / "(B) foo", a bracketed
   "(B)"/"[b]", "B)", "option B" / "choice b" / "answer is B" / "letter B", or a capital letter ending the
   answer ("... so B."). Two different letters -> `mc_ambiguous`.
3. With `options`: the answer equals the text of exactly one option (normalised like `exact`).
4. Bare capital letters standing alone ("I'd pick B here"): only letters within the options' range
   (A..Z without options); "A" and "I" followed by a lowercase word are read as the article/pronoun.
   Two different letters -> `mc_ambiguous`.
5. With `options`: the answer contains, as whole words, the text of exactly one option (an option whose text
   lies inside another found option's text does not count separately); several -> `mc_ambiguous`.

Nothing found -> `mc_no_letter`. A letter outside the options' range is still a letter (a wrong answer).
"""

from __future__ import annotations

import re

from rsgen.verify.decision import BAD_INPUT, MC_AMBIGUOUS, MC_NO_LETTER, WRONG_ANSWER, Decision
from rsgen.verify.inputs import check_inputs
from rsgen.verify.normalize import normalize_text, strip_latex

_WHOLE_RE = re.compile(r"[\(\[]?([A-Za-z])[\)\]]?[.:)]?")
_STRONG_RE = re.compile(
    r"^[\(\[]([A-Za-z])[\)\]]"  # (B) foo
    r"|^([A-Z])[.:)](?=\s|$)"  # B. foo / B: foo / B) foo
    r"|^([a-z])\)(?=\s|$)"  # b) foo
    r"|(?<![A-Za-z0-9])[\(\[]([A-Za-z])[\)\]]"  # ... (B) ...
    r"|(?<![A-Za-z0-9])([A-Z])\)"  # ... B) ...
    r"|(?i:\b(?:option|choice|letter|answer(?:\s+is)?))\s*:?\s*([A-Z])(?![A-Za-z0-9])"  # option B / answer is B
    r"|(?i:\b(?:option|choice))\s+([a-z])(?![A-Za-z0-9])"  # option b
    r"|(?<![A-Za-z0-9'’])([A-Z])[.)]?\s*$"  # ... so B.
)
_BARE_RE = re.compile(r"(?<![A-Za-z0-9'’\-])([A-Z])(?![A-Za-z0-9'’\-])")
_WORD_AFTER_RE = re.compile(r"\s+([a-z]+)")
_LETTER_WORDS = frozenset({"is", "was", "seems", "looks", "matches", "fits", "or", "and", "nor"})  # "A or B"
_STRIP_CHARS = " \t\r\n\f\v*_`"
_CACHE_ENTRIES = 1 << 16  # final MC answers repeat a lot ("B", "(B)", "**B**")
_CACHEABLE_CHARS = 200
_letter_cache: dict[tuple, tuple[str | None, str | None]] = {}
_option_pattern_cache: dict[str, re.Pattern] = {}


def _clean(text: str) -> str:
    if "*" in text or "`" in text:
        text = text.replace("*", "").replace("`", "")
    if "\\" in text or "$" in text:
        text = strip_latex(text)
    return text.strip(_STRIP_CHARS)


def option_letter(answer: str, options: list[str] | tuple[str, ...] | None = None) -> tuple[str | None, str | None]:
    """(letter, None) for the one option letter in `answer`, else (None, "mc_ambiguous" | "mc_no_letter")."""
    if len(answer) == 1:
        return (answer.upper(), None) if ("A" <= answer <= "Z" or "a" <= answer <= "z") else (None, MC_NO_LETTER)
    key = (answer, tuple(options) if options else None)
    found = _letter_cache.get(key)
    if found is None:
        found = _option_letter(answer, options)
        if len(answer) <= _CACHEABLE_CHARS:
            if len(_letter_cache) >= _CACHE_ENTRIES:
                _letter_cache.clear()
            _letter_cache[key] = found
    return found


def _option_letter(answer: str, options) -> tuple[str | None, str | None]:
    text = _clean(answer)
    m = _WHOLE_RE.fullmatch(text)
    if m is not None:
        return m.group(1).upper(), None
    letters = set()
    leading = False
    for m in _STRONG_RE.finditer(text):
        letters.add(m.group(m.lastindex).upper())
        leading = leading or m.lastindex <= 3
    if len(letters) > 1:
        return None, MC_AMBIGUOUS
    if leading:  # "B) text of option B": the rest is the option's text, not more letters
        return letters.pop(), None
    normalized = normalize_text(text)
    if options and not letters:
        equal = [i for i, option in enumerate(options) if normalize_text(option) == normalized]
        if len(equal) == 1:
            return chr(65 + equal[0]), None
        if equal:
            return None, MC_AMBIGUOUS
    last = chr(64 + len(options)) if options and len(options) <= 26 else "Z"
    for m in _BARE_RE.finditer(text):
        letter = m.group(1)
        if letter > last:
            continue
        if letter in "AI":
            word = _WORD_AFTER_RE.match(text, m.end())
            if word is not None and word.group(1) not in _LETTER_WORDS:
                continue
        letters.add(letter)
    if len(letters) == 1:
        return letters.pop(), None
    if letters:
        return None, MC_AMBIGUOUS
    if options:
        found = [i for i, option in enumerate(options) if _contains_option(normalized, option)]
        texts = [normalize_text(options[i]) for i in found]
        found = [i for i, t in zip(found, texts) if not any(t != o and t in o for o in texts)]
        if len(found) == 1:
            return chr(65 + found[0]), None
        if found:
            return None, MC_AMBIGUOUS
    return None, MC_NO_LETTER


def _contains_option(normalized_answer: str, option: str) -> bool:
    if type(option) is not str:
        return False
    pattern = _option_pattern_cache.get(option)
    if pattern is None:
        text = normalize_text(option)
        if not text:
            return False
        if len(_option_pattern_cache) > 10_000:
            _option_pattern_cache.clear()
        pattern = re.compile(r"(?<!\w)" + re.escape(text) + r"(?!\w)")
        _option_pattern_cache[option] = pattern
    return pattern.search(normalized_answer) is not None


def reference_letter(reference: str, options: list[str] | tuple[str, ...] | None = None) -> str | None:
    """The letter a reference names: a bare letter (bracketed/with a period allowed), or an option's text."""
    text = _clean(reference)
    m = _WHOLE_RE.fullmatch(text)
    if m is not None:
        return m.group(1).upper()
    if options:
        normalized = normalize_text(text)
        equal = [i for i, option in enumerate(options) if normalize_text(option) == normalized]
        if len(equal) == 1:
            return chr(65 + equal[0])
    return None


def mc(
    prediction: str | None,
    references: str | list[str],
    *,
    options: list[str] | None = None,
    numeric_tolerance: float | None = None,
    timeout_seconds: float | None = None,
) -> Decision:
    """Multiple choice: the answer's single option letter against the reference letter(s)."""
    refs = check_inputs(prediction, references)
    if type(refs) is Decision:
        return refs
    if options:
        if not isinstance(options, (list, tuple)) or not all(type(o) is str for o in options):
            return Decision(False, BAD_INPUT, prediction)
    elif options is not None and not isinstance(options, (list, tuple)):
        return Decision(False, BAD_INPUT, prediction)
    if len(refs) == 1 and len(refs[0]) == 1 and "A" <= refs[0] <= "Z":
        ref_letters = refs  # the usual reference: a bare capital letter
    else:
        ref_letters = [letter for letter in (reference_letter(ref, options) for ref in refs) if letter is not None]
        if not ref_letters:
            return Decision(False, BAD_INPUT, prediction)
    letter, reason = option_letter(prediction, options)
    if letter is None:
        return Decision(False, reason, prediction)
    if letter in ref_letters:
        return Decision(True, None, letter)
    return Decision(False, WRONG_ANSWER, letter)
