"""Cleaning steps of the prepare stage: text checks, answer normalisation, task purity, multiple-choice
normalisation, provenance and duplicate merging.

Every step has a name and a version (`STEPS`); a row records in `clean_meta.steps` the steps that admitted or
changed it, next to `rsgen.schema.POLICY_VERSION`. Every QA pair that a step removes is counted under exactly one
reason (the first check it fails, in the order of `check_qa`), so the report always balances.

Longer than most modules (~600 lines) on purpose: it is `check_qa`'s ordered list of steps and each step's
helpers, the order in which the report counts drops; multiple-choice normalisation is the one separable part.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from typing import Any

from rsgen.config import RecipeError, SourceConfig
from rsgen.verifiers.normalize import canonical_text

# Name -> (version, what it does). A step's version changes whenever its behaviour does.
STEPS: dict[str, tuple[int, str]] = {
    "text_validate": (2, "question and answer present, strings, non-empty, free of model special tokens; Unicode "
                         "NFC without zero-width and bidi marks; list-valued cells read as lists"),
    "answer_normalize": (2, "per-source answer normalisation listed in the recipe"),
    "task_purity": (1, "per-source question patterns / source allowlist keep only genuine benchmark QA"),
    "mc_normalise": (2, "options re-rendered as a lettered block, reference (text, letter or option index) "
                        "rewritten to the bare letter"),
    "image_validate": (1, "decodable, not truncated, non-empty, aspect ratio and pixel count within limits"),
    "image_upright": (1, "EXIF orientation applied to the pixels, stored as PNG without the tag"),
    "image_to_rgb": (1, "non-RGB image converted to RGB (alpha composited on white), stored as PNG"),
    "provenance": (1, "recorded image reference / source id resolves to the attached image"),
    "dedup_merge": (1, "the same question twice on the same image merged; conflicting answers dropped"),
}
STEP_ORDER = tuple(STEPS)


def step_label(name: str) -> str:
    return f"{name}@{STEPS[name][0]}"


def ordered_steps(names: set[str] | list[str]) -> list[str]:
    wanted = set(names)
    return [step_label(n) for n in STEP_ORDER if n in wanted]


# ------------------------------------------------------------------------------------------------ special tokens

# Control tokens of the chat templates and processors of the supported VLM families. Text holding one would be
# parsed as structure (an extra image, an end of turn) instead of being read as text.
SPECIAL_TOKEN_PATTERN = re.compile(
    r"<\|[^|<>\s]{1,40}\|>"  # Qwen / ChatML / Llama 3 style: <|im_end|>, <|image_pad|>, <|vision_start|> ...
    r"|<(?:image|video|img|/img|IMG_CONTEXT|fake_token_around_image|global-img|end_of_utterance"
    r"|start_of_image|end_of_image|image_soft_token|start_of_turn|end_of_turn|think|/think)>"
    r"|<row_\d+_col_\d+>"
)


def find_special_token(text: str) -> str | None:
    m = SPECIAL_TOKEN_PATTERN.search(text)
    return m.group(0) if m else None


# ------------------------------------------------------------------------------------------------ answers


# "Answer: 3", "The answer is 3.", "Answer - 3", "Final answer: B", "The correct answer is (B)".
# A dash separates only when a space follows it: "Answer -3" keeps its minus sign.
_ANSWER_PREFIX = re.compile(
    r"^\s*(?:the\s+)?(?:final\s+|correct\s+|short\s+)?answer\s*"
    r"(?P<sep>is\b\s*(?:[:：]|[\-–—](?=\s))?|[:：]|[\-–—](?=\s))\s*",
    re.IGNORECASE,
)


def _strip_answer_prefix(text: str) -> str:
    m = _ANSWER_PREFIX.match(text)
    if m is None:
        return text
    rest = text[m.end() :]
    if m.group("sep")[:2].lower() == "is" and rest.endswith(".") and not rest.endswith(".."):
        rest = rest[:-1]  # "The answer is 3." is a sentence: its full stop is not part of the answer
    return rest


def _strip_trailing_period(text: str) -> str:
    return text[:-1].rstrip() if text.endswith(".") else text


ANSWER_NORMALIZERS = {
    "strip_answer_prefix": _strip_answer_prefix,  # "Answer: 3" -> "3" (the_cauldron's assistant turns)
    "strip_trailing_period": _strip_trailing_period,  # "3." -> "3"
    "lowercase": str.lower,
    "collapse_whitespace": lambda t: " ".join(t.split()),
}

FAMILY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")  # becomes a config name: `{Family}_RS_think`


def qa_id(family: str, image_sha256: str, question: str) -> str:
    """Stable id of a QA pair: a function of what it is, never of where or when it was read."""
    return hashlib.sha256(f"{family}\n{image_sha256}\n{question}".encode()).hexdigest()[:16]


def answer_key(answer: str) -> str:
    return " ".join(answer.split()).casefold()


# ------------------------------------------------------------------------------------------------ per-source rules


@dataclass
class SourceRules:
    """A source's cleaning rules, validated once (bad rules are recipe errors, not per-row drops)."""

    template: str
    instruction: str
    normalizers: list[tuple[str, Any]]
    keep_patterns: list[re.Pattern]
    allowlist: list[str] | None
    answer_index_base: int | None = None

    @classmethod
    def from_source(cls, source: SourceConfig, instruction: str, where: str) -> SourceRules:
        try:
            probe = source.question_template.format(question="\0")
        except (KeyError, IndexError, ValueError) as e:
            raise RecipeError(
                f"{where}: question_template {source.question_template!r} is not a valid format string with "
                f"one `{{question}}` placeholder ({e!r})"
            ) from e
        if "\0" not in probe:
            raise RecipeError(f"{where}: question_template {source.question_template!r} lacks `{{question}}`")
        normalizers = []
        for name in source.answer_normalization:
            if name not in ANSWER_NORMALIZERS:
                raise RecipeError(
                    f"{where}: unknown answer_normalization {name!r}; known: {', '.join(sorted(ANSWER_NORMALIZERS))}"
                )
            normalizers.append((name, ANSWER_NORMALIZERS[name]))
        patterns = []
        for pattern in source.keep_question_patterns:
            try:
                patterns.append(re.compile(pattern))
            except re.error as e:
                raise RecipeError(f"{where}: keep_question_patterns entry {pattern!r} is not a regex: {e}") from e
        if source.source_allowlist is not None and not source.source_id_column and source.format != "cauldron":
            raise RecipeError(
                f"{where}: source_allowlist needs source_id_column (the column whose values name each row's origin)"
            )
        if source.family is not None and not FAMILY_NAME.match(source.family):
            raise RecipeError(
                f"{where}: family {source.family!r} must be letters, digits, '_', '-' or '.' (it names dataset configs)"
            )
        if source.answer_index_base not in (None, 0, 1):
            raise RecipeError(
                f"{where}: answer_index_base {source.answer_index_base!r} must be 0 (first option is 0, as in "
                "ScienceQA), 1 (first option is 1) or null (answers are option texts or letters)"
            )
        return cls(source.question_template, instruction, normalizers, patterns, source.source_allowlist,
                   source.answer_index_base)

    def prompt(self, question: str) -> str:
        """The exact user text the model receives: template, then the instruction on a new line."""
        text = self.template.format(question=question)
        return f"{text}\n{self.instruction}" if self.instruction else text

    def allowed_source(self, label: str) -> bool:
        # An entry names a dataset: it matches the label itself, the label's "dataset/..." or "dataset:..." form,
        # or a glob over the whole label.
        for entry in self.allowlist or []:
            if label == entry or label.startswith(entry + "/") or label.startswith(entry + ":"):
                return True
            if any(c in entry for c in "*?[") and fnmatchcase(label, entry):
                return True
        return False


