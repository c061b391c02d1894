"""Calibration pairs built from the run's own pool: known-wrong answers (the judge should say WRONG) and known-right
rewrites (the judge should say CORRECT), each in a named form.

The judge is calibrated on three sides: verifier-accepted pairs (it should say CORRECT), known-wrong pairs (WRONG)
and known-right pairs (CORRECT). A judge that says CORRECT to everything fails the known-wrong side, and the leniency
gate (`rsgen.routing.judge_trusted`) withholds its promotions; one that says WRONG to everything fails the
known-right side (its recall, `judge_min_recall`, reported).

Both sides are drawn only in forms the judge is actually shown: under `judge_scope: undecided` a candidate the
decisive rule settles (`rsgen.verifiers.decisive`: a number beyond the tolerance, another option's letter or its bare
text) never reaches the judge, so it is not used to measure it either. Under `all`, every form.

Known-wrong forms (`KNOWN_WRONG_FORMS`), each stating a value that is certainly wrong (its plain form -- digits, a
letter, a word -- is rejected by the verifier and, for numbers and letters, decisively so):

- `near_number`: the reference's number moved just beyond the verifier's tolerance (9 for 10) -- decisive;
- `neighbour_letter`: the option letter next to the reference's -- decisive;
- `number_word`: a wrong number written as a word (`nine` for 10);
- `other_word`: another question's word reference in the same family (`fig` for `lime`);
- `option_text`: a sentence naming a wrong option's text (`It is the blue ball.` for B);
- `sentence`: a sentence around a wrong value (`The answer is 9.` for 10);
- `unrelated`: a reference of another family, or a fixed unrelated answer.

Known-right forms (`KNOWN_RIGHT_FORMS`): meaning-preserving rewrites of the reference that the verifier *rejects*
(a rewrite it accepts is no false negative and is not used) and the decisive rule never settles:

- `number_word`: `ten` for 10; `count_noun`: `10 cubes` / `ten cubes` (the noun from "How many ... ?");
- `article`: `a fig`; `plural`: `figs`; `option_text`: the right option's text for its letter;
- `sentence`: `There are 10 cubes.`, `The answer is fig.`.

Pairs are drawn per family (the gate decides per family), up to `judge_calibration_size` a side, from the prepared
pool with a fixed seed; the i-th question of a family tries the forms starting at the i-th, so the forms rotate.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from typing import Any

from rsgen.verifiers import compare
from rsgen.verifiers.decision import Decision
from rsgen.verifiers.decisive import decisive_mismatch
from rsgen.verifiers.inputs import check_inputs
from rsgen.verifiers.mc import reference_letter
from rsgen.verifiers.normalize import Number, text_info
from rsgen.verifiers.numeric import DEFAULT_TOLERANCE
from rsgen.verifiers.relaxed import RELATIVE_TOLERANCE

NEAR_NUMBER = "near_number"
NEIGHBOUR_LETTER = "neighbour_letter"
NUMBER_WORD = "number_word"
OTHER_WORD = "other_word"
OPTION_TEXT = "option_text"
SENTENCE = "sentence"
UNRELATED = "unrelated"
COUNT_NOUN = "count_noun"
ARTICLE = "article"
PLURAL = "plural"
# Forms the decisive rule settles by construction: used only under `judge_scope: all`.
DECISIVE_FORMS = (NEAR_NUMBER, NEIGHBOUR_LETTER)

# Answers unrelated to any question of a VQA pool, for when the run has a single family.
UNRELATED_ANSWERS = ("purple elephant", "Paris", "a red umbrella", "the second one from the left",
                     "-273.15", "banana bread")


@dataclass(frozen=True)
class CalibrationPair:
    id: str  # the QA id whose question and reference are used
    family: str
    form: str  # a key of KNOWN_WRONG_FORMS or KNOWN_RIGHT_FORMS
    candidate: str


@dataclass(frozen=True)
class _Question:
    """What a form needs to know about one question of the pool."""

    answers: list[str]
    options: list[str] | None
    kind: str  # letter | number | word (of answers[0])
    question: str
    verifier: str
    tolerance: float | None
    same_kind: list[str]  # references of this family of the same kind
    other_families: list[str]  # references of the other families
    rng: random.Random


def _pick(rng: random.Random, choices: list[str], exclude: Collection[str], tries: int = 8) -> str | None:
    """A random element of `choices` not in `exclude`, or None after `tries` draws (pools can be large)."""
    for _ in range(tries if choices else 0):
        choice = rng.choice(choices)
        if choice not in exclude:
            return choice
    return None


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}:{key}".encode()).hexdigest()


def _kind(text: str, letters: bool) -> str:
    """What kind of answer `text` is, for choosing a near miss of the same kind: letter, number or word."""
    if letters and reference_letter(text) is not None:
        return "letter"
    return "number" if text_info(text)[1] is not None else "word"


def _format_number(value: float, like: Number) -> str:
    text = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
    if like.percent:
        text += "%"
    if like.currency:
        text = like.currency + text
    if like.unit:
        text += " " + like.unit
    return text


def near_number(reference: str, verifier: str, tolerance: float | None, rng: random.Random) -> str | None:
    """The reference's number moved just beyond the verifier's tolerance, in the same form (integer, %, unit)."""
    number = text_info(reference)[1]
    if number is None:
        return None
    value = number.value
    if verifier == "numeric":
        bound = (DEFAULT_TOLERANCE if tolerance is None else tolerance) * max(1.0, abs(value))
    else:  # relaxed and the rest: relative to the reference; a reference of 0 needs exactly 0
        bound = RELATIVE_TOLERANCE * abs(value)
    if value.is_integer():
        step = math.floor(bound) + 1
    else:
        step = max(bound * 1.5, abs(value) * 1e-6, 1e-9)
    sign = rng.choice((-1, 1))
    if value >= 0 and value - step < 0:
        sign = 1  # a count or an amount stays non-negative
    return _format_number(value + sign * step, number)


def neighbour_letter(reference: str, options: list[str] | None, rng: random.Random) -> str | None:
    """The option letter next to the reference's letter (within the options when they are known)."""
    letter = reference_letter(reference, options)
    if letter is None:
        return None
    last = chr(64 + len(options)) if options and len(options) <= 26 else "Z"
    neighbours = [chr(ord(letter) + d) for d in (-1, 1) if "A" <= chr(ord(letter) + d) <= last]
    return rng.choice(neighbours) if neighbours else None


