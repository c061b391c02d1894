"""Decontamination: no image or question of an evaluation set the user will report on stays in the pool.

The recipe's `decontaminate:` lists evaluation sets in the form of `sources`. Prepare reads them once per run,
before the pool, into an index that keeps no images and no question texts:

- **images**: `rsgen.prepare.perceptual` signatures (two 64-bit hashes and a shape in memory, a small thumbnail
  per image in a file under prepare's work folder). Image workers check every pool image against it; a
  confirmed copy drops all the image's QA pairs as `contaminated_image`.
- **questions**: 8-byte hashes of normalised word n-grams, `NGRAM` = 8 words (as open-r1's decontamination).
  Normalised: Unicode NFKC, case-folded, every run of non-word characters one space. A question shorter than
  `NGRAM` words has no gram and is never matched, as in open-r1: short questions ("What shape is the large
  thing?", "How many cylinders are there?") are asked of images in every VQA set, so one of them identifies no
  evaluation item (measured on the demo: indexed whole, they removed questions of pool images the evaluation set
  does not hold); a copied evaluation item with a short question is still caught by its image. A pool QA pair is dropped as `contaminated_question` when at least
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

from rsgen.prepare.perceptual import (
    MAX_SOLID_PIXELS,
    PROPOSE_BITS,
    SIGNATURE_VERSION,
    THUMB,
    ImageSignature,
    image_signature,
)

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
    """Hashes of the question's word n-grams; none when it is shorter than NGRAM words."""
    words = question_words(text)
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
            grams = question_grams(key)
            if not grams:
                continue
            self.questions.append(first)
            for gram in grams:
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


# ------------------------------------------------------------------------------------------ the index of a run


def eval_signature(job: tuple[str, bytes | str]) -> ImageSignature | None:
    """The signature of one evaluation image (kind "bytes" or "path"), None when it cannot be read. Runs in the
    image workers: it imports numpy and Pillow only."""
    import io

    from PIL import Image

    kind, payload = job
    try:
        if kind == "path":
            with open(payload, "rb") as f:
                payload = f.read()
        with Image.open(io.BytesIO(payload)) as image:
            image.load()
            return image_signature(image)
    except Exception:  # an unreadable evaluation image is counted in the report, not fatal
        return None


def eval_signatures(jobs: list[tuple[str, bytes | str]]) -> list[ImageSignature | None]:
    return [eval_signature(job) for job in jobs]


class Decontamination:
    """The run's evaluation index: image signatures in `directory` (hashes in memory, thumbnails memory-mapped),
    identifying question n-grams in memory, and the tallies the report shows."""

    def __init__(self, directory, images: list[EvalRow], questions: QuestionIndex, sets: list[EvalSetTally]):
        self.directory = str(directory)
        self.images = images  # position in the image index -> where the evaluation image came from
        self.questions = questions
        self.sets = sets
        self._removed_images: set[tuple[int, str]] = set()

    @property
    def image_index_dir(self) -> str | None:
        return self.directory if self.images else None

    def question_match(self, question: Any) -> EvalRow | None:
        return self.questions.match(question)

    def removed(self, row: EvalRow, reason: str, n: int, pool_image: str | None = None) -> None:
        """Count `n` pool QA pairs removed for matching `row`; `pool_image` (sha256) for an image match: an image
        on several rows (one row per question) counts once."""
        tally = self.sets[row.set_index]
        tally.removed[reason] += n
        if pool_image is not None and (row.set_index, pool_image) not in self._removed_images:
            self._removed_images.add((row.set_index, pool_image))
            tally.removed_images += 1

    def matched(self, row: EvalRow) -> dict[str, Any]:
        """The evaluation row a pool row matched, as the report's examples show it."""
        out = {"eval_set": eval_set_name(row.set_index), "eval_dataset": self.sets[row.set_index].description.get(
            "source_dataset"), "eval_where": row.where}
        if row.question is not None:
            out["eval_question"] = row.question
        return out

    def report(self) -> dict[str, Any]:
        sets = []
        for i, tally in enumerate(self.sets):
            sets.append({**tally.to_dict(), "name": eval_set_name(i)})
        return {
            "images": {"method": "pHash of the whole image and of its content box propose (within "
                                 f"{PROPOSE_BITS} of 64 bits), a pixel comparison of the aligned content boxes "
                                 f"confirms (at most {MAX_SOLID_PIXELS} solid differing pixels of {THUMB}x{THUMB})",
                       "signature_version": SIGNATURE_VERSION},
            "questions": {"ngram": NGRAM, "match_share": QUESTION_MATCH_SHARE, "templated_share": TEMPLATED_SHARE,
                          "version": QUESTION_VERSION},
            "sets": sets,
        }


EVAL_BATCH = 256  # evaluation images per batch handed to the workers


def build_decontamination(recipe, directory, submit_map) -> Decontamination:
    """Read every evaluation set once: images -> signatures (computed by `submit_map(fn, jobs)` in the image
    workers, written to `directory` batch by batch, so no evaluation image is held), questions -> n-gram hashes.
    The same image on several rows (one row per question) is indexed once."""
    import hashlib
    import os

    import numpy as np

    from rsgen.prepare.images import image_payload
    from rsgen.prepare.sources import describe_source, iter_raw_rows

    os.makedirs(directory, exist_ok=True)
    images: list[EvalRow] = []
    seen: set = set()
    whole, content, aspect = [], [], []
    questions = QuestionIndex()
    sets = [EvalSetTally(describe_source(s)) for s in recipe.decontaminate]
    rows_per_set: dict[int, int] = {}
    with open(os.path.join(directory, "thumbs.u8"), "wb") as thumbs:
        def flush(batch: list[tuple[EvalRow, tuple]]) -> None:
            for (row, _), sig in zip(batch, submit_map(eval_signatures, [job for _, job in batch])):
                if sig is None:
                    sets[row.set_index].images_unreadable += 1
                    continue
                sets[row.set_index].images += 1
                images.append(row)
                whole.append(sig.hash_whole)
                content.append(sig.hash_content)
                aspect.append(sig.aspect)
                thumbs.write(sig.thumb)

        batch: list[tuple[EvalRow, tuple]] = []
        for set_index, source in enumerate(recipe.decontaminate):
            tally = sets[set_index]
            for row in iter_raw_rows(source, set_index):
                tally.rows += 1
                for qa in row.qas:
                    tally.questions += questions.add(set_index, row.where, qa.question)
                rows_per_set[set_index] = rows_per_set.get(set_index, 0) + max(1, len(row.qas))
                kind, payload, _ = image_payload(row.image, row.image_bases)
                if kind not in ("bytes", "path"):
                    if row.image is not None:
                        tally.images_unreadable += 1
                    continue
                key = hashlib.sha256(payload).digest() if kind == "bytes" else ("path", payload)
                if key in seen:
                    continue
                seen.add(key)
                batch.append((EvalRow(set_index, row.where), (kind, payload)))
                if len(batch) >= EVAL_BATCH:
                    flush(batch)
                    batch = []
        flush(batch)
    np.savez(os.path.join(directory, "hashes.npz"), hash_whole=np.array(whole, dtype=np.uint64),
             hash_content=np.array(content, dtype=np.uint64), aspect=np.array(aspect, dtype=np.float64))
    templated = questions.templated_sets(rows_per_set)
    indexed = questions.build(templated)
    for i, tally in enumerate(sets):
        tally.templated = i in templated
        tally.questions_indexed = indexed.get(i, 0)
    return Decontamination(directory, images, questions, sets)