# ------------------------------------------------------------------------------------------------ one QA pair


@dataclass
class CleanQA:
    """A QA pair that passed the text checks; `question` is the final prompt text."""

    question: str
    answers: list[str]
    options: list[str]
    steps: set[str] = field(default_factory=set)
    converted: list[str] = field(default_factory=list)


@dataclass
class Rejected:
    reason: str


def _text_value(value: Any, what: str) -> tuple[str | None, str | None, list[str]]:
    """(text, drop reason, conversions) for a question or a single answer value."""
    if value is None:
        return None, f"{what}_missing", []
    if isinstance(value, str):
        text = canonical_text(value)
        return text, None, (["text_unicode_normalized"] if text != value else [])
    if what == "answer" and isinstance(value, (int, float)) and not isinstance(value, bool):
        # CSV/JSON pools store numeric answers as numbers; the digits are the answer.
        if isinstance(value, float) and value != value:  # NaN: pandas' missing value
            return None, "answer_missing", []
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
            # A typed column holding integers becomes float as soon as one cell is missing (NaN): 3 is stored
            # as 3.0, and the answer is "3", not "3.0".
            value = int(value)
        return str(value), None, ["answer_number_to_string"]
    return None, f"{what}_not_string", []


MAX_LIST_CELL_CHARS = 100_000