# Words that may state a number: a word candidate for a numeric reference must not be one of these.
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million "
    "billion dozen half none no single once twice".split()
)


def plainly_different(candidate: str, references: list[str]) -> bool:
    """A word candidate that neither equals, contains nor is contained in any reference (normalised), and that
    names no number when a reference is a number ("ten" may well mean 10)."""
    text = text_info(candidate)[0]
    if any(text_info(ref)[1] is not None for ref in references):
        if NUMBER_WORDS & set(text.replace("-", " ").split()):
            return False
    for ref in references:
        ref_text = text_info(ref)[0]
        if not text or not ref_text or text in ref_text or ref_text in text:
            return False
    return True


_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
         "seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_word(value: float) -> str | None:
    """An integer from 0 to 99 in English words (`42` -> `forty-two`); None for anything else."""
    if not float(value).is_integer() or not 0 <= value < 100:
        return None
    n = int(value)
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens - 2] + (f"-{_ONES[ones]}" if ones else "")


_HOW_MANY_RE = re.compile(r"\bhow many ([a-z]+(?: [a-z]+)*)", re.IGNORECASE)
# Where the counted phrase ends ("How many red cubes | are left?", "... | exist?").
_NOT_NOUNS = {"are", "is", "do", "does", "of", "in", "were", "will", "can", "would", "have", "has", "exist", "there",
              "left", "remain"}


