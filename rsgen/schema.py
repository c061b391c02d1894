"""The written schema between stages: features of the prepared pool and of the emitted splits, the fields of the
work records (`rsgen.records`), and how to read the prepared pool. A stage reads another stage's output only through what is
defined here."""

from __future__ import annotations

import bisect
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datasets import Features, Image, List, Value

from rsgen.layout import OutputLayout
from rsgen.records import EXPLORE_RECORD_FIELDS, GENERATE_RECORD_FIELDS, JUDGE_RECORD_FIELDS  # noqa: F401 (part of the schema)
from rsgen.shards import shard_glob

POLICY_VERSION = "rsgen-clean-v1"

# One row per image of the cleaned pool (OUTPUT_DIR/prepared/*.parquet).
PREPARED_QA = {
    "id": Value("string"),  # stable across runs, process counts and machines
    "question": Value("string"),  # byte-identical to the user text the model receives (instruction included)
    "answers": List(Value("string")),  # official answer(s); answers[0] is the canonical `answer`
    "options": List(Value("string")),  # multiple-choice option texts in letter order, else empty
    "source_row_id": Value("string"),
}
CLEAN_META = {
    "source_dataset": Value("string"),
    "source_config": Value("string"),
    "source_split": Value("string"),
    "source_row_ids": List(Value("string")),
    "family": Value("string"),
    "policy_version": Value("string"),
    "steps": List(Value("string")),  # cleaning steps that admitted or changed the row, e.g. "mc_normalise"
}
PREPARED_FEATURES = Features(
    {
        "image": Image(),
        "image_sha256": Value("string"),
        "family": Value("string"),
        "qa": List(PREPARED_QA),
        "clean_meta": CLEAN_META,
    }
)

PREPARED_SHARD_PREFIX = "data"  # OUTPUT_DIR/prepared/data-00000-of-00003.parquet


def prepared_shards(output_dir: str | os.PathLike) -> list[Path]:
    """The prepared pool's shard files, in order."""
    return sorted(OutputLayout(output_dir).prepared.glob(shard_glob(PREPARED_SHARD_PREFIX)))


class PreparedPool:
    """The prepared pool read in place: its parquet shards read a row group at a time and only in the columns
    asked for. Nothing is copied: `datasets.load_dataset("parquet")` would first convert the whole
    pool into the HF datasets cache, a second copy of a pool of hundreds of GB on every node. Rows are in shard
    order (sorted by family, then image sha256); images come as stored, `{"bytes": ..., "path": None}`."""

    def __init__(self, files: list[Path]):
        self.files = list(files)
        self._groups: list[tuple[int, int]] = []  # (file, row group) in row order
        self._starts: list[int] = []  # first row of each
        self.num_rows = 0
        for file_index, path in enumerate(self.files):
            meta = pq.read_metadata(path)
            for group in range(meta.num_row_groups):
                self._groups.append((file_index, group))
                self._starts.append(self.num_rows)
                self.num_rows += meta.row_group(group).num_rows

    def __len__(self) -> int:
        return self.num_rows

    def _open(self, file_index: int) -> pq.ParquetFile:
        # Opened per read, not held: a pool of thousands of shards would otherwise hold thousands of files open.
        # Read, not memory-mapped: every page of a mapped shard that a pass touched stayed in the process's RSS
        # until the shard was closed, so a pass over a 390 MB shard (1M QA pairs) added 390 MB to the stage's peak
        # (emit: 550 -> 890 MB from 100k to 1M pairs, issue #35). Read, a row group's buffers are freed with it.
        return pq.ParquetFile(self.files[file_index], memory_map=False)

    def batches(self, columns: list[str] | None = None, batch_size: int = 1024) -> Iterator[pa.Table]:
        """The whole pool in order, `batch_size` rows at a time (a shard's last batch may be shorter)."""
        # Row group by row group, cut into batches here: pyarrow's `iter_batches` over a whole shard kept what it had
        # read (287 MB allocated by the end of a 399 MB shard of 1M QA pairs), one row group read at a time keeps
        # one row group.
        for file_index in range(len(self.files)):
            with self._open(file_index) as parquet:
                pending: list[pa.Table] = []
                rows = 0
                for group in range(parquet.metadata.num_row_groups):
                    table = parquet.read_row_group(group, columns=columns)
                    pending.append(table)
                    rows += table.num_rows
                    while rows >= batch_size:
                        held = pa.concat_tables(pending)
                        yield held.slice(0, batch_size).combine_chunks()
                        pending, rows = [held.slice(batch_size)], rows - batch_size
                if rows:
                    yield pa.concat_tables(pending).combine_chunks()

    def column(self, name: str) -> list:
        return [value for table in self.batches([name], 65536) for value in table.column(name).to_pylist()]

    def take(self, rows: list[int], columns: list[str] | None = None) -> Iterator[pa.Table]:
        """The rows at the ascending positions `rows`, in that order: one table per row group that holds any,
        reading only those row groups."""
        if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and not 0 <= rows[0] <= rows[-1] < self.num_rows):
            raise ValueError(f"take() needs ascending row positions within 0..{self.num_rows - 1}")
        wanted: dict[int, list[int]] = {}
        for row in rows:
            group = bisect.bisect_right(self._starts, row) - 1
            wanted.setdefault(group, []).append(row - self._starts[group])
        parquet, open_index = None, None
        try:
            for group, local in wanted.items():
                file_index, row_group = self._groups[group]
                if file_index != open_index:
                    if parquet is not None:
                        parquet.close()
                    parquet, open_index = self._open(file_index), file_index
                yield parquet.read_row_group(row_group, columns=columns).take(local)
        finally:
            if parquet is not None:
                parquet.close()


