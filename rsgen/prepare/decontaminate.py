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

Longer than most modules (~500 lines): the index (`QuestionIndex`, `Decontamination`) and how it is built and
cached per evaluation set (`build_decontamination`, its fingerprint) stay together, since the cache's validity
depends on what the index keeps.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsgen.prepare.perceptual import (
    GATE_CELLS,
    GATE_MAX,
    MAX_SOLID_PIXELS,
    PROPOSE_BITS,
    SIGNATURE_VERSION,
    THUMB,
    ImageIndex,
    ImageSignature,
    decode_for_hashing,
    hashing_copy,
    image_signatures,
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
    from_cache: bool = False  # its signatures came from the cache (logged; not in the report, which stays the same)
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
        # Normalised text -> [rows asking it, set index, where and question of the first]: plain lists, an EvalRow
        # only for the texts `build` indexes (a cached set of 14,000 texts is read back ~2x faster).
        self._texts: dict[str, list] = {}
        self.gram_owner: dict[int, int] = {}  # gram hash -> position in `questions`
        self.questions: list[EvalRow] = []

    def add(self, set_index: int, where: str, question: Any) -> bool:
        if not isinstance(question, str) or not question.strip():
            return False
        key = " ".join(question_words(question))
        if not key:
            return False
        self.add_counted(set_index, where, question, key, 1)
        return True

    def add_counted(self, set_index: int, where: str, question: str, key: str, count: int) -> None:
        """`count` rows of one set asking the question of normalised text `key` (the first of them at `where`)."""
        entry = self._texts.get(key)
        if entry is None:
            self._texts[key] = [count, set_index, where, question]
        else:
            entry[0] += count

    def templated_sets(self, rows_per_set: dict[int, int]) -> set[int]:
        """Sets where more than TEMPLATED_SHARE of the rows ask a question another row of the set asks."""
        repeated: Counter = Counter()
        for count, set_index, _, _ in self._texts.values():
            if count > 1:
                repeated[set_index] += count
        return {s for s, n in repeated.items() if rows_per_set.get(s) and n / rows_per_set[s] > TEMPLATED_SHARE}

    def build(self, skip_sets: set[int]) -> Counter:
        """Index the identifying grams; returns indexed questions per set. Frees the texts."""
        owners: dict[int, int] = {}
        shared: set[int] = set()
        for key, (count, set_index, where, question) in self._texts.items():
            if count > 1 or set_index in skip_sets:
                continue  # asked of several evaluation images: it identifies none of them
            position = len(self.questions)
            grams = question_grams(key)
            if not grams:
                continue
            self.questions.append(EvalRow(set_index, where, question))
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


def _decoded(job: tuple[str, bytes | str]):
    """One evaluation image (kind "bytes" or "path"), decoded and reduced for hashing (a batch of them waits to be
    signed: small copies); None when it cannot be read."""
    kind, payload = job
    try:
        if kind == "path":
            with open(payload, "rb") as f:
                payload = f.read()
        return hashing_copy(decode_for_hashing(payload))  # here: a mode Pillow cannot convert is unreadable
    except Exception:  # an unreadable evaluation image is counted in the report, not fatal
        return None


def eval_signatures(jobs: list[tuple[str, bytes | str]]) -> list[ImageSignature | None]:
    """The signatures of evaluation images, None for one that cannot be read. Runs in the image workers: it imports
    numpy and Pillow only."""
    decoded = [_decoded(job) for job in jobs]
    readable = [image for image in decoded if image is not None]
    try:  # packed: as bytes, cheap to send back
        signed = iter([sig.packed() for sig in image_signatures(readable)])
    except Exception:  # an image Pillow decoded but cannot sign: found by signing one at a time
        signed = iter([_signed_alone(image) for image in readable])
    return [None if image is None else next(signed) for image in decoded]


def _signed_alone(image) -> ImageSignature | None:
    try:
        return image_signatures([image])[0].packed()
    except Exception:
        return None


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
                                 f"{PROPOSE_BITS} of 64 bits), {GATE_CELLS}x{GATE_CELLS} cell averages of the aligned "
                                 f"content boxes gate (no cell's colour off by more than {GATE_MAX}), a pixel "
                                 "comparison of the aligned content boxes "
                                 f"confirms (at most {MAX_SOLID_PIXELS} solid differing pixels of {THUMB}x{THUMB})",
                       "signature_version": SIGNATURE_VERSION},
            "questions": {"ngram": NGRAM, "match_share": QUESTION_MATCH_SHARE, "templated_share": TEMPLATED_SHARE,
                          "version": QUESTION_VERSION},
            "sets": sets,
        }