def counted_noun(question: str) -> str | None:
    """The plural noun a "How many ... ?" question counts ("How many red cubes are left?" -> "red cubes")."""
    m = _HOW_MANY_RE.search(question)
    if m is None:
        return None
    words = []
    for word in m.group(1).lower().split():
        if word in _NOT_NOUNS:
            break
        words.append(word)
    return " ".join(words) or None


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _wrong_number(q: _Question) -> float | None:
    """A number certainly wrong for the question: the reference's moved beyond the tolerance."""
    text = near_number(q.answers[0], q.verifier, q.tolerance, q.rng) if q.kind == "number" else None
    return text_info(text)[1].value if text is not None else None


def _wrong_option(q: _Question) -> str | None:
    """The text of an option other than the reference's."""
    letter = neighbour_letter(q.answers[0], q.options, q.rng) if q.kind == "letter" and q.options else None
    return q.options[ord(letter) - 65] if letter and ord(letter) - 65 < len(q.options) else None


# Known-wrong forms: question -> [(candidate, the wrong value it states in plain form)], first usable one is taken.
def _kw_near_number(q):
    text = near_number(q.answers[0], q.verifier, q.tolerance, q.rng) if q.kind == "number" else None
    return [(text, text)] if text else []


def _kw_neighbour_letter(q):
    letter = neighbour_letter(q.answers[0], q.options, q.rng) if q.kind == "letter" else None
    return [(letter, letter)] if letter else []


def _kw_number_word(q):
    value = _wrong_number(q)
    word = number_word(value) if value is not None else None
    return [(word, str(int(value)))] if word else []


def _kw_other_word(q):
    word = _pick(q.rng, q.same_kind, q.answers) if q.kind == "word" else None
    return [(word, word)] if word else []


def _kw_option_text(q):
    text = _wrong_option(q)
    return [(f"It is the {text}.", text)] if text else []


def _kw_sentence(q):
    if q.kind == "number":
        value = _wrong_number(q)
        if value is None:
            return []
        plain = str(int(value)) if float(value).is_integer() else f"{value:.6g}"
        noun = counted_noun(q.question)
        return [(f"There are {plain} {noun}." if noun else f"The answer is {plain}.", plain)]
    word = _pick(q.rng, q.same_kind, q.answers) if q.kind == "word" else None
    return [(f"The answer is {word}.", word)] if word else []


def _kw_unrelated(q):
    other = _pick(q.rng, q.other_families, q.answers) if q.rng.random() < 0.5 else None
    text = other or q.rng.choice(UNRELATED_ANSWERS)
    return [(text, text)]


KNOWN_WRONG_FORMS: dict[str, Callable[[_Question], list[tuple[str, str]]]] = {
    NEAR_NUMBER: _kw_near_number,
    NUMBER_WORD: _kw_number_word,
    NEIGHBOUR_LETTER: _kw_neighbour_letter,
    OPTION_TEXT: _kw_option_text,
    OTHER_WORD: _kw_other_word,
    SENTENCE: _kw_sentence,
    UNRELATED: _kw_unrelated,
}


# Known-right forms: question -> candidate rewrites of the reference, in order of preference.
def _kr_number_word(q):
    number = text_info(q.answers[0])[1] if q.kind == "number" else None
    word = number_word(number.value) if number is not None and not (number.unit or number.percent) else None
    return [word] if word else []


def _kr_count_noun(q):
    noun = counted_noun(q.question) if q.kind == "number" else None
    if noun is None:
        return []
    word = _kr_number_word(q)
    return [f"{q.answers[0]} {noun}", *(f"{w} {noun}" for w in word)]


def _kr_article(q):
    return [f"{_article(q.answers[0])} {q.answers[0]}", f"the {q.answers[0]}"] if q.kind == "word" else []


def _kr_plural(q):
    word = q.answers[0]
    return [word + "s"] if q.kind == "word" and word.isalpha() and not word.endswith("s") else []


def _right_option(q):
    letter = reference_letter(q.answers[0], q.options) if q.kind == "letter" and q.options else None
    return q.options[ord(letter) - 65] if letter and ord(letter) - 65 < len(q.options) else None


def _kr_option_text(q):
    text = _right_option(q)
    return [text, f"the {text}"] if text else []


