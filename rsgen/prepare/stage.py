"""The prepare stage: sources -> checked QA pairs -> rows grouped by image -> parquet shards + report.

Pass 1 streams every source row: text steps in the main process, image checks in worker processes (in order,
two batches in flight), survivors appended to on-disk buckets. Pass 2 groups each bucket by image, merges
duplicate questions and writes the shards. Memory is bounded by batch and bucket sizes, not by the pool.
The stage writes into `prepared.partial/` and renames it to `prepared/` at the end, so `prepared/` is either
complete or absent; a finished `prepared/` made from the same recipe is reused, not redone.

Longer than most modules (~700 lines): the stage's two passes and the report they fill (`Tally`, `Report`, the
examples shown for each drop) are kept together; pass 1 (`_Pass1`) is the seam a later split would take.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import os
import shutil
import time
from collections import Counter, OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.layout import OutputLayout
from rsgen.prepare import STAGE
from rsgen.prepare.cleaning import (
    FAMILY_NAME,
    STEPS,
    CleanQA,
    SourceRules,
    SpilledQA,
    check_image_ref,
    check_qa,
    merge_duplicates,
    ordered_steps,
    qa_id,
)
from rsgen.prepare.decontaminate import (
    QUESTION_VERSION,
    Decontamination,
    build_decontamination,
    signature_cache_root,
)
from rsgen.prepare.images import ImageJob, ImagePack, ImageResult, image_payload, process_images, resolve_path
from rsgen.prepare.perceptual import SIGNATURE_VERSION
from rsgen.prepare.reasons import DROP_REASONS, MERGE_REASONS
from rsgen.prepare.sources import RawRow, check_source, describe_source, iter_raw_rows, source_where
from rsgen.prepare.writer import ExternalSorter
from rsgen.schema import POLICY_VERSION, PREPARED_FEATURES, PREPARED_SHARD_PREFIX
from rsgen.shards import ParquetShardWriter, swap_dir_into_place

logger = logging.getLogger(__name__)

UNKNOWN_FAMILY = "(unknown)"
BATCH_IMAGES = 64  # images per batch handed to the workers
BATCH_BYTES = 32 << 20  # ... or this many bytes of images, whichever comes first
CACHE_IMAGES = 4096  # recent image results remembered: pools that repeat an image per question decode it once
REPORT_NAME = "prepare_report.json"
EXAMPLES_PER_REASON = 3  # rows the report shows for each drop reason
SHOWN_CHARS = 200  # an example's value is cut to this length


# ------------------------------------------------------------------------------------------------ report


@dataclass
class Tally:
    input_qa_pairs: int = 0
    kept_qa_pairs: int = 0
    dropped_qa_pairs: int = 0
    merged_qa_pairs: int = 0
    dropped: Counter = field(default_factory=Counter)
    merged: Counter = field(default_factory=Counter)
    converted: Counter = field(default_factory=Counter)

    def to_dict(self) -> dict:
        return {
            "input_qa_pairs": self.input_qa_pairs,
            "kept_qa_pairs": self.kept_qa_pairs,
            "dropped_qa_pairs": self.dropped_qa_pairs,
            "merged_qa_pairs": self.merged_qa_pairs,
            "dropped": dict(sorted(self.dropped.items())),
            "merged": dict(sorted(self.merged.items())),
            "converted": dict(sorted(self.converted.items())),
        }


class Report:
    """Counts per reason, per family and per source; every QA pair read ends up kept, dropped or merged."""

    def __init__(self, num_sources: int):
        self.total = Tally()
        self.families: dict[str, Tally] = {}
        self.sources = [Tally() for _ in range(num_sources)]
        self.source_rows = [0] * num_sources
        self.family_rows: Counter = Counter()
        self.images = {"checked": 0, "dropped": Counter(), "converted": Counter()}
        self.examples: dict[str, list[dict]] = {}  # reason -> the first EXAMPLES_PER_REASON rows dropped or merged for it

    def _tallies(self, family: str, source: int) -> tuple[Tally, ...]:
        if family not in self.families:
            self.families[family] = Tally()
        return self.total, self.families[family], self.sources[source]

    def read(self, family: str, source: int, n: int = 1) -> None:
        for t in self._tallies(family, source):
            t.input_qa_pairs += n

    def drop(self, family: str, source: int, reason: str, n: int = 1, *, example: dict) -> None:
        """Count `n` QA pairs dropped for `reason`; `example` (see `example()`) says which row and what failed."""
        if reason not in DROP_REASONS:  # every reason is documented (docs/reasons.md is made from the table)
            raise KeyError(f"drop reason {reason!r} is not in rsgen.prepare.reasons.DROP_REASONS")
        for t in self._tallies(family, source):
            t.dropped_qa_pairs += n
            t.dropped[reason] += n
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(example)

    def merge(self, family: str, source: int, reason: str, n: int = 1, *, example: dict) -> None:
        """Count `n` QA pairs merged into another for `reason`; `example` says which row and into which."""
        if reason not in MERGE_REASONS:
            raise KeyError(f"merge reason {reason!r} is not in rsgen.prepare.reasons.MERGE_REASONS")
        for t in self._tallies(family, source):
            t.merged_qa_pairs += n
            t.merged[reason] += n
        shown = self.examples.setdefault(reason, [])
        if len(shown) < EXAMPLES_PER_REASON:
            shown.append(example)

    def keep(self, family: str, source: int) -> None:
        for t in self._tallies(family, source):
            t.kept_qa_pairs += 1

    def convert(self, family: str, source: int, what: str, n: int = 1) -> None:
        for t in self._tallies(family, source):
            t.converted[what] += n


def example(source: int, source_row_id: str, where: str, value: Any = None) -> dict:
    """A dropped row as the report shows it: its source, its ids, and the value that failed."""
    out = {"source": source_where(source), "source_row_id": source_row_id}
    if where and where != source_row_id:
        out["where"] = where
    if value is not None:
        out["value"] = _shown(value)
    return out


def _shown(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    if isinstance(value, dict):
        return {str(k): _shown(v) for k, v in list(value.items())[:20]}
    if isinstance(value, (list, tuple)):
        return [_shown(v) for v in value[:20]]
    if isinstance(value, (int, float, bool)):
        return value
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "…"


def _failed_value(reason: str, qa) -> Any:
    """The part of a raw QA pair that a text drop reason is about."""
    if reason.startswith("question") or reason == "purity_question_pattern":
        return qa.question
    if reason.startswith("answer"):
        return qa.answer
    if reason in ("purity_source", "purity_no_source"):
        return qa.source_label
    return {k: v for k, v in (("question", qa.question), ("answer", qa.answer), ("options", qa.options)) if v is not None}


def _row_value(reason: str, row: RawRow) -> Any:
    if reason == "row_unparseable":
        return row.unreadable
    if reason in ("family_missing", "family_invalid"):
        return row.family
    return None  # multi_image, conversation_malformed: the row id says where to look


# ------------------------------------------------------------------------------------------------ images


_BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


class ImageWorkers:
    """Image checks on `num_proc` spawned processes (inline when num_proc <= 1). Results keep job order."""

    def __init__(self, num_proc: int):
        self.num_proc = num_proc
        self.pool = None
        if num_proc > 1:
            import multiprocessing

            # spawn: forking a process that holds pyarrow / datasets threads can deadlock the child.
            # One worker per core already: numpy's BLAS threads in each (numpy signs and matches images against an
            # evaluation index) would only contend for the same cores -- 0.1-0.15 s more CPU over bench_prepare's
            # 2,000-image pool. Set in the environment the workers start with, before anything imports numpy.
            saved = {name: os.environ.get(name) for name in _BLAS_THREADS}
            os.environ.update(dict.fromkeys(_BLAS_THREADS, "1"))
            try:
                self.pool = multiprocessing.get_context("spawn").Pool(num_proc)
            finally:
                for name, value in saved.items():
                    if value is None:
                        os.environ.pop(name)
                    else:
                        os.environ[name] = value

    def map_async(self, fn, items: list):
        """fn(chunk) -> list over `items` in chunks on the workers, started now: returns the function that waits
        for the whole list, in order (inline without workers: done now)."""
        if self.pool is None or not items:
            done = fn(items)
            return lambda: done
        size = max(1, -(-len(items) // (self.num_proc * 2)))
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        handle = self.pool.map_async(fn, chunks)
        return lambda: [r for chunk in handle.get() for r in chunk]

    def submit(self, jobs: list[ImageJob]):
        if self.pool is None or not jobs:
            return process_images(jobs)
        size = max(1, -(-len(jobs) // (self.num_proc * 2)))
        chunks = [jobs[i : i + size] for i in range(0, len(jobs), size)]
        return self.pool.map_async(process_images, chunks)

    @staticmethod
    def results(handle) -> list[ImageResult]:
        if isinstance(handle, list):
            return handle
        return [r for chunk in handle.get() for r in chunk]

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.pool is not None and exc[0] is not None:
            self.pool.terminate()
        self.close()


@dataclass
class Pending:
    """A source row whose QA pairs passed the text steps, waiting for its image check."""

    source_index: int
    family: str
    row: RawRow
    qas: list[tuple[int, CleanQA, str]]  # (seq, cleaned pair, source_row_id)
    slot: int | None = None  # index of its job in the batch
    result: ImageResult | None = None
    location: tuple[int, int] | None = None  # (offset, length) of the kept image in the pack
    recorded_path: str | None = None
    image_shown: Any = None  # the image as the report shows it when it is dropped (its path, or its size)


@dataclass
class Batch:
    pendings: list[Pending] = field(default_factory=list)
    jobs: list[ImageJob] = field(default_factory=list)
    job_keys: dict = field(default_factory=dict)
    nbytes: int = 0


# ------------------------------------------------------------------------------------------------ the stage


def recipe_fingerprint(recipe: RecipeConfig, **also: Any) -> str:
    """What the prepared pool depends on: prepare's pinned recipe keys (the `pin` metadata of RecipeConfig, the
    same keys run.json pins), the cleaning policy and the versions of its steps. A finished pool with another
    fingerprint is redone.

    `shard_size_mb` is not among them: it decides where one shard file ends, not a row or the order of the rows
    (readers see one pool, row positions counted across the shards), so a pool written at another shard size is
    the same pool and is reused as it is; emit writes dataset/ at the current size on every run."""
    values = recipe.to_dict()
    pinned = {key: values[key] for key in STAGE.pins}
    pinned.update(policy_version=POLICY_VERSION, steps={k: v[0] for k, v in STEPS.items()}, **also)
    if recipe.decontaminate:  # a new matching method re-runs decontamination (absent otherwise: pools stay reused)
        pinned.update(decontaminate_versions=[SIGNATURE_VERSION, QUESTION_VERSION])
    return hashlib.sha256(json.dumps(pinned, sort_keys=True, default=str).encode()).hexdigest()


def _finished_report(layout: OutputLayout, recipe: RecipeConfig, fingerprint: str) -> dict | None:
    if not layout.prepare_report.exists():
        return None
    try:
        report = json.loads(layout.prepare_report.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    # Pools written before shard_size_mb stopped counting have it in their fingerprint: the same pool.
    if report.get("recipe_fingerprint") not in (fingerprint, recipe_fingerprint(recipe,
                                                                                shard_size_mb=recipe.shard_size_mb)):
        return None
    if not all((layout.prepared / name).exists() for name in report.get("shards", [])):
        return None
    return report


def check_sources(recipe: RecipeConfig) -> list[SourceRules]:
    """Every recipe error prepare can find before reading a row (no sources, a bad template or pattern, a data
    file that is missing or lacks a named column...), raised before anything is written; the sources' rules."""
    if not recipe.sources:
        raise RecipeError("the recipe has no `sources`: add at least one pool to prepare")
    rules = [SourceRules.from_source(s, recipe.instruction, source_where(i)) for i, s in enumerate(recipe.sources)]
    for i, source in enumerate(recipe.sources):
        check_source(source, i)
    return rules


