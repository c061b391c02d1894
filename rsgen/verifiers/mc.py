"""`mc` -- multiple choice: one option letter from the answer, compared with the reference letter.

The reference is the bare letter ("B"; "(B)", "b" and "B." are read as B; with `options`, a reference equal
to one option's text is read as that option's letter; anything else is `bad_input`).

The answer's letter, tried in this order (the first rule that finds a letter decides; rule 3's letter is
pooled with rule 5's):

1. The whole answer is a letter: "B", "b", "(B)", "[B]", "B.", "B)", "B:", also inside markdown/LaTeX
   ("**B**", "$B$", "\\text{B}").
2. A leading letter form: "B) foo", "B. foo", "B: foo", "(B) foo", "b) foo", and "B, foo" / "B; foo" when a
   lowercase word other than "or"/"and"/"nor" follows ("D, it can't be A or B"; "A, B" and "A, and B" name two
   letters). The rest is taken to restate the option or to comment on the others (it may contain capitals:
   "(B) Vitamin C"); only another explicit form (below, except the last one) naming a different letter makes
   it `mc_ambiguous` ("A) red B) blue").
3. Explicit letter forms anywhere: a bracketed "(B)"/"[b]", "B)", "option B" / "choice b" / "answer is B" /
   "letter B", a capital letter ending the answer ("... so B."). Two different letters -> `mc_ambiguous`.
4. With `options` and no letter so far: the answer equals the text of exactly one option (normalised like
   `exact`; a one-character answer that is not a letter, "5" among options 1, 5, 9, 10, is such a text);
   equal to several -> `mc_ambiguous`.
5. Bare capital letters standing alone ("I'd pick B here"), together with a letter from rule 3: only
   letters within the options' range count (A..Z without options), and "A"/"I" followed by a lowercase word
   are read as the article/pronoun unless that word is "is", "was", "or", "and"... ("A or B" has two
   letters). Two different letters -> `mc_ambiguous`.
6. With `options`: the answer contains, as whole words, the text of exactly one option (an option whose text
   lies inside another found option's text does not count separately); several -> `mc_ambiguous`.

Nothing found -> `mc_no_letter`. A letter outside the options' range is still a letter (a wrong answer).

Negation is not read: "It can't be A or B, so C" names three letters and is `mc_ambiguous` (a rejection the
judge can read, never a guess). A leading letter form or a final-answer phrase isolates the answer: "C, it
can't be A or B" and "It can't be A or B, so the answer is C" are C.
"""

from __future__ import annotations

import re

from rsgen.verifiers.decision import (
    BAD_INPUT,
    MC_AMBIGUOUS,
    MC_NO_LETTER,
    WRONG_ANSWER,
    Decision,
    accepted,
    rejected,
)
from rsgen.verifiers.frame import multiple_choice_verifier
from rsgen.verifiers.normalize import _info_cache, normalize_text, strip_latex, text_info

_WHOLE_RE = re.compile(r"[\(\[]?([A-Za-z])[\)\]]?[.:)]?")
_STRONG_RE = re.compile(
    r"^[\(\[]([A-Za-z])[\)\]]"  # (B) foo
    r"|^([A-Z])[.:)](?=\s|$)"  # B. foo / B: foo / B) foo
    r"|^([A-Z])[,;](?=\s+(?!(?:or|and|nor)\b)[a-z])"  # D, it can't be A / D; because ... (not "A, and B")
    r"|^([a-z])\)(?=\s|$)"  # b) foo
    r"|(?<![A-Za-z0-9])[\(\[]([A-Za-z])[\)\]]"  # ... (B) ...
    r"|(?<![A-Za-z0-9])([A-Z])\)"  # ... B) ...
    r"|(?i:\b(?:option|choice|letter|answer(?:\s+is)?))\s*:?\s*([A-Z])(?![A-Za-z0-9])"  # option B / answer is B
    r"|(?i:\b(?:option|choice))\s+([a-z])(?![A-Za-z0-9])"  # option b
    r"|(?<![A-Za-z0-9'’])([A-Z])[.)]?\s*$"  # ... so B.
)
_LEADING_GROUPS = 4  # groups 1-4 are leading letter forms (rule 2)
_TRAILING_GROUP = 9  # the group of the last alternative above
_BARE_RE = re.compile(r"(?<![A-Za-z0-9'’\-])([A-Z])(?![A-Za-z0-9'’\-])")
_WORD_AFTER_RE = re.compile(r"\s+([a-z]+)")
_LETTER_WORDS = frozenset({"is", "was", "seems", "looks", "matches", "fits", "or", "and", "nor"})  # "A or B"
_STRIP_CHARS = " \t\r\n\f\v*_`"
_CACHE_ENTRIES = 1 << 16  # final MC answers repeat a lot ("B", "(B)", "**B**")
_CACHEABLE_CHARS = 200
_forms_cache: dict[tuple[str, int], tuple] = {}
_option_pattern_cache: dict[str, re.Pattern] = {}


