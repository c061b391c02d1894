"""Text normalisation and number parsing shared by the string verifiers (relaxed, exact, numeric, mc).

`canonical_text` is the Unicode clean-up prepare applies to questions and answers and the verifiers apply to
both sides of a comparison: NFC composition (the same letter typed as one code point or as letter + combining
mark compares equal) and removal of invisible marks (zero-width spaces and joiners, bidi controls, the BOM,
soft hyphens) that copy-pasted text carries and that would make a right answer compare wrong.

`normalize_text` is relaxed accuracy's string rule -- lowercase, trim, drop one trailing period -- plus a few
cleanups that only remove formatting a model adds around an answer:
markdown emphasis around it (`**5**`), `$...$` math delimiters, a whole-answer `\\text{...}` / `\\mathrm{...}`
/ `\\textbf{...}` / `\\boxed{...}` wrapper, LaTeX escapes `\\%` and `\\$`, and runs of whitespace (collapsed
to one space).

`parse_number` reads a number the way chart answers are written: an optional leading '+' or '-' (also the
Unicode minus), an optional currency sign, digits with optional thousands separators in groups of three
("1,000", "12,345.6"; "1,5" is NOT a number), an optional decimal part and exponent ("1.5e6"), an optional
percent sign ("%", "percent"), and an optional trailing unit of at most three short words ("kg", "km/h",
"years old", "million"). A space separates thousands too, as in SI style and many locales ("1 000",
"12 345.6"; a no-break or thin space becomes a space in normalisation); "1 00" and "10 0000" are not numbers.
Reading "10 200" as two numbers would only matter if their digits, run together, happened to match the
reference. Words for numbers ("five") are not numbers, and a "unit" that is another answer glued on ("10 two",
"10twocorrect": a number word or a verdict word) makes the text no number at all (`holds_another_answer`). "nan", "inf" and values that overflow
a float are not numbers. Text longer than `MAX_NUMBER_CHARS` is never read as a number.
"""

from __future__ import annotations

import math
import re
import unicodedata
from typing import NamedTuple

MAX_NUMBER_CHARS = 100  # a real numeric answer with its unit is far shorter; bounds the regex work on junk
_CACHE_ENTRIES = (
    1 << 16
)  # answers repeat a lot ("2", "Yes", "B"); a bounded memo keeps them at one dict lookup
_CACHEABLE_CHARS = 200

_TRIM_CHARS = " \t\r\n\f\v*_`"
_LATEX_WRAPPER_RE = re.compile(
    r"^\\(?:text|textbf|textit|textrm|texttt|mathrm|mathbf|mathit|mathtt|operatorname|boxed|fbox)\s*\{(.*)\}$",
    re.DOTALL,
)


_INVISIBLE_RE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]")


def canonical_text(text: str) -> str:
    """NFC, without zero-width and bidi marks. ASCII text is returned as it is (nothing to do, and fast)."""
    if text.isascii():
        return text
    return _INVISIBLE_RE.sub("", unicodedata.normalize("NFC", text))


def normalize_text(text: str) -> str:
    """Lowercase, trim, drop one trailing period, after removing formatting around the answer."""
    text = canonical_text(text).strip(_TRIM_CHARS)
    if text[-2:] == "$." and text[:1] == "$":  # "$5$." ending a sentence: the period is outside the math
        text = text[:-1]
    if "\\" in text or text[:1] == "$":
        text = strip_latex(text)
    text = text.lower()
    if text.endswith("."):
        text = text[:-1].rstrip()
    if (
        "  " in text or not text.isprintable()
    ):  # tabs, newlines and other control characters are not printable
        text = " ".join(text.split())
    return text


def strip_latex(text: str) -> str:
    """Remove math delimiters and whole-answer LaTeX wrappers (bounded nesting); unescape \\% and \\$."""
    for _ in range(4):  # nested wrappers such as $\boxed{\text{B}}$; bounded so junk cannot loop
        before = text
        if len(text) >= 2 and text[0] == "$" and text[-1] == "$":
            text = text.strip("$").strip()
        elif text.startswith("\\(") and text.endswith("\\)"):
            text = text[2:-2].strip()
        elif text.startswith("\\[") and text.endswith("\\]"):
            text = text[2:-2].strip()
        m = _LATEX_WRAPPER_RE.match(text)
        if m is not None and _balanced(m.group(1)):
            text = m.group(1).strip()
        if text == before:
            break
    if "\\" in text:
        text = (
            text.replace("\\%", "%")
            .replace("\\$", "$")
            .replace("\\,", "")
            .replace("\\!", "")
            .replace("\\ ", " ")
        )
    return text.strip(_TRIM_CHARS)


def _balanced(text: str) -> bool:
    depth = 0
    for ch in text:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                return False
    return depth == 0


class Number(NamedTuple):
    """A parsed numeric answer. `currency` and `unit` are "" when absent; `percent` marks a % sign."""

    value: float
    percent: bool
    currency: str
    unit: str


_NUMBER_RE = re.compile(
    r"(?P<cur>[$€£¥₹])?\s*(?P<sign>[+\-−])?\s*(?P<cur2>[$€£¥₹])?\s*"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d{1,3}(?: \d{3})+|\d+)?(?P<frac>\.\d+)?(?:[eE](?P<exp>[+\-]?\d{1,4}))?"
    r"\s*(?P<pct>%|percent\b|per cent\b)?"
    r"(?:\s*(?P<unit>(?:°|[^\W\d_])[^\s\d]{0,15}(?:\s(?:°|[^\W\d_])[^\s\d]{0,15}){0,2}))?"
)