def prepare_finished(recipe: RecipeConfig) -> bool:
    """Whether OUTPUT_DIR/prepared/ is a finished pool of this recipe (prepare then reuses it)."""
    return _finished_report(OutputLayout(recipe.output_dir), recipe, recipe_fingerprint(recipe)) is not None


def check_prepare(recipe: RecipeConfig) -> None:
    """Raise the recipe errors prepare can find before reading a row, unless prepared/ is finished for this recipe
    (then prepare reuses it and reads nothing). Writes nothing: a bad recipe leaves the output_dir as it was."""
    if not prepare_finished(recipe):
        check_sources(recipe)


def run_prepare(recipe: RecipeConfig, state=None, force: bool = False) -> dict:
    """Write OUTPUT_DIR/prepared/ (parquet shards + prepare_report.json) and return the report; `state` (the
    Stage signature's) is unused: the main process prepares. A finished prepared/ made from the same recipe is
    reused (pass force=True to redo it)."""
    layout = OutputLayout(recipe.output_dir)
    fingerprint = recipe_fingerprint(recipe)
    if not force and recipe.sources:
        finished = _finished_report(layout, recipe, fingerprint)
        if finished is not None:
            logger.info("prepare: %s is finished for this recipe; reusing it", layout.prepared)
            return finished
    rules = check_sources(recipe)
    start = time.perf_counter()
    partial = layout.prepared_partial
    shutil.rmtree(partial, ignore_errors=True)
    work = partial / "_work"
    work.mkdir(parents=True)
    report = Report(len(recipe.sources))
    try:
        qa_sorter = ExternalSorter(work / "qa")
        id_sorter = ExternalSorter(work / "source_ids")
        with ImagePack(work / "images.bin") as pack:
            with ImageWorkers(recipe.prepare_num_proc) as workers:
                decon = None
                if recipe.decontaminate:
                    # Built once per run, before the pool, by the same workers; kept as hashes, not images.
                    decon = build_decontamination(recipe, work / "eval_index", workers.map_async)
                    logger.info("prepare: decontamination index: %d evaluation images, %d identifying questions "
                                "(signatures of %d of %d evaluation sets from the cache in %s)",
                                len(decon.images), len(decon.questions.questions),
                                sum(s.from_cache for s in decon.sets), len(decon.sets), signature_cache_root())
                _Pass1(recipe, rules, report, pack, qa_sorter, id_sorter, decon).run(workers)
            conflicts = _source_id_conflicts(id_sorter)
            # Small row groups: generate reads the pool a batch of images at a time.
            writer = ParquetShardWriter(partial, PREPARED_FEATURES, PREPARED_SHARD_PREFIX,
                                        max_shard_bytes=recipe.shard_size_mb * 1_000_000,
                                        row_group_bytes=64 << 20, row_group_rows=64)
            _write_rows(recipe, report, qa_sorter, conflicts, pack, writer)
            shards = [path.name for path in writer.close()]
    except RecipeError:
        # A recipe error found while reading (a JSON file without a named key): nothing half-made stays behind,
        # so the corrected recipe runs here as on an empty output_dir.
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(work)
    elapsed = time.perf_counter() - start
    # No timings in the report: the same recipe gives the same prepared/ folder, byte for byte.
    out = _report_dict(recipe, report, shards, writer.rows, fingerprint)
    if decon is not None:
        out["decontamination"] = decon.report()
    (partial / REPORT_NAME).write_text(json.dumps(out, indent=2, sort_keys=False) + "\n")
    if out["kept_qa_pairs"] == 0:
        # Nothing to generate from: stop here with what went wrong, not at the next stage with "no work".
        # The report stays in prepared.partial/ (never swapped in, so it is not mistaken for a finished pool).
        raise RecipeError(empty_pool_message(out, partial / REPORT_NAME))
    swap_dir_into_place(partial, layout.prepared)
    logger.info(
        f"prepare: {writer.rows} images, {out['kept_qa_pairs']} of {out['input_qa_pairs']} QA pairs kept "
        f"({out['dropped_qa_pairs']} dropped, {out['merged_qa_pairs']} merged) in {elapsed:.1f} s -> {layout.prepared}"
    )
    if out["dropped"]:
        logger.info("prepare: most dropped: " + ", ".join(f"{r} {n}" for r, n in _top_reasons(out, 5))
                    + f" (examples in {layout.prepare_report})")
    return out


