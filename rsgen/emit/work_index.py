"""The work emit routes, indexed on disk: the verify, generate, judge, explore and blind stores of an output
directory read once each into an SQLite file (OUTPUT_DIR/work/emit-index.sqlite), then handed to routing one batch
of prepared rows at a time (`IndexedWork.batch`).

Why: held as dicts (`WorkRecords.load`, what `rsgen iterate` still uses) the work took about 2 KB per QA pair, and
emit's peak memory grew with the pool (690 MB at 100k pairs, 2.4 GB at 1M: issue #35). From the index, emit holds
the records of one batch of prepared rows, whatever the size of the pool.

What routing sees is what `WorkRecords.load` gives it: the first record of a key in part order (a key written twice
keeps its first, as `CheckpointStore.iter_records`), each kept record checked as `read_records` checks it (an error
names its part and line), the generate records with the verify stage's decisions (`rsgen.decisions`; one without a
decision is an error), a QA id's samples and explore samples by sample. The file is scratch: every emit builds it
again and removes it when it ends (a killed emit leaves it behind; the next emit replaces it).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from rsgen.config import RecipeConfig
from rsgen.decisions import decisions_folder, undecided_error
from rsgen.emit.splits import WorkRecords
from rsgen.layout import OutputLayout
from rsgen.records import (
    CALIBRATION,
    KNOWN_RIGHT,
    KNOWN_WRONG,
    BlindRecord,
    ExploreRecord,
    GenerateRecord,
    JudgeRecord,
    VerifyRecord,
)
from rsgen.routing import needs_judging
from rsgen.store import CheckpointStore

QUERY_IDS = 500  # QA ids per `IN (...)` query: under SQLite's smallest limit on host parameters (999)
CACHE_KIB = 32 * 1024  # SQLite's page cache, bounded whatever the pool
_DECISION_FIELDS = ("extracted", "match", "reason", "verifier")  # what GenerateRecord.decided takes from verify
_CALIBRATION_KINDS = (CALIBRATION, KNOWN_WRONG, KNOWN_RIGHT)  # judge records held in memory: a few per family

_TABLES = {
    "verify": "key TEXT PRIMARY KEY, line TEXT NOT NULL",
    "generate": "key TEXT PRIMARY KEY, id TEXT, line TEXT NOT NULL",
    "judge": "key TEXT PRIMARY KEY, id TEXT, kind TEXT, line TEXT NOT NULL",
    "explore": "key TEXT PRIMARY KEY, id TEXT, line TEXT NOT NULL",
    "blind": "key TEXT PRIMARY KEY, line TEXT NOT NULL",
    "prepared": "id TEXT PRIMARY KEY",  # QA ids of the prepared pool (note_prepared)
}
_BY_ID = ("generate", "judge", "explore")

R = TypeVar("R")


def _first_of_each_key(db: sqlite3.Connection, table: str, store: CheckpointStore, record_type: type[R],
                       fields: tuple[str, ...] = ("key", "id")) -> Iterator[R]:
    """Insert every record of `store` into `table` (its `fields`, then its line) unless its key is there already;
    yield each one inserted, checked as `read_records` checks it."""
    sql = f"INSERT OR IGNORE INTO {table} VALUES ({', '.join('?' * (len(fields) + 1))})"
    for part, lines in store.part_lines():
        for number, line in enumerate(lines, 1):
            data = json.loads(line)
            if db.execute(sql, (*(data.get(name) for name in fields), line)).rowcount:
                yield record_type.from_json(data, f"{part} line {number}")


def _chunks(ids: list[str]) -> Iterator[tuple[list[str], str]]:
    for start in range(0, len(ids), QUERY_IDS):
        chunk = ids[start:start + QUERY_IDS]
        yield chunk, ", ".join("?" * len(chunk))


class IndexedWork(WorkRecords):
    """WorkRecords whose large parts (generate, judge verdicts on rejections, explore, blind) stay in the index:
    `batch` reads those of a batch of QA ids. The judge's calibration records are held (a few per family)."""

    def __init__(self, db: sqlite3.Connection, path: Path, **kwargs: Any):
        super().__init__(samples={}, judge={}, calibration={}, **kwargs)
        self.db = db
        self.path = path

    @classmethod
    def build(cls, recipe: RecipeConfig) -> IndexedWork:
        layout = OutputLayout(recipe.output_dir)
        verify_folder = decisions_folder(recipe)
        path = layout.emit_index
        path.unlink(missing_ok=True)  # a killed emit's
        db = sqlite3.connect(path)
        # Scratch: nothing to recover after a crash, so no journal and no fsync.
        for pragma in ("journal_mode = OFF", "synchronous = OFF", f"cache_size = -{CACHE_KIB}",
                       "locking_mode = EXCLUSIVE", "temp_store = FILE"):
            db.execute(f"PRAGMA {pragma}")
        for table, columns in _TABLES.items():
            db.execute(f"CREATE TABLE {table} ({columns})")
        work = cls(db, path, judge_enabled=recipe.judge, num_samples=recipe.num_samples,
                   judge_scope=recipe.judge_scope, numeric_tolerance=recipe.numeric_tolerance,
                   min_specificity=recipe.judge_min_specificity,
                   explore={} if recipe.explore_samples else None,
                   blind={} if recipe.blind_check != "off" else None, blind_drop=recipe.blind_check == "drop")
        try:
            work._fill(layout, verify_folder)
        except BaseException:
            work.close()
            raise
        return work

    def _fill(self, layout: OutputLayout, verify_folder: Path) -> None:
        db = self.db
        for _ in _first_of_each_key(db, "verify", CheckpointStore(verify_folder), VerifyRecord, ("key",)):
            pass
        for _ in _first_of_each_key(db, "generate", CheckpointStore(layout.generate_work), GenerateRecord):
            pass
        undecided = db.execute("SELECT key FROM generate g WHERE NOT EXISTS (SELECT 1 FROM verify v WHERE v.key = "
                               "g.key) ORDER BY rowid LIMIT 1").fetchone()
        if undecided:
            raise undecided_error(undecided[0], verify_folder)
        if self.judge_enabled:
            for rec in _first_of_each_key(db, "judge", CheckpointStore(layout.judge_work), JudgeRecord,
                                          ("key", "id", "kind")):
                if rec.kind == CALIBRATION:
                    self.calibration[rec.response_key] = rec
                elif rec.kind == KNOWN_WRONG:
                    self.known_wrong[rec.id] = rec
                elif rec.kind == KNOWN_RIGHT:
                    self.known_right[rec.id] = rec
        if self.explore is not None:
            for _ in _first_of_each_key(db, "explore", CheckpointStore(layout.explore_work), ExploreRecord):
                pass
        if self.blind is not None:
            for _ in _first_of_each_key(db, "blind", CheckpointStore(layout.blind_work), BlindRecord, ("key",)):
                pass
        for table in _BY_ID:
            db.execute(f"CREATE INDEX {table}_id ON {table} (id)")
        db.commit()

    def close(self) -> None:
        self.db.close()
        self.path.unlink(missing_ok=True)

    def __enter__(self) -> IndexedWork:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _decided(self, where: str = "", args: Iterable[str] = ()) -> Iterator[GenerateRecord]:
        """Generate records with their decisions (of the QA ids in `args` when `where` says so), in part order."""
        for line, decision in self.db.execute(
                f"SELECT g.line, v.line FROM generate g JOIN verify v ON v.key = g.key {where} ORDER BY g.rowid",
                list(args)):
            data = json.loads(line)
            decided = json.loads(decision)
            # GenerateRecord.decided, without building the VerifyRecord (both were checked when indexed)
            data.update((name, decided[name]) for name in _DECISION_FIELDS)
            yield GenerateRecord(**data)

    def batch(self, qa_ids: list[str]) -> WorkRecords:
        samples: dict[str, list[GenerateRecord]] = {}
        judge: dict[str, JudgeRecord] = {}
        explore: dict[str, list[ExploreRecord]] | None = None if self.explore is None else {}
        blind: dict[str, BlindRecord] | None = None if self.blind is None else {}
        db = self.db
        for chunk, marks in _chunks(qa_ids):
            for rec in self._decided(f"WHERE g.id IN ({marks})", chunk):
                samples.setdefault(rec.id, []).append(rec)
            for (line,) in db.execute(f"SELECT line FROM judge WHERE id IN ({marks}) AND kind NOT IN (?, ?, ?)",
                                      [*chunk, *_CALIBRATION_KINDS]):
                rec = JudgeRecord(**json.loads(line))
                judge[rec.key] = rec
            if explore is not None:
                for (line,) in db.execute(f"SELECT line FROM explore WHERE id IN ({marks}) ORDER BY rowid", chunk):
                    rec = ExploreRecord(**json.loads(line))
                    explore.setdefault(rec.id, []).append(rec)
            if blind is not None:
                for (line,) in db.execute(f"SELECT line FROM blind WHERE key IN ({marks})", chunk):
                    rec = BlindRecord(**json.loads(line))
                    blind[rec.key] = rec
        for recs in samples.values():
            recs.sort(key=lambda r: (r.sample or 0))
        for recs in (explore or {}).values():
            recs.sort(key=lambda r: r.sample)
        view = WorkRecords(samples, judge, self.calibration, self.judge_enabled, self.num_samples, self.known_wrong,
                           self.judge_scope, self.numeric_tolerance, self.min_specificity, explore, blind,
                           self.blind_drop, self.known_right)
        view.__dict__["_trusted"] = self.__dict__.setdefault("_trusted", {})  # the leniency gate, decided once
        return view

    def note_prepared(self, qa_ids: Iterable[str]) -> None:
        self.db.executemany("INSERT OR IGNORE INTO prepared VALUES (?)", ((qa_id,) for qa_id in qa_ids))

    def outside_pool(self) -> int:
        return self.db.execute("SELECT COUNT(DISTINCT id) FROM generate WHERE id NOT IN (SELECT id FROM prepared)"
                               ).fetchone()[0]

    def judge_needed(self) -> bool:
        return any(needs_judging(rec) for rec in self._decided())

    def has_judge_records(self) -> bool:
        return bool(self.calibration or self.known_wrong or self.db.execute(
            "SELECT 1 FROM judge WHERE kind NOT IN (?, ?, ?) LIMIT 1", _CALIBRATION_KINDS).fetchone())