_DIGITS = frozenset("0123456789")
_DIGIT_RE = re.compile(r"\d")
_new = tuple.__new__  # Number(...) without its Python-level __new__, on the hot path


def parse_number(text: str) -> Number | None:
    """The number `text` (already normalised, so lowercase) states, or None if it is not a number."""
    if not text or len(text) > MAX_NUMBER_CHARS:
        return None
    # Fast paths for the shapes chart answers mostly take; the general pattern below handles the rest.
    if text.isascii():
        if text[0] in _DIGITS and text.replace(".", "", 1).isdigit():  # 12, 41.5
            return _new(Number, (float(text), False, "", ""))
        if text[-1] == "%" and text[0] in _DIGITS and text[:-1].replace(".", "", 1).isdigit():  # 45%, 4.5%
            return _new(Number, (float(text[:-1]), True, "", ""))
        if text[0] == "-" and text[1:2] in _DIGITS and text[1:].replace(".", "", 1).isdigit():  # -3, -0.5
            return _new(Number, (-float(text[1:]), False, "", ""))
    if _DIGIT_RE.search(text) is None:  # words: not a number, and no need for the full pattern
        return None
    m = _NUMBER_RE.fullmatch(text)
    if m is None:
        return None
    currency, sign, currency2, int_part, frac, exp, percent, unit = m.groups()
    if int_part is None and frac is None:
        return None
    if currency and currency2:
        return None
    literal = (int_part or "0").replace(",", "").replace(" ", "") + (frac or "")
    if exp is not None:
        literal += "e" + exp
    value = float(literal)
    if not math.isfinite(value):
        return None
    if sign == "-" or sign == "−":
        value = -value
    if unit:
        unit = unit.rstrip(".")
        if holds_another_answer(unit):
            return None
    return _new(Number, (value, percent is not None, currency or currency2 or "", unit or ""))


# A "unit" that is another answer glued to the number is not a unit: "10twocorrect" (a garbled "10", "two",
# "CORRECT") or "10 two" state two answers, not ten of something. Scale words stay units ("5 million").
_NUMBER_WORDS = (
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty", "thirty",
    "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
)
_VERDICT_WORDS = ("correct", "incorrect", "wrong", "true", "false", "unsure", "yes", "no")
_ORDINAL_ENDINGS = ("", "s", "th", "ths")  # "3 fourths", "5 tenths": a number word used as a unit


def holds_another_answer(unit: str) -> bool:
    """Whether a trailing unit (normalised, lowercase) is really another answer: a number word or a verdict word,
    alone or glued to other text ("twocorrect", "kgcorrect"); "tents", "tenths" and "corrections" stay units."""
    for word in unit.split():
        if word in _NUMBER_WORDS or word in _VERDICT_WORDS:
            return True
        if any(word.endswith(verdict) for verdict in _VERDICT_WORDS if len(verdict) >= 4):
            return True
        for number in _NUMBER_WORDS:
            rest = word[len(number):]
            if word.startswith(number) and rest not in _ORDINAL_ENDINGS and rest.startswith(_GLUED):
                return True
    return False


_GLUED = _NUMBER_WORDS + _VERDICT_WORDS


def units_compatible(a: Number, b: Number) -> bool:
    """Currency and unit must agree when both sides state one; a side that omits it is compatible."""
    if a.currency and b.currency and a.currency != b.currency:
        return False
    if a.unit and b.unit and a.unit != b.unit:
        return False
    return True


def value_pairs(prediction: Number, reference: Number) -> tuple[tuple[float, float], ...]:
    """The (prediction, reference) values to compare.

    When exactly one side carries a percent sign, both readings count: the same scale ("45%" vs "45")
    and the percent as a fraction ("45%" vs "0.45"). Chart labels often drop the sign the model keeps.
    """
    if prediction.percent == reference.percent:
        return ((prediction.value, reference.value),)
    if prediction.percent:
        return ((prediction.value, reference.value), (prediction.value / 100.0, reference.value))
    return ((prediction.value, reference.value), (prediction.value, reference.value / 100.0))


_info_cache: dict[str, tuple[str, Number | None, float | None]] = {}


def text_info(text: str) -> tuple[str, Number | None, float | None]:
    """(normalize_text(text), parse_number of that, the value when it is a plain number -- no percent sign,
    currency or unit -- else None), memoised for short texts. Verifiers read the memo directly first."""
    info = _info_cache.get(text)
    if info is None:
        whole, dot, fraction = text.partition(".")
        if whole.isdigit() and (fraction.isdigit() or not dot) and text.isascii():
            # A bare decimal number ("12", "41.27"), the most common answer: already normalised.
            value = float(text) if len(text) <= MAX_NUMBER_CHARS else None
            info = (text, None if value is None else _new(Number, (value, False, "", "")), value)
        else:
            normalized = normalize_text(text)
            number = parse_number(normalized)
            plain = None
            if number is not None and not (number.percent or number.currency or number.unit):
                plain = number.value
            info = (normalized, number, plain)
        if len(text) <= _CACHEABLE_CHARS:
            if len(_info_cache) >= _CACHE_ENTRIES:
                _info_cache.clear()
            _info_cache[text] = info
    return info
