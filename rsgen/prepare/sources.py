"""Reading sources: a Hub dataset, local parquet / JSON Lines / JSON / CSV files, an image folder, or the
procedural demo pool; rows in the flat, the_cauldron or LLaVA layout become a stream of `RawRow`s (one image,
one or more raw QA pairs).

Everything streams: rows are read in batches (Hub datasets through `datasets`, memory-mapped or streamed; local
files with pyarrow / json / csv directly), and images stay as bytes or file paths until a worker checks them.
Local files are read directly rather than through `datasets` so that values keep their exact type (the JSON
loader turns the string "4" into the number 4 when a column mixes types) and each row knows which file, hence
which folder, it came from: a local row's `source_row_id` is `file.jsonl:17` -- its file, relative to the folder
of the source's files, and the file's own line where the record starts, counted from 1 as editors, compilers and
linters count (a CSV file's header is line 1; a record spanning lines is named by its first). A parquet file
has no lines: `file.parquet:3` is its row index counted from 0, as `datasets` counts (`ds[3]`), like `train:3`
for a Hub split.

The columns a recipe names are checked against what the source declares -- a parquet schema, a CSV header, a Hub
dataset's features -- or, for JSON where nothing is declared, against the keys of every record in the file.

Longer than most modules (~540 lines): one short reader per source kind and file format plus the three row
layouts, all sharing the column checks and the position naming (`file.jsonl:17`) defined here.
"""

from __future__ import annotations

import csv
import glob
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import DEMO_DATASET, RecipeError, SourceConfig

LLAVA_HUMAN = {"human", "user"}
LLAVA_ASSISTANT = {"gpt", "assistant", "model", "bot"}
IMAGE_PLACEHOLDER = "<image>"


@dataclass
class RawQA:
    question: Any
    answer: Any
    options: Any
    source_row_id: str
    source_label: str | None  # where the QA pair says it comes from (task purity's source allowlist)


@dataclass
class RawRow:
    row_index: int
    source_row_id: str  # the source's own id (source_id_column), else `where`
    family: Any
    image: Any  # bytes, a path, a {"bytes", "path"} dict, a decoded image, a list (cauldron), or None
    image_bases: tuple[str, ...]  # folders a relative image path resolves against
    image_ref: Any = None  # recorded image reference (provenance)
    source_key: str | None = None  # value of source_id_column (provenance: one id names one image)
    qas: list[RawQA] = field(default_factory=list)
    row_reason: str | None = None  # every QA pair of the row is dropped with this reason
    where: str = ""  # position in the source: `file.jsonl:17` for local files, `train:17` for a Hub split
    unreadable: Any = None  # the text of a record that could not be read (row_unparseable)


@dataclass
class _BadRecord:
    reason: str
    text: Any = None  # what could not be read (the report shows it)


def source_where(index: int) -> str:
    return f"sources[{index}]"


def describe_source(source: SourceConfig) -> dict[str, str]:
    """Provenance fields of clean_meta for rows of this source."""
    if source.dataset_name:
        dataset = source.dataset_name
    elif source.data_files:
        dataset = "local:" + ",".join(source.data_files)
    else:
        dataset = "local:" + str(source.data_dir)
    return {"source_dataset": dataset, "source_config": source.dataset_config or "", "source_split": source.split}


def is_image_folder(source: SourceConfig) -> bool:
    return not source.dataset_name and not source.data_files and bool(source.data_dir)


def column_names(source: SourceConfig) -> dict[str, str | None]:
    """The columns a source's format reads, after format defaults."""
    fmt = source.format
    if fmt == "cauldron":
        image = "images" if source.image_column == "image" else source.image_column
        turns = source.conversation_column or "texts"
    elif fmt == "llava":
        image = source.image_column
        turns = source.conversation_column or "conversations"
    else:
        image, turns = source.image_column, None
    if is_image_folder(source) and source.image_column == "image":
        image = "file_name"  # the imagefolder convention: file names relative to the metadata file
    return {
        "image": image,
        "turns": turns,
        "question": source.question_column if fmt == "flat" else None,
        "answer": source.answer_column if fmt == "flat" else None,
        "options": source.options_column if fmt == "flat" else None,
        "source_id": source.source_id_column,
        "image_ref": source.image_ref_column,
        "family": source.family_column,
    }