def _kr_sentence(q):
    if q.kind == "letter":
        text = _right_option(q)
        return [f"It is the {text}."] if text else []
    noun = counted_noun(q.question) if q.kind == "number" else None
    return [f"There are {q.answers[0]} {noun}." if noun else f"The answer is {q.answers[0]}."]


KNOWN_RIGHT_FORMS: dict[str, Callable[[_Question], list[str]]] = {
    NUMBER_WORD: _kr_number_word,
    COUNT_NOUN: _kr_count_noun,
    ARTICLE: _kr_article,
    PLURAL: _kr_plural,
    OPTION_TEXT: _kr_option_text,
    SENTENCE: _kr_sentence,
}


def _rejected_undecided(candidate: str, q: _Question) -> tuple[bool, bool]:
    """(the verifier rejects `candidate` as a comparison, the decisive rule settles that rejection)."""
    if type(check_inputs(candidate, q.answers)) is Decision:
        return False, False
    if compare(q.verifier, candidate, q.answers, options=q.options, numeric_tolerance=q.tolerance).match:
        return False, False
    return True, decisive_mismatch(q.verifier, candidate, q.answers, options=q.options,
                                   numeric_tolerance=q.tolerance)


def is_known_wrong(candidate: str, plain: str, q: _Question) -> bool:
    """The verifier rejects the candidate, and the value it states (`plain`) is certainly wrong: a number or a
    letter the decisive rule rejects, or a word plainly different from every reference."""
    if not _rejected_undecided(candidate, q)[0] or not _rejected_undecided(plain, q)[0]:
        return False
    if text_info(plain)[1] is not None or reference_letter(plain, q.options) is not None:
        return decisive_mismatch(q.verifier, plain, q.answers, options=q.options, numeric_tolerance=q.tolerance)
    return plainly_different(plain, q.answers)


KNOWN_WRONG = "known_wrong"
KNOWN_RIGHT = "known_right"


def form_candidate(side: str, form: str, q: _Question, judge_scope: str = "undecided") -> str | None:
    """The first candidate of `form` that is usable on `side`, or None.

    known_wrong: the verifier rejects it, its stated value is certainly wrong (`is_known_wrong`), and under
    `judge_scope: undecided` the decisive rule leaves it to the judge. known_right: the verifier rejects it and the
    decisive rule leaves it undecided (a rewrite the verifier accepts is not a false negative)."""
    if side == KNOWN_WRONG:
        for candidate, plain in KNOWN_WRONG_FORMS[form](q):
            rejected, decisive = _rejected_undecided(candidate, q)
            if rejected and (judge_scope == "all" or not decisive) and is_known_wrong(candidate, plain, q):
                return candidate
        return None
    return next((c for c in KNOWN_RIGHT_FORMS[form](q) if _rejected_undecided(c, q) == (True, False)), None)


def question(qa: dict[str, Any], verifier: str, seed: int = 0, tolerance: float | None = None,
             same_kind: list[str] | None = None, other_families: list[str] | None = None) -> _Question:
    """One prepared QA (`answers`, `options`, `question`) as the forms see it; tests build single ones with it."""
    options = list(qa.get("options") or []) or None
    letters = verifier == "mc" or options is not None
    return _Question(answers=list(qa["answers"]), options=options, kind=_kind(qa["answers"][0], letters),
                     question=qa.get("question", ""), verifier=verifier, tolerance=tolerance,
                     same_kind=same_kind or [], other_families=other_families or [],
                     rng=random.Random(_rank(seed, "question")))


def _questions(prepared: dict[str, dict[str, Any]], verifier_for: Callable[[str], str], seed: int,
               tolerance: float | None, side: str) -> Iterator[tuple[str, Iterator[tuple[str, _Question]]]]:
    """Per family (sorted): its questions in a fixed-seed order, each with what the forms need."""
    by_family: dict[str, list[str]] = {}
    for qa_id, qa in prepared.items():
        if qa["answers"]:
            by_family.setdefault(qa["family"], []).append(qa_id)
    references = {family: sorted({prepared[i]["answers"][0] for i in ids}) for family, ids in by_family.items()}
    for family in sorted(by_family):
        verifier = verifier_for(family)
        # Rows with options are multiple choice under every verifier (rsgen.verifiers.frame): letters are letters.
        letters = verifier == "mc" or any(prepared[i].get("options") for i in by_family[family])
        by_kind: dict[str, list[str]] = {}
        for ref in references[family]:
            by_kind.setdefault(_kind(ref, letters), []).append(ref)
        others = sorted({ref for name, refs in references.items() if name != family for ref in refs})
        yield family, _family_questions(prepared, sorted(by_family[family], key=lambda i: _rank(seed, i)), letters,
                                        verifier, tolerance, by_kind, others, seed, side)