def literal_list(text: str) -> list | None:
    """The list a text cell spells as JSON (`["4", "four"]`) or as a Python literal (`['red', 'blue']`), else None.

    CSV and TSV cells, and strings inside JSON, are how many published pools store lists of answers or options."""
    text = text.strip()
    if not (text.startswith("[") and text.endswith("]")) or len(text) > MAX_LIST_CELL_CHARS:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            return None
    return value if isinstance(value, list) else None


def _answers(raw: Any) -> tuple[list[str] | None, str | None, list[str]]:
    converted: list[str] = []
    if isinstance(raw, str):
        parsed = literal_list(raw)
        # Only lists of quoted strings: "[0, 1]" may well be the answer itself (an interval, a vector).
        if parsed is not None and all(isinstance(v, str) for v in parsed):
            raw = parsed
            converted.append("answer_list_parsed")
    values = list(raw) if isinstance(raw, (list, tuple)) else [raw]
    if not values:
        return None, "answer_missing", []
    out: list[str] = []
    for value in values:
        text, reason, conv = _text_value(value, "answer")
        if reason:
            return None, reason, converted
        converted += conv
        out.append(text)
    return out, None, converted


def check_qa(
    rules: SourceRules,
    question: Any,
    answer: Any,
    options: Any,
    source_label: str | None,
) -> CleanQA | Rejected:
    """Run the text steps on one raw QA pair, in order: validate, normalise answers, special tokens, task purity,
    multiple-choice normalisation; build the prompt text."""
    q, reason, question_converted = _text_value(question, "question")
    if reason:
        return Rejected(reason)
    q = q.strip()
    if not q:
        return Rejected("question_empty")
    answers, reason, converted = _answers(answer)
    if reason:
        return Rejected(reason)
    converted = _distinct(question_converted + converted)
    steps = {"text_validate"}
    normalised = []
    for a in answers:
        a = a.strip()
        for name, fn in rules.normalizers:
            new = fn(a).strip()
            if new != a:
                converted.append(f"answer_normalized:{name}")
                steps.add("answer_normalize")
            a = new
        if a and a not in normalised:
            normalised.append(a)
    if not normalised:
        return Rejected("answer_empty")
    option_list, reason, options_converted = _options(options)
    if reason:
        return Rejected(reason)
    converted = _distinct(converted + options_converted)
    for text in (q, *normalised, *option_list):
        if find_special_token(text):
            return Rejected("special_token")
    if rules.keep_patterns:
        if not any(p.search(q) for p in rules.keep_patterns):
            return Rejected("purity_question_pattern")
        steps.add("task_purity")
    if rules.allowlist is not None:
        if not source_label:
            return Rejected("purity_no_source")
        if not rules.allowed_source(source_label):
            return Rejected("purity_source")
        steps.add("task_purity")
    mc = normalise_mc(q, normalised, option_list, rules.answer_index_base)
    if isinstance(mc, Rejected):
        return Rejected(mc.reason)
    if mc is not None:
        q, normalised, option_list, mc_converted = mc
        converted += mc_converted
        steps.add("mc_normalise")
    return CleanQA(rules.prompt(q), normalised, option_list, steps, converted)