EVAL_BATCH = 256  # evaluation images per batch handed to the workers
CACHE_NAMESPACE = "decontamination"  # the signature cache: cached_assets_path("rsgen", CACHE_NAMESPACE, ...)
# What a cached set folder holds; part of the cache folder's name. 3: thumbs.u8 holds the thumbnails unblurred.
_CACHE_LAYOUT = 3


def signature_cache_root() -> Path:
    """Where evaluation sets' signatures are kept between runs, under the Hugging Face cache conventions:
    `huggingface_hub.cached_assets_path` (HF_ASSETS_CACHE, by default ~/.cache/huggingface/assets/), then
    rsgen/decontamination/signatures-v{SIGNATURE_VERSION}-questions-v{QUESTION_VERSION}-layout-{n}/: a new
    signature or question version looks in a new folder, so it computes again."""
    from huggingface_hub import cached_assets_path

    # HF_ASSETS_CACHE read now, not when huggingface_hub was imported: a process may set it later (tests, bench).
    return cached_assets_path(library_name="rsgen", namespace=CACHE_NAMESPACE, assets_dir=os.getenv("HF_ASSETS_CACHE"),
                              subfolder=f"signatures-v{SIGNATURE_VERSION}-questions-v{QUESTION_VERSION}-ngram{NGRAM}"
                                        f"-layout-{_CACHE_LAYOUT}")