def _top_reasons(report: dict, n: int) -> list[tuple[str, int]]:
    return sorted(report["dropped"].items(), key=lambda item: (-item[1], item[0]))[:n]


def empty_pool_message(report: dict, report_path) -> str:
    """One line (the CLI prints errors on one line): the top reasons, each with a hint and example rows."""
    parts = []
    for reason, count in _top_reasons(report, 5):
        shown = []
        for ex in report["examples"].get(reason, []):
            where = f" at {ex['where']}" if "where" in ex else ""
            value = f" = {json.dumps(ex['value'], ensure_ascii=False)}" if "value" in ex else ""
            shown.append(f"{ex['source']} row {ex['source_row_id']}{where}{value}")
        fix = DROP_REASONS[reason].fix
        hint = f" ({fix})" if fix else ""
        parts.append(f"{reason}: {count}{hint}, e.g. " + ", ".join(shown))
    return (f"prepare: none of the {report['input_qa_pairs']} QA pairs survived cleaning, so there is nothing to "
            f"generate from. Top drop reasons: {'; '.join(parts)}. Every reason and its examples: {report_path}")


class _Pass1:
    """Stream the sources, check text and images, hand survivors to the external sort."""

    def __init__(self, recipe, rules, report, pack: ImagePack, qa_sorter: ExternalSorter, id_sorter: ExternalSorter,
                 decon: Decontamination | None = None):
        self.recipe = recipe
        self.decon = decon
        self.rules = rules
        self.report = report
        self.pack = pack
        self.qa_sorter = qa_sorter
        self.id_sorter = id_sorter
        # Recent images: key -> (result, location in the pack). Pools that repeat an image on every question's
        # row (flat pools) check and store it once.
        self.cache: OrderedDict[tuple, tuple[ImageResult, tuple[int, int] | None]] = OrderedDict()
        self.seq = 0

    def run(self, workers: ImageWorkers) -> None:
        inflight = None
        for batch in self._batches():
            handle = workers.submit(batch.jobs)
            if inflight is not None:
                self._finish(*inflight)
            inflight = (batch, handle)
        if inflight is not None:
            self._finish(*inflight)

    def _family(self, source_index: int, raw_family: Any) -> tuple[str, str | None]:
        if raw_family is None or (isinstance(raw_family, str) and not raw_family.strip()):
            return UNKNOWN_FAMILY, "family_missing"
        family = str(raw_family).strip()
        if not FAMILY_NAME.match(family):
            return UNKNOWN_FAMILY, "family_invalid"
        return family, None

    def _pendings(self) -> Iterator[Pending]:
        from tqdm.auto import tqdm

        report = self.report
        progress = tqdm(desc="prepare", unit=" rows", disable=None, mininterval=2.0)  # disable=None: TTY only
        for source_index, source in enumerate(self.recipe.sources):
            rules = self.rules[source_index]
            for row in iter_raw_rows(source, source_index):
                progress.update()
                report.source_rows[source_index] += 1
                family, family_reason = self._family(source_index, row.family)
                seqs = list(range(self.seq, self.seq + len(row.qas)))
                self.seq += len(row.qas)
                report.read(family, source_index, len(row.qas))
                reason = row.row_reason or family_reason
                if reason:
                    report.drop(family, source_index, reason, len(row.qas),
                                example=example(source_index, row.source_row_id, row.where, _row_value(reason, row)))
                    continue
                survivors = []
                for seq, raw in zip(seqs, row.qas):
                    checked = check_qa(rules, raw.question, raw.answer, raw.options, raw.source_label)
                    matched = self.decon.question_match(raw.question) if isinstance(checked, CleanQA) and \
                        self.decon is not None else None
                    if matched is not None:
                        self.decon.removed(matched, "contaminated_question", 1)
                        report.drop(family, source_index, "contaminated_question", example={
                            **example(source_index, raw.source_row_id, row.where, raw.question),
                            **self.decon.matched(matched)})
                    elif isinstance(checked, CleanQA):
                        survivors.append((seq, checked, raw.source_row_id))
                    else:
                        report.drop(family, source_index, checked.reason, example=example(
                            source_index, raw.source_row_id, row.where, _failed_value(checked.reason, raw)))
                if survivors:
                    yield Pending(source_index, family, row, survivors)
        progress.close()

    def _batches(self) -> Iterator[Batch]:
        batch = Batch()
        for pending in self._pendings():
            self._attach_job(batch, pending)
            batch.pendings.append(pending)
            if len(batch.jobs) >= BATCH_IMAGES or batch.nbytes >= BATCH_BYTES:
                yield batch
                batch = Batch()
        if batch.pendings:
            yield batch

    def _attach_job(self, batch: Batch, pending: Pending) -> None:
        kind, payload, recorded = image_payload(pending.row.image, pending.row.image_bases)
        pending.recorded_path = recorded
        pending.image_shown = recorded or (f"<{len(payload)} bytes>" if kind == "bytes" else pending.row.image)
        if kind not in ("bytes", "path"):
            pending.result = ImageResult(kind)
            return
        raw_sha = hashlib.sha256(payload).hexdigest() if kind == "bytes" else None
        key = ("bytes", raw_sha) if kind == "bytes" else ("path", payload)
        cached = self.cache.get(key)
        if cached is not None:
            self.cache.move_to_end(key)
            pending.result, pending.location = cached
            return
        if key in batch.job_keys:  # the same image earlier in this batch: one check serves both
            pending.slot = batch.job_keys[key]
            return
        recipe = self.recipe
        job = ImageJob(kind, payload, raw_sha, recipe.max_image_pixels, recipe.max_aspect_ratio,
                       self.decon.image_index_dir if self.decon is not None else None)
        pending.slot = batch.job_keys[key] = len(batch.jobs)
        batch.jobs.append(job)
        batch.nbytes += len(payload) if kind == "bytes" else 0

    def _finish(self, batch: Batch, handle) -> None:
        results = ImageWorkers.results(handle)
        kept: list[tuple[ImageResult, tuple[int, int] | None]] = []
        for job, result in zip(batch.jobs, results):
            location = None
            if result.reason is None:
                location = self.pack.append(result.data if result.data is not None else job.payload)
                result = dataclasses.replace(result, data=None)
            kept.append((result, location))
        for key, slot in batch.job_keys.items():
            self.cache[key] = kept[slot]
            if len(self.cache) > CACHE_IMAGES:
                self.cache.popitem(last=False)
        for pending in batch.pendings:
            if pending.result is None:
                pending.result, pending.location = kept[pending.slot]
            self._spill(pending)

    def _spill(self, pending: Pending) -> None:
        report, result, family, src = self.report, pending.result, pending.family, pending.source_index
        source = self.recipe.sources[src]
        report.images["checked"] += 1
        if result.reason:
            report.images["dropped"][result.reason] += 1
            report.drop(family, src, result.reason, len(pending.qas),
                        example=self._example(pending, pending.image_shown))
            return
        if result.eval_match is not None:
            matched = self.decon.images[result.eval_match]
            self.decon.removed(matched, "contaminated_image", len(pending.qas), pool_image=result.sha256)
            report.drop(family, src, "contaminated_image", len(pending.qas),
                        example={**self._example(pending, pending.image_shown), **self.decon.matched(matched)})
            return
        image_steps = {"image_validate"}
        for conversion in result.conversions:
            report.images["converted"][conversion] += 1
            report.convert(family, src, conversion)
            image_steps.add("image_upright" if conversion.startswith("image_exif") else "image_to_rgb")
        if source.image_ref_column:
            reason = check_image_ref(
                pending.row.image_ref,
                pending.recorded_path,
                result.raw_sha256,
                result.sha256,
                lambda ref: _existing(ref, pending.row.image_bases),
            )
            if reason:
                report.drop(family, src, reason, len(pending.qas),
                            example=self._example(pending, pending.row.image_ref))
                return
            image_steps.add("provenance")
        sha = result.sha256
        offset, length = pending.location
        for seq, qa, source_row_id in pending.qas:
            for what in qa.converted:
                report.convert(family, src, what)
            steps = sorted(qa.steps | image_steps | ({"provenance"} if source.source_id_column else set()))
            record = {
                "seq": seq, "off": offset, "len": length, "src": src, "rid": source_row_id, "w": pending.row.where,
                "q": qa.question, "a": qa.answers, "o": qa.options, "steps": steps,
            }
            self.qa_sorter.add(f"{family}/{sha}", record)
        if source.source_id_column and pending.row.source_key is not None:
            # Keyed by a hash: source ids are arbitrary text, sort keys must not contain the separator.
            key = hashlib.sha256(f"{src}\n{pending.row.source_key}".encode()).hexdigest()
            self.id_sorter.add(key, {"sha": sha, "seqs": [s for s, _, _ in pending.qas]})


    @staticmethod
    def _example(pending: Pending, value: Any) -> dict:
        return example(pending.source_index, pending.row.source_row_id, pending.row.where, value)