def open_prepared(output_dir: str | os.PathLike) -> PreparedPool:
    """The prepared pool of `output_dir`, read in place (what the stages use)."""
    files = prepared_shards(output_dir)
    if not files:
        prepared = OutputLayout(output_dir).prepared
        raise FileNotFoundError(f"no prepared pool in {str(prepared)!r}: run `rsgen prepare --config RECIPE` first")
    return PreparedPool(files)


def load_prepared(output_dir: str | os.PathLike):
    """The whole prepared pool in memory as a `datasets.Dataset` (images decoded on access), for inspection and
    tests; stages read it in place with `open_prepared`. No copy in the HF datasets cache either."""
    import datasets

    pool = open_prepared(output_dir)
    tables = list(pool.batches(batch_size=max(1, pool.num_rows)))
    table = pa.concat_tables(tables) if tables else PREPARED_FEATURES.arrow_schema.empty_table()
    return datasets.Dataset(table, info=datasets.DatasetInfo(features=PREPARED_FEATURES))


@dataclass(frozen=True)
class PreparedQuestion:
    """One QA pair of the prepared pool, as the stages that ask the model need it (no image: `row` locates it)."""

    id: str
    row: int  # row of the prepared pool (one image)
    family: str
    question: str  # byte-identical to the user text the model receives
    answers: tuple[str, ...]
    options: tuple[str, ...]


def iter_questions(prepared: PreparedPool) -> Iterator[PreparedQuestion]:
    """Every QA pair of the prepared pool, in the pool's stable order (texts only, read in Arrow batches)."""
    import pyarrow.compute as pc

    row = 0
    for table in prepared.batches(["family", "qa"]):
        # Column by column, not `qa.to_pylist()`: a dict per QA pair made this pass ~5x slower, and the stages make
        # it several times per run (keys, reference checks, pending items; bench/bench_server.py's stage part).
        qa = table.column("qa").combine_chunks()
        pairs = qa.flatten()  # the QA pairs of every row in order (the slice's offsets taken into account)
        families = table.column("family").to_pylist()
        for parent, qa_id, question, answers, options in zip(
                pc.list_parent_indices(qa).to_pylist(), pairs.field("id").to_pylist(),
                pairs.field("question").to_pylist(), pairs.field("answers").to_pylist(),
                pairs.field("options").to_pylist()):
            yield PreparedQuestion(qa_id, row + parent, families[parent], question, tuple(answers),
                                   tuple(options or ()))
        row += table.num_rows


def qa_ids(prepared: PreparedPool) -> Iterator[tuple[str, int]]:
    """(QA id, row) of every QA pair of the prepared pool, in `iter_questions`' order: only the ids made Python
    objects (a stage's keys, read at every start: ~3x faster than iter_questions)."""
    import pyarrow.compute as pc

    row = 0
    for table in prepared.batches(["qa"]):
        qa = table.column("qa").combine_chunks()
        parents = pc.list_parent_indices(qa).to_pylist()
        yield from zip(qa.flatten().field("id").to_pylist(), (row + parent for parent in parents))
        row += table.num_rows


def user_turn(question: str) -> list[dict]:
    """The conversation the model is asked: one user turn, the image then the question (byte-identical to the
    emitted `question`). Generation sends it; the TRL views store it as `prompt`."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


# Emitted splits add the model and verifier to clean_meta.
EMITTED_CLEAN_META = {**CLEAN_META, "model": Value("string"), "verifier": Value("string")}
# The final dataset of `rsgen iterate` adds, per row, the round whose model answered each QA pair of `qa` (in
# order): an accepted pair comes from the first round that got it right, a rejected one from the last round.
ITERATE_CLEAN_META = {**EMITTED_CLEAN_META, "qa_rounds": List(Value("int32"))}


def split_features(kind: str, rounds: bool = False, blind: bool = False) -> Features:
    """Features of `{Family}_RS_think`, `{Family}_RS_nothink` and `{Family}_rejected` (kind = think|nothink|rejected);
    `rounds`: with `clean_meta.qa_rounds` (the final dataset of `rsgen iterate`); `blind`: the accepted splits with
    `clean_meta.qa_blind_solvable` (per pair of `qa`, in order: its blind answer verified; `blind_check` on)."""
    qa = {"question": Value("string"), "answer": Value("string")}
    if kind == "think":
        qa["response"] = Value("string")
    elif kind == "rejected":
        qa["wrong_vlm"] = Value("string")
        qa["reason"] = Value("string")
    elif kind != "nothink":
        raise ValueError(f"unknown split kind {kind!r}")
    return Features(
        {
            "image": Image(),
            "image_sha256": Value("string"),
            "qa": List(qa),
            "clean_meta": {**(ITERATE_CLEAN_META if rounds else EMITTED_CLEAN_META),
                           **({"qa_blind_solvable": List(Value("bool"))} if blind and kind != "rejected" else {})},
        }
    )


# The fields of the work records (OUTPUT_DIR/work/<stage>/, rsgen.store.CheckpointStore): defined, typed and
# read in `rsgen.records`.