def _hash_file(digest, path: str) -> None:
    digest.update(f"{os.path.abspath(path)}\0{os.path.getsize(path)}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)


def eval_set_fingerprint(source) -> str | None:
    """The content fingerprint of one evaluation set: its source settings (every SourceConfig field) and what it
    reads -- the bytes of its local files (data_files, or every file under an image folder's data_dir), the
    `datasets` fingerprint of a Hub dataset (it changes with the data), the drawing code's version for the demo
    pool. None for a streamed Hub dataset, which has no fingerprint before it is read: its signatures are computed
    on every run. (Images that rows name by path are checked by size and time when the cache is read.)"""
    import dataclasses

    from rsgen import __version__
    from rsgen.config import DEMO_DATASET
    from rsgen.prepare.sources import _expand_files, source_where

    digest = hashlib.sha256(json.dumps(dataclasses.asdict(source), sort_keys=True, default=str).encode())
    if source.dataset_name == DEMO_DATASET:
        digest.update(f"demo {__version__}".encode())
    elif source.dataset_name:
        if source.streaming:
            return None
        import datasets

        kwargs = {"split": source.split, **({"data_files": source.data_files} if source.data_files else {})}
        try:
            fingerprint = datasets.load_dataset(source.dataset_name, source.dataset_config, **kwargs)._fingerprint
        except Exception:  # the read proper reports what is wrong with the source
            return None
        digest.update(str(fingerprint).encode())
    elif source.data_files:
        for path in _expand_files(source.data_files, source_where(0)):
            _hash_file(digest, path)
    else:
        for folder, dirs, files in sorted(os.walk(source.data_dir)):
            dirs.sort()
            for name in sorted(files):
                _hash_file(digest, os.path.join(folder, name))
    return digest.hexdigest()


def _build_set(source, set_index: int, folder: Path, map_async) -> None:
    """Read one evaluation set: image signatures (computed by `map_async(fn, jobs)()` in the image workers, one
    batch in flight while the next is read, written batch by batch, so no evaluation image is held) and question
    texts, into `folder`: thumbs.u8, tiny.u8 and
    hashes.npz (the signatures of its readable images, in order) and set.json (every distinct image, the question
    texts with their counts, the row counts). Nothing in it depends on the other sets or on the pool."""
    import numpy as np

    from rsgen.prepare.images import image_payload
    from rsgen.prepare.sources import iter_raw_rows

    folder.mkdir(parents=True, exist_ok=True)
    seen: set = set()
    images: list[list] = []  # [key, where, readable] per distinct image
    paths: list[list] = []  # [path, size, mtime_ns] of images read from a file
    texts: dict[str, list] = {}  # normalised text -> [where, question, rows asking it]
    whole, content, aspect = [], [], []
    counts = {"rows": 0, "rows_weight": 0, "questions": 0, "images_unreadable_rows": 0}
    inflight: list = []  # [(batch, collect)]: at most one batch being hashed while the next is read
    with open(folder / "thumbs.u8", "wb") as thumbs, open(folder / "tiny.u8", "wb") as tinies:
        def flush(batch: list[tuple[list, tuple]]) -> None:
            """Hand `batch` to the workers; write the signatures of the batch handed over before it."""
            if batch:
                inflight.append((batch, map_async(eval_signatures, [job for _, job in batch])))
            if len(inflight) < (2 if batch else 1):
                return
            earlier, collect = inflight.pop(0)
            for (entry, _), sig in zip(earlier, collect()):
                entry[2] = sig is not None
                if sig is not None:
                    whole.append(sig.hash_whole)
                    content.append(sig.hash_content)
                    aspect.append(sig.aspect)
                    thumbs.write(sig.sharp)
                    tinies.write(sig.tiny)

        batch: list[tuple[list, tuple]] = []
        for row in iter_raw_rows(source, set_index):
            counts["rows"] += 1
            for qa in row.qas:
                key = _question_key(qa.question)
                if key is None:
                    continue
                counts["questions"] += 1
                if key in texts:
                    texts[key][2] += 1
                else:
                    texts[key] = [row.where, qa.question, 1]
            counts["rows_weight"] += max(1, len(row.qas))
            kind, payload, _ = image_payload(row.image, row.image_bases)
            if kind not in ("bytes", "path"):
                counts["images_unreadable_rows"] += row.image is not None
                continue
            key = hashlib.sha256(payload).hexdigest() if kind == "bytes" else "path:" + payload
            if key in seen:
                continue
            seen.add(key)
            if kind == "path" and os.path.isfile(payload):
                stat = os.stat(payload)
                paths.append([payload, stat.st_size, stat.st_mtime_ns])
            entry = [key, row.where, False]
            images.append(entry)
            batch.append((entry, (kind, payload)))
            if len(batch) >= EVAL_BATCH:
                flush(batch)
                batch = []
        flush(batch)
        while inflight:
            flush([])
    np.savez(folder / "hashes.npz", hash_whole=np.array(whole, dtype=np.uint64),
             hash_content=np.array(content, dtype=np.uint64), aspect=np.array(aspect, dtype=np.float64))
    (folder / "set.json").write_text(json.dumps({**counts, "images": images, "paths": paths,
                                                 "texts": [[k, *v] for k, v in texts.items()]}))


def _still_valid(folder: Path) -> dict | None:
    """set.json of a cached set, when the folder is whole and every image it read from a file is unchanged."""
    try:
        data = json.loads((folder / "set.json").read_text())
    except (OSError, ValueError):
        return None
    for path, size, mtime_ns in data["paths"]:
        try:
            stat = os.stat(path)
        except OSError:
            return None
        if (stat.st_size, stat.st_mtime_ns) != (size, mtime_ns):
            return None
    return data


def _set_folder(source, set_index: int, work: Path, map_async) -> tuple[Path, dict, bool]:
    """(folder, its set.json, whether it came from the cache) of one evaluation set: the cached one when the set's
    fingerprint has one, else built in `work` and then added to the cache (renamed into place whole: a reader
    never sees half of it, and two runs building the same set at once keep one)."""
    fingerprint = eval_set_fingerprint(source)
    cached = signature_cache_root() / fingerprint if fingerprint else None
    if cached is not None:
        data = _still_valid(cached)
        if data is not None:
            return cached, data, True
    folder = work / f"set{set_index}"
    _build_set(source, set_index, folder, map_async)
    data = json.loads((folder / "set.json").read_text())
    if cached is not None:
        import shutil

        staging = cached.with_name(f".{cached.name}.{os.getpid()}.tmp")
        shutil.rmtree(staging, ignore_errors=True)
        try:
            shutil.copytree(folder, staging)
            if cached.exists():  # stale (an image file changed) or written meanwhile by another run
                shutil.rmtree(cached, ignore_errors=True)
            os.replace(staging, cached)
        except OSError as err:  # a read-only or full cache costs speed, never the run
            import logging

            logging.getLogger(__name__).warning("decontamination: could not cache the signatures of %s in %s (%s)",
                                                eval_set_name(set_index), cached, err)
            shutil.rmtree(staging, ignore_errors=True)
    return folder, data, False


def _question_key(question: Any) -> str | None:
    """A question's normalised text (what QuestionIndex keys on), None when it has none."""
    if not isinstance(question, str) or not question.strip():
        return None
    return " ".join(question_words(question)) or None


def build_decontamination(recipe, directory, map_async) -> Decontamination:
    """The run's evaluation index in `directory`: every evaluation set's folder (`_set_folder`: from the
    signature cache, or read once and cached), combined in recipe order. The same image in several rows or sets is
    indexed once, under the first; question texts are counted over every set, as one set read after another."""
    from rsgen.prepare.sources import describe_source

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    sets = [EvalSetTally(describe_source(s)) for s in recipe.decontaminate]
    folders = [_set_folder(s, i, directory / "sets", map_async) for i, s in enumerate(recipe.decontaminate)]
    images: list[EvalRow] = []
    questions = QuestionIndex()
    rows_per_set: dict[int, int] = {}
    seen: set[str] = set()
    parts: list[tuple[ImageIndex, list[int]]] = []  # per set: its signatures and the positions the index takes
    for set_index, (folder, data, from_cache) in enumerate(folders):
        tally = sets[set_index]
        tally.rows, tally.questions = data["rows"], data["questions"]
        tally.images_unreadable = data["images_unreadable_rows"]
        tally.from_cache = from_cache
        if data["rows"]:
            rows_per_set[set_index] = data["rows_weight"]
        for key, where, question, count in data["texts"]:
            questions.add_counted(set_index, where, question, key, count)
        taken, position = [], 0  # position: among this set's readable images
        for key, where, readable in data["images"]:
            if readable:
                position += 1
            if key in seen:
                continue
            seen.add(key)
            if not readable:
                tally.images_unreadable += 1
                continue
            tally.images += 1
            images.append(EvalRow(set_index, where))
            taken.append(position - 1)
        parts.append((ImageIndex.open(folder), taken))
    if len(folders) == 1:  # one set: its folder is the index as it is (its images are distinct already)
        directory = folders[0][0]
    else:
        ImageIndex.combine(directory, parts)
    templated = questions.templated_sets(rows_per_set)
    indexed = questions.build(templated)
    for i, tally in enumerate(sets):
        tally.templated = i in templated
        tally.questions_indexed = indexed.get(i, 0)
    return Decontamination(directory, images, questions, sets)