def _existing(ref: str, bases: tuple[str, ...]) -> str | None:
    path = resolve_path(ref, bases)
    return path if os.path.isfile(path) else None


def _source_id_conflicts(id_sorter: ExternalSorter) -> set[int]:
    """Seqs of QA pairs whose source id is also recorded on a different image: the id does not resolve to one
    image, so none of its QA pairs can be trusted to belong to theirs."""
    bad: set[int] = set()
    for _, group in itertools.groupby(id_sorter, key=lambda item: item[0]):
        records = [record for _, record in group]
        if len({r["sha"] for r in records}) > 1:
            bad.update(seq for r in records for seq in r["seqs"])
    return bad


def _write_rows(recipe, report: Report, qa_sorter: ExternalSorter, conflicts: set[int], pack: ImagePack, writer) -> None:
    """Pass 2: QA pairs arrive grouped by (family, image); merge duplicates and write one row per image."""
    descriptors = [describe_source(s) for s in recipe.sources]
    for key, group in itertools.groupby(qa_sorter, key=lambda item: item[0]):
        family, sha = key.split("/", 1)
        qas = []
        location = None
        wheres = {}
        for _, r in group:
            location = location or (r["off"], r["len"])
            qa = SpilledQA(r["seq"], r["src"], r["rid"], r["q"], r["a"], r["o"], r["steps"])
            wheres[qa.seq] = r["w"]
            if qa.seq in conflicts:
                report.drop(family, qa.source_index, "provenance_source_id_conflict",
                            example=example(qa.source_index, qa.source_row_id, r["w"], qa.source_row_id))
            else:
                qas.append(qa)
        kept, dropped, merged = merge_duplicates(qas)
        for qa, reason in dropped:
            report.drop(family, qa.source_index, reason, example=example(
                qa.source_index, qa.source_row_id, wheres[qa.seq], {"question": qa.question, "answers": qa.answers}))
        for qa in merged:
            into = next(k for k in kept if k.question == qa.question)
            report.merge(family, qa.source_index, "duplicate_question", example=example(
                qa.source_index, qa.source_row_id, wheres[qa.seq],
                {"question": qa.question, "answers": qa.answers, "merged_into": wheres[into.seq]}))
        if not kept:
            continue
        for qa in kept:
            report.keep(family, qa.source_index)
        image = pack.read(*location)
        report.family_rows[family] += 1
        writer.add(_row(family, sha, image, kept, descriptors), len(image) + sum(len(q.question) + 64 for q in kept))