def _distinct(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _options(raw: Any) -> tuple[list[str], str | None, list[str]]:
    """(option texts, drop reason, conversions)."""
    if raw is None:
        return [], None, []
    converted = []
    if isinstance(raw, str):
        raw = canonical_text(raw).strip()
        if not raw:
            return [], None, []
        parsed = literal_list(raw)
        if parsed is None:
            parsed = _split_prose_options(raw)
            if parsed is None:
                return [], "mc_unparseable_options", []
            return parsed, None, []
        raw = parsed
        converted.append("options_list_parsed")
    if isinstance(raw, (list, tuple)):
        out = []
        for value in raw:
            if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                return [], "mc_unparseable_options", []
            out.append(canonical_text(str(value)).strip())
        if out and any(not o for o in out):
            return [], "mc_unparseable_options", []
        return _strip_letter_prefixes(out), None, converted
    return [], "mc_unparseable_options", []


# ------------------------------------------------------------------------------------------------ multiple choice

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_LETTER_LINE = re.compile(r"^\(?([A-Z])\s*[.):]\s*(.*\S)\s*$")
_INLINE_MARKER = re.compile(r"(?:(?<=\s)|(?<=^))(?:\(([A-Z])\)|([A-Z])[.):])\s+")
_PROSE_LABEL = re.compile(
    r"(?P<stem>.*?)\s*\b(?:options|choices|choose from|select from|candidates)\s*:\s*(?P<body>.+?)\s*$",
    re.IGNORECASE | re.DOTALL,
)
_LETTER_ANSWER = re.compile(r"^\(?([A-Za-z])\)?[.):]?$")
_LETTER_WITH_TEXT = re.compile(r"^\(?([A-Z])\)?[.):]\s+(.+)$")
_STEM_LABEL = re.compile(r"\s*\b(?:options|choices)\s*:?\s*$", re.IGNORECASE)


def _strip_letter_prefixes(options: list[str]) -> list[str]:
    """["A. red", "B. blue"] -> ["red", "blue"], only when every option carries its own letter in order."""
    matches = [_LETTER_LINE.match(o) for o in options]
    if options and all(matches) and [m.group(1) for m in matches] == list(LETTERS[: len(options)]):
        return [m.group(2) for m in matches]
    return options


def _split_prose_options(body: str) -> list[str] | None:
    body = body.strip().rstrip(".").strip()
    if re.search(r"\d,\d{3}", body):  # a thousands separator: a comma split would cut a number in two
        return None
    if "\n" in body:
        parts = body.split("\n")
    elif ";" in body:
        parts = body.split(";")
    else:
        parts = body.split(",")
        last = re.split(r"\s+or\s+", parts[-1].strip())
        if len(last) == 2:  # "red, blue or green"
            parts = parts[:-1] + last
    parts = [re.sub(r"^\s*(?:or|and)\s+", "", p).strip() for p in parts]
    if len(parts) < 2 or any(not p for p in parts):
        return None
    return _strip_letter_prefixes(parts)


def parse_question_options(question: str) -> tuple[str, list[str], str] | None | Rejected:
    """Find options written inside the question: (stem, option texts, suffix), None when there are none,
    Rejected when options are there but cannot be read unambiguously."""
    lines = question.split("\n")
    # A lettered block: consecutive lines "A. ...", "B. ...", ... (suffix lines after the block are kept).
    for start, line in enumerate(lines):
        m = _LETTER_LINE.match(line.strip())
        if m and m.group(1) == "A":
            options = []
            end = start
            for end in range(start, len(lines)):
                m2 = _LETTER_LINE.match(lines[end].strip())
                if not m2 or m2.group(1) != LETTERS[len(options)]:
                    break
                options.append(m2.group(2))
            else:
                end = len(lines)
            if len(options) >= 2:
                stem = _STEM_LABEL.sub("", "\n".join(lines[:start])).strip()
                return stem, options, "\n".join(lines[end:]).strip()
    # Inline letters: "... (A) red (B) blue (C) green" or "... A. red B. blue".
    markers = list(_INLINE_MARKER.finditer(question))
    for i, m in enumerate(markers):
        if (m.group(1) or m.group(2)) != "A":
            continue
        run = [m]
        for nxt in markers[i + 1 :]:
            if (nxt.group(1) or nxt.group(2)) == LETTERS[len(run)]:
                run.append(nxt)
        before = question[: m.start()].rstrip()
        # The block starts after the stem: a question mark, a colon or a full stop ends it.
        if len(run) >= 2 and before and before[-1] in "?:.":
            options = [question[a.end() : b.start()].strip() for a, b in zip(run, run[1:])]
            options.append(question[run[-1].end() :].strip().rstrip("."))
            if any(not o for o in options):
                return Rejected("mc_unparseable_options")
            return _STEM_LABEL.sub("", before).strip(), options, ""
    # Prose after a label: "... Options: red, blue, green."
    m = _PROSE_LABEL.match(question)
    if m and m.group("stem").strip():
        options = _split_prose_options(m.group("body"))
        if options is None:
            return Rejected("mc_unparseable_options")
        return m.group("stem").strip(), options, ""
    return None


def render_mc(stem: str, options: list[str], suffix: str = "") -> str:
    block = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
    text = f"{stem}\n{block}" if stem else block
    return f"{text}\n{suffix}" if suffix else text


def _letter_for(answer: str, options: list[str]) -> str | None | Rejected:
    keys = [answer_key(_strip_trailing_period(o)) for o in options]
    text_key = answer_key(_strip_trailing_period(answer))
    by_text = [i for i, k in enumerate(keys) if k == text_key]
    m = _LETTER_ANSWER.match(answer)
    if m and LETTERS.index(m.group(1).upper()) < len(options):
        by_letter = LETTERS.index(m.group(1).upper())
        if by_text and by_text != [by_letter]:
            return Rejected("mc_ambiguous_answer")  # "B" is both a letter and another option's text
        return LETTERS[by_letter]
    m = _LETTER_WITH_TEXT.match(answer)
    if m and LETTERS.index(m.group(1)) < len(options):
        idx = LETTERS.index(m.group(1))
        if keys[idx] == answer_key(_strip_trailing_period(m.group(2))):
            return LETTERS[idx]
        return Rejected("mc_ambiguous_answer")  # letter and text disagree
    if len(by_text) == 1:
        return LETTERS[by_text[0]]
    return None


def normalise_mc(
    question: str, answers: list[str], options: list[str], index_base: int | None = None
) -> tuple[str, list[str], list[str], list[str]] | None | Rejected:
    """Multiple-choice normalisation. Returns None for a question that is not multiple choice, else
    (question with a lettered block, [bare letter], option texts, conversions) or a Rejected.

    With `index_base` (0 or 1) an answer written as digits is the option's index (ScienceQA stores 0-based)."""
    parsed = parse_question_options(question)
    if isinstance(parsed, Rejected):
        return parsed
    if options:
        if parsed is not None:
            stem, found, suffix = parsed
            if [answer_key(o) for o in found] != [answer_key(o) for o in options]:
                return Rejected("mc_options_mismatch")  # the text and the options column disagree
        else:
            stem, suffix = question, ""
    elif parsed is not None:
        stem, options, suffix = parsed
    else:
        return None
    if len(options) < 2 or len(options) > len(LETTERS):
        return Rejected("mc_unparseable_options")
    if len({answer_key(o) for o in options}) != len(options):
        return Rejected("mc_duplicate_options")
    letters = []
    by_index = False
    for answer in answers:
        if index_base is not None and answer.isdigit():
            index = int(answer) - index_base
            if not 0 <= index < len(options):
                return Rejected("mc_answer_index_out_of_range")
            letters.append(LETTERS[index])
            by_index = True
            continue
        letter = _letter_for(answer, options)
        if isinstance(letter, Rejected):
            return letter
        letters.append(letter)
    if letters[0] is None:
        return Rejected("mc_answer_not_in_options")
    if len({x for x in letters if x is not None}) > 1:
        return Rejected("mc_ambiguous_answer")  # acceptable answers name different options
    converted = []
    new_question = render_mc(stem, options, suffix)
    if new_question != question:
        converted.append("mc_options_rendered")
    if by_index:
        converted.append("mc_answer_index_to_letter")
    elif letters[0] != answers[0]:
        converted.append("mc_answer_to_letter")
    return new_question, [letters[0]], options, converted


# ------------------------------------------------------------------------------------------------ provenance


def check_image_ref(ref: Any, image_path: str | None, raw_sha: str, stored_sha: str, resolve) -> str | None:
    """Drop reason when a recorded image reference does not resolve to the attached image, else None.

    A reference resolves when it is the image's sha256, names the image's own file, or names a file with the same
    bytes. `resolve(ref)` returns an existing local path for the reference, or None.
    """
    if ref is None or (isinstance(ref, str) and not ref.strip()):
        return "provenance_missing_ref"
    ref = str(ref).strip()
    if ref.lower() in (raw_sha, stored_sha):
        return None
    if image_path and _basename(ref) == _basename(image_path):
        return None
    local = resolve(ref)
    if local is not None:
        try:
            with open(local, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
        except OSError:
            return "provenance_unresolved"
        return None if digest in (raw_sha, stored_sha) else "provenance_mismatch"
    return "provenance_mismatch" if image_path else "provenance_unresolved"


def _basename(path: str) -> str:
    return path.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]


# ------------------------------------------------------------------------------------------------ merging


@dataclass
class SpilledQA:
    """A QA pair that passed every per-row step, waiting to be grouped with the others of its image."""

    seq: int  # position in the input: fixes the order inside a row
    source_index: int
    source_row_id: str
    question: str
    answers: list[str]
    options: list[str]
    steps: list[str]


def merge_duplicates(
    qas: list[SpilledQA],
) -> tuple[list[SpilledQA], list[tuple[SpilledQA, str]], list[SpilledQA]]:
    """The same question twice on one image: merged when the answers agree (acceptable answers united), all copies
    dropped when they conflict. Returns (kept, [(dropped, reason)], copies merged into a kept pair)."""
    by_question: dict[str, list[SpilledQA]] = {}
    for qa in sorted(qas, key=lambda q: q.seq):
        by_question.setdefault(qa.question, []).append(qa)
    kept: list[SpilledQA] = []
    dropped: list[tuple[SpilledQA, str]] = []
    merged: list[SpilledQA] = []
    for copies in by_question.values():
        first = copies[0]
        if len(copies) == 1:
            kept.append(first)
            continue
        same = all(
            answer_key(c.answers[0]) == answer_key(first.answers[0])
            and [answer_key(o) for o in c.options] == [answer_key(o) for o in first.options]
            for c in copies[1:]
        )
        if not same:
            dropped += [(c, "duplicate_conflicting_answers") for c in copies]
            continue
        answers = list(first.answers)
        for c in copies[1:]:
            answers += [a for a in c.answers if a not in answers]
        steps = sorted({s for c in copies for s in c.steps} | {"dedup_merge"})
        kept.append(
            SpilledQA(first.seq, first.source_index, first.source_row_id, first.question, answers, first.options, steps)
        )
        merged += copies[1:]
    kept.sort(key=lambda q: q.seq)
    return kept, dropped, merged