def _clean(text: str) -> str:
    if "*" in text or "`" in text:
        text = text.replace("*", "").replace("`", "")
    if "\\" in text or "$" in text:
        text = strip_latex(text)
    return text.strip(_STRIP_CHARS)


def option_letter(
    answer: str, options: list[str] | tuple[str, ...] | None = None
) -> tuple[str | None, str | None]:
    """(letter, None) for the one option letter in `answer`, else (None, "mc_ambiguous" | "mc_no_letter")."""
    if len(answer) == 1:
        if "A" <= answer <= "Z" or "a" <= answer <= "z":
            return answer.upper(), None
        if not options:
            return None, MC_NO_LETTER
        # else a one-character option text ("5" among 1, 5, 9, 10): the option-text rules below decide
    # What the letter forms say depends on the answer and the number of options only: memoised on that.
    key = (answer, len(options) if options else 0)
    forms = _forms_cache.get(key)
    if forms is None:
        forms = _letter_forms(answer, key[1])
        if len(answer) <= _CACHEABLE_CHARS:
            if len(_forms_cache) >= _CACHE_ENTRIES:
                _forms_cache.clear()
            _forms_cache[key] = forms
    decided, bare, normalized = forms
    if decided is not None:
        return decided
    if options:  # rule 4: the answer is one option's text
        equal = [i for i, option in enumerate(options) if _normalized(option) == normalized]
        if len(equal) == 1:
            return chr(65 + equal[0]), None
        if equal:
            return None, MC_AMBIGUOUS
    if bare is not None:
        return bare
    if options:  # rule 6: the answer contains one option's text
        found = [i for i, option in enumerate(options) if _contains_option(normalized, option)]
        texts = [_normalized(options[i]) for i in found]
        found = [i for i, t in zip(found, texts) if not any(t != o and t in o for o in texts)]
        if len(found) == 1:
            return chr(65 + found[0]), None
        if found:
            return None, MC_AMBIGUOUS
    return None, MC_NO_LETTER


def _normalized(text: str) -> str:
    return (_info_cache.get(text) or text_info(text))[0]


def _letter_forms(answer: str, num_options: int) -> tuple[tuple | None, tuple | None, str]:
    """Rules 1-3 and 5: (the decision when letter forms decide, else None; the bare-letter decision when
    bare letters alone were found, else None; the normalised answer for the option-text rules)."""
    text = _clean(answer)
    m = _WHOLE_RE.fullmatch(text)
    if m is not None:
        return (m.group(1).upper(), None), None, ""
    letters = set()
    leading = None
    for m in _STRONG_RE.finditer(text):
        kind = m.lastindex
        letter = m.group(kind).upper()
        if kind <= _LEADING_GROUPS:
            leading = letter
        elif kind < _TRAILING_GROUP or leading is None:
            letters.add(letter)
    if leading is not None:
        # "B) text of option B": the rest restates the option (which may contain a capital letter, "Vitamin C");
        # only another explicit letter form ("(C)", "C)", "option C") makes it ambiguous.
        return ((leading, None) if letters <= {leading} else (None, MC_AMBIGUOUS)), None, ""
    if len(letters) > 1:
        return (None, MC_AMBIGUOUS), None, ""
    last = chr(64 + num_options) if 0 < num_options <= 26 else "Z"
    bare = set()
    for m in _BARE_RE.finditer(text):
        letter = m.group(1)
        if letter > last:
            continue
        if letter in "AI":
            word = _WORD_AFTER_RE.match(text, m.end())
            if word is not None and word.group(1) not in _LETTER_WORDS:
                continue
        bare.add(letter)
    if letters:  # one explicit letter, pooled with the bare ones
        pooled = letters | bare
        return ((pooled.pop(), None) if len(pooled) == 1 else (None, MC_AMBIGUOUS)), None, ""
    bare_decision = None
    if bare:
        bare_decision = (bare.pop(), None) if len(bare) == 1 else (None, MC_AMBIGUOUS)
    return None, bare_decision, normalize_text(text)


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


@multiple_choice_verifier
def mc(prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds) -> Decision:
    """Multiple choice: the answer's single option letter against the reference letter(s)."""
    if len(references) == 1 and len(references[0]) == 1 and "A" <= references[0] <= "Z":
        ref_letters = references  # the usual reference: a bare capital letter
    else:
        ref_letters = [
            letter for letter in (reference_letter(ref, options) for ref in references) if letter is not None
        ]
        if not ref_letters:
            return rejected(BAD_INPUT, prediction)
    letter, reason = option_letter(prediction, options)
    if letter is None:
        return rejected(reason, prediction)
    if letter in ref_letters:
        return accepted(letter)
    return rejected(WRONG_ANSWER, letter)