def _family_questions(prepared, ordered: list[str], letters: bool, verifier: str, tolerance: float | None,
                      by_kind: dict[str, list[str]], others: list[str], seed: int, side: str):
    """The family's questions in `ordered` order, each built when it is reached: a family needs only about
    `size` of them, and building one for every question of a 1M-pair pool took most of the judge's start-up."""
    for qa_id in ordered:
        qa = prepared[qa_id]
        kind = _kind(qa["answers"][0], letters)
        yield qa_id, _Question(
            answers=list(qa["answers"]), options=list(qa.get("options") or []) or None, kind=kind,
            question=qa.get("question", ""), verifier=verifier, tolerance=tolerance,
            same_kind=by_kind.get(kind, []), other_families=others,
            rng=random.Random(_rank(seed, f"{side}:{qa_id}")))


def _rotated(forms: list[str], start: int) -> list[str]:
    start %= len(forms)
    return forms[start:] + forms[:start]


def known_wrong_pairs(
    prepared: dict[str, dict[str, Any]],
    verifier_for: Callable[[str], str],
    size: int,
    seed: int,
    numeric_tolerance: float | None = None,
    judge_scope: str = "undecided",
) -> list[CalibrationPair]:
    """Up to `size` known-wrong pairs per family, sorted by (family, id); under `judge_scope: undecided` only
    candidates the decisive rule leaves to the judge.

    `prepared`: QA id -> {"family", "answers", "options", "question"} (the prepared pool); `verifier_for(family)`
    names the family's verifier. Depends only on the pool, the verifiers, the scope and the seed."""
    forms = [f for f in KNOWN_WRONG_FORMS if judge_scope == "all" or f not in DECISIVE_FORMS]
    return _draw_pairs(KNOWN_WRONG, forms, prepared, verifier_for, size, seed, numeric_tolerance, judge_scope)


def known_right_pairs(
    prepared: dict[str, dict[str, Any]],
    verifier_for: Callable[[str], str],
    size: int,
    seed: int,
    numeric_tolerance: float | None = None,
) -> list[CalibrationPair]:
    """Up to `size` known-right pairs per family, sorted by (family, id): a rewrite of the reference that keeps its
    meaning, that the verifier rejects and the decisive rule leaves undecided (a false negative of the verifier,
    which the judge exists to recover)."""
    return _draw_pairs(KNOWN_RIGHT, list(KNOWN_RIGHT_FORMS), prepared, verifier_for, size, seed, numeric_tolerance)


def _draw_pairs(
    side: str,
    forms: list[str],
    prepared: dict[str, dict[str, Any]],
    verifier_for: Callable[[str], str],
    size: int,
    seed: int,
    numeric_tolerance: float | None,
    judge_scope: str = "undecided",
) -> list[CalibrationPair]:
    """Up to `size` pairs of `side` per family, sorted by (family, id). Forms rotate so that a family's pairs mix
    them; a question none of its forms fits is passed over."""
    pairs: list[CalibrationPair] = []
    for family, questions in _questions(prepared, verifier_for, seed, numeric_tolerance, side):
        made = 0
        for qa_id, q in questions:
            if made >= size:
                break
            for form in _rotated(forms, made):
                found = form_candidate(side, form, q, judge_scope)
                if found is not None:
                    pairs.append(CalibrationPair(qa_id, family, form, found))
                    made += 1
                    break
    return sorted(pairs, key=lambda p: (p.family, p.id))