def _require_columns(available: set[str], source: SourceConfig, where: str, what: str) -> None:
    names = column_names(source)
    missing = [(key, col) for key, col in names.items() if col and col not in available]
    if missing:
        keys = ", ".join(f"{col!r} ({_column_key(key, source)})" for key, col in missing)
        raise RecipeError(
            f"{where}: {what} has no column {keys}. Columns that exist: {', '.join(sorted(available)) or '(none)'}. "
            "Set the matching *_column key of the source to one of these."
        )


def _column_key(key: str, source: SourceConfig) -> str:
    if key == "turns":
        return "conversation_column"
    return f"{key}_column" if key != "source_id" else "source_id_column"


# ------------------------------------------------------------------------------------------------ raw records


Positioned = tuple[int, "dict | _BadRecord"]  # (line of a text file, counted from 1; row index otherwise), record


def _checked_whole(records: Iterator[Positioned], source: SourceConfig, where: str, what: str) -> Iterator[Positioned]:
    """Records of a source that declares no columns (JSON): a column the recipe names must appear in at least one
    record of the file -- checked at its end, so a key first used at row 110 counts as present."""
    seen: set[str] = set()
    for position, record in records:
        if isinstance(record, dict):
            seen.update(record)
        yield position, record
    if seen:
        _require_columns(seen, source, where, what)


def _declared_columns(path: str) -> set[str] | None:
    """Columns a parquet schema or a CSV/TSV header declares; None for JSON (nothing declared)."""
    lower = path.lower()
    if lower.endswith(".parquet"):
        import pyarrow.parquet as pq

        return set(pq.read_schema(path).names)
    if lower.endswith((".csv", ".tsv")):
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
            header = next(csv.reader(f, delimiter="\t" if lower.endswith(".tsv") else ","), [])
        return set(header)
    return None


def _file_records(path: str, source: SourceConfig, where: str, what: str) -> Iterator[Positioned]:
    records = _file_reader(path)(path)
    declared = _declared_columns(path)
    if declared is None:
        return _checked_whole(records, source, where, what)
    _require_columns(declared, source, where, what)
    return records


def _file_labels(paths: list[str], root: str | None = None) -> dict[str, str]:
    """How a row names its file: the path relative to `root`, else to the folder the source's files share."""
    absolute = [os.path.abspath(p) for p in paths]
    if root is None:
        root = os.path.commonpath([os.path.dirname(p) for p in absolute])
    return {p: os.path.relpath(a, root) for p, a in zip(paths, absolute)}


# Text files are read as "utf-8-sig": files saved by spreadsheet programs start with a byte order mark, which would
# otherwise become part of the first column's name (or break the first JSON line).


def _iter_jsonl(path: str) -> Iterator[Positioned]:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                yield number, _BadRecord("row_unparseable", line)
                continue
            yield number, value if isinstance(value, dict) else _BadRecord("row_unparseable", value)