def _distinct(values) -> list:
    out = []
    for v in values:
        if v not in out:
            out.append(v)
    return out


def _row(family: str, sha: str, image: bytes, qas: list[SpilledQA], descriptors: list[dict]) -> dict:
    sources = _distinct(q.source_index for q in qas)
    meta = {
        # A row drawing on several sources of one family names them all, in order of first use.
        name: " + ".join(_distinct(descriptors[s][name] for s in sources))
        for name in ("source_dataset", "source_config", "source_split")
    }
    steps = sorted({s for q in qas for s in q.steps})
    return {
        "image": {"bytes": image, "path": None},
        "image_sha256": sha,
        "family": family,
        "qa": [
            {
                "id": qa_id(family, sha, q.question),
                "question": q.question,
                "answers": q.answers,
                "options": q.options,
                "source_row_id": q.source_row_id,
            }
            for q in qas
        ],
        "clean_meta": {
            **meta,
            "source_row_ids": _distinct(q.source_row_id for q in qas),
            "family": family,
            "policy_version": POLICY_VERSION,
            "steps": ordered_steps(steps),
        },
    }


def _report_dict(recipe, report: Report, shards: list[str], rows: int, fingerprint: str) -> dict:
    total = report.total
    families = {}
    for name, tally in sorted(report.families.items()):
        families[name] = {"rows": report.family_rows.get(name, 0), **tally.to_dict()}
    sources = []
    for i, (source, tally) in enumerate(zip(recipe.sources, report.sources)):
        sources.append(
            {
                **describe_source(source),
                "format": source.format,
                "family": source.family or f"column:{source.family_column}",
                "source_rows": report.source_rows[i],
                **tally.to_dict(),
            }
        )
    balanced = total.kept_qa_pairs + total.dropped_qa_pairs + total.merged_qa_pairs == total.input_qa_pairs
    if not balanced:  # a bug, not bad input: refuse to hand on a pool whose accounting is off
        raise AssertionError(f"prepare report does not balance: {total.to_dict()}")
    return {
        "policy_version": POLICY_VERSION,
        "steps": {name: {"version": v, "does": what} for name, (v, what) in STEPS.items()},
        "recipe_fingerprint": fingerprint,
        "rows": rows,
        "shards": shards,
        **{k: v for k, v in total.to_dict().items()},
        "examples": {reason: report.examples[reason] for reason in sorted(report.examples)},
        "images": {
            "checked": report.images["checked"],
            "dropped": dict(sorted(report.images["dropped"].items())),
            "converted": dict(sorted(report.images["converted"].items())),
        },
        "families": families,
        "sources": sources,
    }

