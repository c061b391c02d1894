"""Decontamination: no image or question of an evaluation set the user will report on stays in the pool.

The recipe's `decontaminate:` lists evaluation sets in the form of `sources`. Prepare reads them once per run,
before the pool, into an index that keeps no images and no question texts:

- **images**: `rsgen.prepare.perceptual` signatures (two 64-bit hashes and a shape in memory, a small thumbnail
  per image in a file under prepare's work folder). Image workers check every pool image against it; a
  confirmed copy drops all the image's QA pairs as `contaminated_image`.
- **questions**: 8-byte hashes of normalised word n-grams, `NGRAM` = 8 words (as open-r1's decontamination).
  Normalised: Unicode NFKC, case-folded, every run of non-word characters one space. A question shorter than
  `NGRAM` words is one gram, itself. A pool QA pair is dropped as `contaminated_question` when at least
  `QUESTION_MATCH_SHARE` of its grams are grams of one evaluation question.

  Only grams that identify one evaluation question are indexed. A gram found in two or more different
  evaluation questions is phrasing ("what is the difference between the highest and the lowest"), and so is a
  question text asked of two or more evaluation images. An evaluation set whose questions come from templates
  (more than `TEMPLATED_SHARE` of its rows ask a question another of its rows asks, as in CLEVR) has no question
  that identifies an item -- the same text is asked of thousands of images, and an unrelated pool that uses the
  same templates would match everywhere -- so its questions are not indexed, and the report says so; its
  images are checked as any others.

The report (`prepare_report.json`, key `decontamination`) lists each evaluation set with what it held and what
it removed, and every drop has examples with the pool row and the evaluation row it matched.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NGRAM = 8
QUESTION_MATCH_SHARE = 0.5
TEMPLATED_SHARE = 0.2
QUESTION_VERSION = 1  # part of the prepared pool's fingerprint

_NON_WORD = re.compile(r"[\W_]+")


def question_words(text: str) -> list[str]:
    return _NON_WORD.sub(" ", unicodedata.normalize("NFKC", text).casefold()).split()


def _gram_hash(words: list[str]) -> int:
    return int.from_bytes(hashlib.blake2b(" ".join(words).encode(), digest_size=8).digest(), "little")


def question_grams(text: str) -> set[int]:
    """Hashes of the question's word n-grams; the whole question when it is shorter than NGRAM words."""
    words = question_words(text)
    if not words:
        return set()
    if len(words) < NGRAM:
        return {_gram_hash(words)}
    return {_gram_hash(words[i : i + NGRAM]) for i in range(len(words) - NGRAM + 1)}


def eval_set_name(index: int) -> str:
    return f"decontaminate[{index}]"


@dataclass
class EvalRow:
    """Where an indexed evaluation image or question came from, for the report's examples."""

    set_index: int
    where: str
    question: str | None = None


@dataclass
class EvalSetTally:
    description: dict[str, str]
    rows: int = 0
    images: int = 0  # distinct images indexed
    images_unreadable: int = 0
    questions: int = 0
    questions_indexed: int = 0
    templated: bool = False
    removed: Counter = field(default_factory=Counter)  # reason -> QA pairs of the pool
    removed_images: int = 0  # pool images whose QA pairs went as contaminated_image

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": None,  # filled by the caller
            **self.description,
            "rows": self.rows,
            "images_indexed": self.images,
            "images_unreadable": self.images_unreadable,
            "questions": self.questions,
            "questions_indexed": self.questions_indexed,
            "questions_templated": self.templated,
            "removed_qa_pairs": dict(sorted(self.removed.items())),
            "removed_pool_images": self.removed_images,
        }


class QuestionIndex:
    """Identifying n-gram hashes of the evaluation questions -> the evaluation question they identify."""

    def __init__(self):
        self._texts: dict[str, list] = {}  # normalised text -> [first EvalRow, rows asking it, set index]
        self.gram_owner: dict[int, int] = {}  # gram hash -> position in `questions`
        self.questions: list[EvalRow] = []

    def add(self, set_index: int, where: str, question: Any) -> bool:
        if not isinstance(question, str) or not question.strip():
            return False
        key = " ".join(question_words(question))
        if not key:
            return False
        entry = self._texts.get(key)
        if entry is None:
            self._texts[key] = [EvalRow(set_index, where, question), 1]
        else:
            entry[1] += 1
        return True

    def templated_sets(self, rows_per_set: dict[int, int]) -> set[int]:
        """Sets where more than TEMPLATED_SHARE of the rows ask a question another row of the set asks."""
        repeated: Counter = Counter()
        for first, count in self._texts.values():
            if count > 1:
                repeated[first.set_index] += count
        return {s for s, n in repeated.items() if rows_per_set.get(s) and n / rows_per_set[s] > TEMPLATED_SHARE}

    def build(self, skip_sets: set[int]) -> Counter:
        """Index the identifying grams; returns indexed questions per set. Frees the texts."""
        owners: dict[int, int] = {}
        shared: set[int] = set()
        for key, (first, count) in self._texts.items():
            if count > 1 or first.set_index in skip_sets:
                continue  # asked of several evaluation images: it identifies none of them
            position = len(self.questions)
            self.questions.append(first)
            for gram in question_grams(key):
                if gram in owners and owners[gram] != position:
                    shared.add(gram)
                owners[gram] = position
        self.gram_owner = {g: p for g, p in owners.items() if g not in shared}
        self._texts = {}
        return Counter(q.set_index for q in self.questions)

    def match(self, question: Any) -> EvalRow | None:
        if not isinstance(question, str) or not self.gram_owner:
            return None
        grams = question_grams(question)
        if not grams:
            return None
        hits = Counter(self.gram_owner[g] for g in grams if g in self.gram_owner)
        if not hits:
            return None
        position, count = hits.most_common(1)[0]
        return self.questions[position] if count / len(grams) >= QUESTION_MATCH_SHARE else None