def _iter_json_array(path: str, chunk_chars: int = 1 << 20) -> Iterator[Positioned]:
    """Objects of a top-level JSON array, decoded one at a time (LLaVA ships its pools as one big array), each with
    the line where it starts."""
    decoder = json.JSONDecoder()
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        buffer = f.read(chunk_chars)
        pos = buffer.index("[") + 1
        line, counted = 1, 0  # the line of buffer[counted]
        eof = False
        while True:
            while pos < len(buffer) and buffer[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(buffer) or (not eof and len(buffer) - pos < chunk_chars // 2):
                line += buffer.count("\n", counted, pos)
                more = f.read(chunk_chars)
                eof = not more
                buffer = buffer[pos:] + more
                pos = counted = 0
                if not buffer.strip():
                    return
                continue
            if buffer[pos] == "]":
                return
            line += buffer.count("\n", counted, pos)
            counted = pos
            try:
                value, end = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                if eof:
                    yield line, _BadRecord("row_unparseable", buffer[pos:])  # a broken tail: count it, stop reading
                    return
                more = f.read(chunk_chars)
                eof = not more
                buffer = buffer[pos:] + more
                pos = counted = 0
                continue
            pos = end
            yield line, value if isinstance(value, dict) else _BadRecord("row_unparseable", value)


def _iter_json(path: str) -> Iterator[Positioned]:
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        head = f.read(4096).lstrip()
    if head.startswith("["):
        return _iter_json_array(path)
    return _iter_jsonl(path)


def _iter_csv(path: str) -> Iterator[Positioned]:
    """Rows as dicts by the header (as csv.DictReader makes them), each with the line where it starts."""
    csv.field_size_limit(1 << 30)
    with open(path, newline="", encoding="utf-8-sig", errors="replace") as f:
        delimiter = "\t" if path.lower().endswith(".tsv") else ","
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        while True:
            start = reader.line_num + 1  # lines read so far (a quoted cell may span several)
            cells = next(reader, None)
            if cells is None:
                return
            if not cells:  # a blank line
                continue
            if len(cells) > len(header):  # more cells than the header has names
                yield start, _BadRecord("row_unparseable", dict(zip(header, cells)) | {None: cells[len(header):]})
                continue
            yield start, dict(zip(header, cells + [None] * (len(header) - len(cells))))


def _iter_parquet(path: str, batch_rows: int = 64) -> Iterator[Positioned]:
    import pyarrow.parquet as pq

    # Buffered, single-threaded reads: memory stays near one row group instead of growing with read-ahead.
    index = 0
    with pq.ParquetFile(path, buffer_size=1 << 20, pre_buffer=False) as parquet:
        for batch in parquet.iter_batches(batch_size=batch_rows, use_threads=False):
            for record in batch.to_pylist():
                yield index, record
                index += 1


def _file_reader(path: str):
    lower = path.lower()
    if lower.endswith(".parquet"):
        return _iter_parquet
    if lower.endswith((".jsonl", ".json", ".jsonl.gz")):
        return _iter_json
    if lower.endswith((".csv", ".tsv")):
        return _iter_csv
    return None


def _expand_files(patterns: list[str], where: str) -> list[str]:
    files: list[str] = []
    for pattern in patterns:
        matches = sorted(glob.glob(pattern, recursive=True)) if any(c in pattern for c in "*?[") else [pattern]
        for path in matches:
            if not os.path.isfile(path):
                raise RecipeError(f"{where}: data file {path!r} does not exist")
            if _file_reader(path) is None:
                raise RecipeError(f"{where}: data file {path!r}: use .parquet, .jsonl, .json, .csv or .tsv")
            files.append(path)
    if not files:
        raise RecipeError(f"{where}: data_files {patterns!r} match no file")
    return files


Located = tuple[dict | _BadRecord, tuple[str, ...], str]  # (record, folders its image paths resolve against, where)


def _local_records(source: SourceConfig, where: str) -> Iterator[Located]:
    files = _expand_files(source.data_files, where)
    labels = _file_labels(files)
    for path in files:
        bases = (os.path.abspath(source.data_dir),) if source.data_dir else (os.path.dirname(os.path.abspath(path)),)
        for position, record in _file_records(path, source, where, f"data file {path!r}"):
            yield record, bases, f"{labels[path]}:{position}"


METADATA_NAMES = ("metadata.jsonl", "metadata.json", "metadata.csv", "metadata.parquet")


def _metadata_files(source: SourceConfig, where: str) -> list[str]:
    """The metadata files of an `imagefolder` source (a RecipeError when the folder or its metadata is missing)."""
    root = source.data_dir
    if not os.path.isdir(root):
        raise RecipeError(f"{where}: data_dir {root!r} is not a folder")
    top = os.path.join(root, source.split) if os.path.isdir(os.path.join(root, source.split)) else root
    found = []
    for folder, dirs, files in os.walk(top):
        dirs.sort()
        found += [os.path.join(folder, name) for name in METADATA_NAMES if name in files]
    if not found:
        raise RecipeError(
            f"{where}: image folder {top!r} has no metadata file ({', '.join(METADATA_NAMES)}) giving each "
            "image's question and answer (column `file_name` names the image)"
        )
    return found


def check_source(source: SourceConfig, index: int) -> None:
    """What can be known wrong about a local source without reading a row: its files exist and have a known
    extension, and the columns the recipe names are declared by the files that declare columns (parquet schemas,
    CSV/TSV headers). Raises the RecipeError reading would raise, before anything is written. (JSON declares no
    columns: its keys are checked as it is read. Hub sources are checked when they load.)"""
    where = source_where(index)
    if source.dataset_name:
        return
    if source.data_files:
        paths, what = _expand_files(source.data_files, where), "data file"
    else:
        paths, what = _metadata_files(source, where), "metadata file"
    for path in paths:
        declared = _declared_columns(path)
        if declared is not None:
            _require_columns(declared, source, where, f"{what} {path!r}")


def _image_folder_records(source: SourceConfig, where: str) -> Iterator[Located]:
    """`imagefolder` layout: images next to a metadata file whose `file_name` column names them."""
    root = source.data_dir
    found = _metadata_files(source, where)
    labels = _file_labels(found, os.path.abspath(root))
    for path in found:
        bases = (os.path.dirname(os.path.abspath(path)),)
        for position, record in _file_records(path, source, where, f"metadata file {path!r}"):
            yield record, bases, f"{labels[path]}:{position}"


def _hub_records(source: SourceConfig, where: str) -> Iterator[Located]:
    import datasets

    kwargs: dict[str, Any] = {"split": source.split, "streaming": source.streaming}
    if source.data_files:
        kwargs["data_files"] = source.data_files
    try:
        ds = datasets.load_dataset(source.dataset_name, source.dataset_config, **kwargs)
    except Exception as e:
        raise RecipeError(
            f"{where}: cannot load {source.dataset_name!r} (config {source.dataset_config!r}, split "
            f"{source.split!r}): {type(e).__name__}: {e}"
        ) from e
    features = ds.features
    if features is not None:
        _require_columns(set(features), source, where, f"dataset {source.dataset_name!r}")
        # Keep images as stored bytes: decoding here would re-encode them and lose the original file.
        for name, feature in features.items():
            if isinstance(feature, datasets.Image):
                ds = ds.cast_column(name, datasets.Image(decode=False))
            elif isinstance(feature, (datasets.List, datasets.Sequence, datasets.LargeList)) and isinstance(
                getattr(feature, "feature", None), datasets.Image
            ):
                ds = ds.cast_column(name, datasets.List(datasets.Image(decode=False)))
    bases = (os.path.abspath(source.data_dir),) if source.data_dir else (os.getcwd(),)
    records = enumerate(ds)
    if features is None:  # a streamed dataset that does not declare its features
        records = _checked_whole(records, source, where, f"dataset {source.dataset_name!r}")
    for n, record in records:
        yield record, bases, f"{source.split}:{n}"


def _demo_records(source: SourceConfig, where: str) -> Iterator[Located]:
    from rsgen.demo.pool import make_demo_rows

    rows = enumerate(make_demo_rows(source.demo_num_images, source.demo_seed))
    for n, record in _checked_whole(rows, source, where, "the demo pool"):
        yield record, (), f"{source.split}:{n}"


def iter_records(source: SourceConfig, index: int) -> Iterator[Located]:
    where = source_where(index)
    if source.dataset_name == DEMO_DATASET:
        records = _demo_records(source, where)
    elif source.dataset_name:
        records = _hub_records(source, where)
    elif source.data_files:
        records = _local_records(source, where)
    else:
        records = _image_folder_records(source, where)
    for n, item in enumerate(records):
        if source.max_rows is not None and n >= source.max_rows:
            return
        yield item


# ------------------------------------------------------------------------------------------------ row layouts


def _id_value(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def iter_raw_rows(source: SourceConfig, index: int) -> Iterator[RawRow]:
    """The source as RawRows, in the order it is stored."""
    cols = column_names(source)
    if source.format == "flat":
        parse = _flat_row
    elif source.format == "cauldron":
        parse = _cauldron_row
    else:
        parse = _llava_row
    for row_index, (record, bases, where) in enumerate(iter_records(source, index)):
        if isinstance(record, _BadRecord):
            # One unreadable record counts as one input QA pair, dropped: nothing vanishes uncounted.
            yield RawRow(row_index, where, source.family, None, bases, qas=[RawQA(None, None, None, where, None)],
                         row_reason=record.reason, where=where, unreadable=record.text)
            continue
        source_key = _id_value(record.get(cols["source_id"])) if cols["source_id"] else None
        family = source.family if source.family else record.get(cols["family"])
        row = RawRow(
            row_index,
            source_key or where,
            family,
            record.get(cols["image"]),
            bases,
            image_ref=record.get(cols["image_ref"]) if cols["image_ref"] else None,
            source_key=source_key,
            where=where,
        )
        parse(row, record, cols)
        yield row


def _flat_row(row: RawRow, record: dict, cols: dict) -> None:
    # A list of images with one entry is that row's image (TRL-style copies store `images: [image]`).
    row.image = _single_image(row.image, row)
    options = record.get(cols["options"]) if cols["options"] else None
    row.qas.append(RawQA(record.get(cols["question"]), record.get(cols["answer"]), options, row.source_row_id,
                         row.source_key))


def _single_image(images: Any, row: RawRow) -> Any:
    if images is None or (isinstance(images, (list, tuple)) and len(images) == 0):
        return None
    if isinstance(images, (list, tuple)):
        if len(images) > 1:
            row.row_reason = "multi_image"  # a QA pair about several images has no single image to live on
        return images[0]
    return images


def _conversation(row: RawRow, record: dict, cols: dict) -> list | tuple | None:
    """The row's single image and its conversation turns, shared by the conversation formats; None (with one
    malformed QA recorded, so the drop is counted) where the turns are missing or not a list."""
    row.image = _single_image(row.image, row)
    turns = record.get(cols["turns"])
    if not isinstance(turns, (list, tuple)) or not turns:
        row.qas.append(RawQA(None, None, None, row.source_row_id, row.source_key))
        row.row_reason = row.row_reason or "conversation_malformed"
        return None
    return turns


def _cauldron_row(row: RawRow, record: dict, cols: dict) -> None:
    texts = _conversation(row, record, cols)
    if texts is None:
        return
    for turn_index, turn in enumerate(texts):
        qa_row_id = f"{row.source_row_id}#{turn_index}"
        if not isinstance(turn, dict):
            row.qas.append(RawQA(None, None, None, qa_row_id, row.source_key))
            continue
        label = _id_value(turn.get("source")) or row.source_key
        row.qas.append(RawQA(turn.get("user"), turn.get("assistant"), None, qa_row_id, label))


def _llava_row(row: RawRow, record: dict, cols: dict) -> None:
    turns = _conversation(row, record, cols)
    if turns is None:
        return
    placeholders = sum(
        t.get("value", "").count(IMAGE_PLACEHOLDER)
        for t in turns
        if isinstance(t, dict) and str(t.get("from", "")).lower() in LLAVA_HUMAN and isinstance(t.get("value"), str)
    )
    if placeholders > 1:
        row.row_reason = row.row_reason or "multi_image"
    pending: RawQA | None = None
    for turn in turns:
        if not isinstance(turn, dict):
            continue
        speaker = str(turn.get("from", "")).lower()
        value = turn.get("value")
        if speaker in LLAVA_HUMAN:
            if pending is not None:  # two questions in a row: the first has no answer
                row.qas.append(pending)
            if isinstance(value, str) and placeholders == 1 and IMAGE_PLACEHOLDER in value:
                # The placeholder marks where the image goes; the chat template puts it there itself.
                value = value.replace(IMAGE_PLACEHOLDER + "\n", "").replace("\n" + IMAGE_PLACEHOLDER, "")
                value = value.replace(IMAGE_PLACEHOLDER, "")
            pending = RawQA(value, None, None, f"{row.source_row_id}#{len(row.qas)}", row.source_key)
        elif speaker in LLAVA_ASSISTANT:
            if pending is None:  # an answer without a question
                pending = RawQA(None, value, None, f"{row.source_row_id}#{len(row.qas)}", row.source_key)
            else:
                pending.answer = value
            row.qas.append(pending)
            pending = None
    if pending is not None:
        row.qas.append(pending)
    if not row.qas:
        row.qas.append(RawQA(None, None, None, row.source_row_id, row.source_key))
        row.row_reason = row.row_reason or "conversation_malformed"
