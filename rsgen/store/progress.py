"""OUTPUT_DIR/progress.json: where a run stands, readable from any machine that sees the output directory
(`rsgen status`), and the Hub card's progress section while a `push_to_hub` run lasts.

Two hooks, one per place every stage passes through:
- `stage_progress` wraps each stage's work in `rsgen.pipeline` (every rank): the stage is marked running, then done;
  on the main process a heartbeat thread rewrites progress.json every `WRITE_EVERY_SECONDS` while the stage runs,
  also while this rank waits at a barrier for the others, so a stale `written_at` means the run is gone.
- `keyed_work_progress` is called by the keyed-work loop that every model stage runs (`rsgen.store.keyed_work`):
  each rank counts its records, tokens and retries and rewrites its own small file under work/progress/ every few
  seconds (ranks on other nodes share only the output directory); the main process's heartbeat sums those files.

Every write is atomic (a temporary name, then a rename), so a reader never sees half a file.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from rsgen.layout import OutputLayout

logger = logging.getLogger(__name__)

PROGRESS_VERSION = 1
WRITE_EVERY_SECONDS = 5.0  # progress.json and each rank's file
# `rsgen status` calls a run stopped when progress.json is older than this (a live run rewrites it every 5 s).
STALE_AFTER_SECONDS = 60.0
RUNNING, DONE, FINISHED, STOPPED = "running", "done", "finished", "stopped"
CARD_SECTION_START, CARD_SECTION_END = "<!-- rsgen progress -->", "<!-- /rsgen progress -->"


def _iso(unix: float) -> str:
    return _dt.datetime.fromtimestamp(unix, _dt.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")  # key order kept: stages in the order they run
    os.replace(tmp, path)


def progress_json(output_dir: str | os.PathLike) -> Path:
    return OutputLayout(output_dir).root / "progress.json"


def read_progress(output_dir: str | os.PathLike) -> dict[str, Any] | None:
    path = progress_json(output_dir)
    return json.loads(path.read_text()) if path.is_file() else None


# ------------------------------------------------------------------------------------------------ ranks


class _Active:
    """The stage running in this process (set by `stage_progress`), so the keyed-work loop knows where to report."""

    stage: str | None = None
    output_dir: Path | None = None
    work: KeyedWorkProgress | None = None  # the keyed-work loop's counts, written once more when the stage ends


_ACTIVE = _Active()


def rank_file(output_dir: str | os.PathLike, rank: int) -> Path:
    return OutputLayout(output_dir).work / "progress" / f"rank-{rank}.json"


class KeyedWorkProgress:
    """One rank's counts in one call of the keyed-work loop, rewritten to its rank file every few seconds."""

    def __init__(self, path: Path | None, stage: str, unit: str, rank: int, total: int, assigned: int,
                 already_done: int):
        self.path = path
        self.data = {"stage": stage, "unit": unit, "rank": rank, "total": total, "assigned": assigned,
                     "already_done": already_done, "done_now": 0, "saved_now": 0, "accepted": 0, "decided": 0, "prompt_tokens": 0,
                     "generated_tokens": 0, "retries": 0, "started_unix": time.time(), "finished": False}
        self.last_write = 0.0
        self.written_done = -1
        self.lock = threading.Lock()
        self.write()
        # Records come in bursts (a batch at a time): a thread writes what the last burst left unwritten, so the
        # file lags the rank by at most WRITE_EVERY_SECONDS, not by a batch.
        self.stop = threading.Event()
        if path is not None:
            threading.Thread(target=self._beat, name="rsgen-progress-rank", daemon=True).start()

    def _beat(self) -> None:
        while not self.stop.wait(max(WRITE_EVERY_SECONDS, 0.05)):
            if self.data["done_now"] != self.written_done:
                self.write()

    def add(self, record: dict[str, Any], engine_stats: Any = None, unsaved: int = 0) -> None:
        """Count one record handed to the store's writer (`unsaved`: records the writer still buffers, lost to a
        SIGKILL); `match` (verifier) or `verdict` (judge) counts towards the accept rate."""
        data = self.data
        with self.lock:
            data["done_now"] += 1
            data["saved_now"] = data["done_now"] - unsaved
            if "match" in record or "verdict" in record:
                data["decided"] += 1
                data["accepted"] += bool(record.get("match")) or record.get("verdict") == "CORRECT"
            if engine_stats is not None:
                for key in ("prompt_tokens", "generated_tokens", "retries"):
                    data[key] = getattr(engine_stats, key, 0)
        if time.monotonic() - self.last_write >= WRITE_EVERY_SECONDS:
            self.write()

    def close(self, flushed: bool = True) -> None:
        """The loop ended (`flushed`: the writer's exit wrote every record it held)."""
        self.stop.set()
        with self.lock:
            self.data["finished"] = True
            if flushed:
                self.data["saved_now"] = self.data["done_now"]
        self.write()

    def write(self) -> None:
        self.last_write = time.monotonic()
        if self.path is None:
            return
        try:
            with self.lock:
                self.data["written_unix"] = time.time()
                self.written_done = self.data["done_now"]
                text = json.dumps(self.data)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.parent.mkdir(parents=True, exist_ok=True)  # made by the first stage with keyed work
            tmp.write_text(text + "\n")
            os.replace(tmp, self.path)
        except OSError as err:  # progress is for watching: never the reason a run stops
            logger.debug(f"progress: could not write {self.path}: {err}")


def keyed_work_progress(stage: Any, summary: Any) -> KeyedWorkProgress:
    """This rank's progress in the keyed-work loop (`summary`: its KeyedWorkSummary); written only inside a stage
    that `stage_progress` wraps (a stage function called on its own, as in tests, counts without writing)."""
    path = None
    if _ACTIVE.output_dir is not None and _ACTIVE.stage == stage.name:
        path = rank_file(_ACTIVE.output_dir, summary.rank)
    work = KeyedWorkProgress(path, stage.name, stage.unit, summary.rank, summary.total, summary.assigned,
                             summary.already_done)
    if path is not None:
        _ACTIVE.work = work
    return work


def sum_ranks(files: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """One stage's figures over its ranks' files: done of total, rate since the ranks started, ETA, tokens,
    retries, accept rate of the records decided so far."""
    keys = ("assigned", "already_done", "done_now", "saved_now", "accepted", "decided", "prompt_tokens", "generated_tokens",
            "retries")
    out: dict[str, Any] = {key: sum(f[key] for f in files) for key in keys}
    out["unit"] = files[0]["unit"]
    out["total"] = files[0]["total"]
    out["ranks_reporting"] = len(files)
    out["done"] = out["already_done"] + out["done_now"]
    out["on_disk"] = out["already_done"] + out["saved_now"]  # what a rerun finds done
    elapsed = now - min(f["started_unix"] for f in files)
    rate = out["done_now"] / elapsed if elapsed > 0 else 0.0
    out["items_per_second"] = round(rate, 3)
    left = max(out["total"] - out["done"], 0)
    out["eta_seconds"] = round(left / rate) if rate > 0 else (0 if not left else None)
    out["accept_rate"] = round(out["accepted"] / out["decided"], 6) if out["decided"] else None
    return out


# ------------------------------------------------------------------------------------------------ main process


class ProgressBoard:
    """The main process's progress.json: every stage of this output directory, rewritten by a heartbeat thread."""

    def __init__(self, output_dir: str | os.PathLike, world_size: int, stage_names: list[str],
                 hub_push: Any = None, hub_every_seconds: float = 0.0):
        self.layout = OutputLayout(output_dir)
        self.path = progress_json(output_dir)
        self.world_size = world_size
        self.lock = threading.Lock()
        self.data = read_progress(output_dir) or {}
        self.data.update(progress_version=PROGRESS_VERSION, output_dir=str(self.layout.root.resolve()),
                         world_size=world_size, pid=os.getpid(), host=os.uname().nodename)
        self.data.setdefault("started_at", _iso(time.time()))
        stages = self.data.setdefault("stages", {})
        self.data["stages"] = {name: stages.get(name, {"state": "waiting"}) for name in stage_names}
        self.hub_push = hub_push  # callable(card_text) or None
        self.hub_every_seconds = hub_every_seconds

    def start(self, stage: str) -> None:
        with self.lock:
            self.data["state"] = RUNNING
            self.data["current_stage"] = stage
            self.data["stages"][stage] = {"state": RUNNING, "started_at": _iso(time.time())}
        self.write()

    def end(self, stage: str, state: str, run_finished: bool) -> None:
        with self.lock:
            self.refresh_locked(stage)
            entry = self.data["stages"][stage]
            entry["state"] = DONE if state == DONE else STOPPED
            entry["finished_at"] = _iso(time.time())
            self.data["state"] = FINISHED if run_finished else (RUNNING if state == DONE else STOPPED)
        self.write(push=self.data["state"] != RUNNING)  # the last word of a run goes out at once

    def refresh_locked(self, stage: str) -> None:
        """Fold the stage's rank files into its entry."""
        files = []
        for rank in range(self.world_size):
            with contextlib.suppress(OSError, ValueError):
                data = json.loads(rank_file(self.layout.root, rank).read_text())
                if data.get("stage") == stage:
                    files.append(data)
        if files:
            self.data["stages"][stage].update(sum_ranks(files, time.time()))

    def write(self, push: bool = False) -> None:
        with self.lock:
            stage = self.data.get("current_stage")
            if stage and self.data["stages"].get(stage, {}).get("state") == RUNNING:
                self.refresh_locked(stage)
            now = time.time()
            self.data["written_at"] = _iso(now)
            self.data["written_unix"] = now
            snapshot = json.loads(json.dumps(self.data))
        try:
            _write_json(self.path, snapshot)
        except OSError as err:
            logger.debug(f"progress: could not write {self.path}: {err}")
        self.maybe_push(snapshot, force=push)

    def maybe_push(self, snapshot: dict[str, Any], force: bool = False) -> None:
        """The card's progress section to the Hub, at most every `hub_every_seconds` (and at each stage's end)."""
        if self.hub_push is None or self.hub_every_seconds <= 0:
            return
        now = time.monotonic()
        last = _LAST_HUB_PUSH.get(str(self.path))
        if not force and last is not None and now - last < self.hub_every_seconds:
            return
        _LAST_HUB_PUSH[str(self.path)] = now
        try:
            self.hub_push(progress_markdown(snapshot))
        except Exception as err:  # a Hub hiccup must not stop a week-long run; the next push tries again
            logger.warning(f"progress: pushing the card's progress section failed ({type(err).__name__}: {err})")


def _heartbeat(board: ProgressBoard, stop: threading.Event) -> None:
    while not stop.wait(WRITE_EVERY_SECONDS):
        board.write()


# progress.json -> when its card section was last pushed (monotonic), kept from stage to stage of the run.
_LAST_HUB_PUSH: dict[str, float] = {}


@contextlib.contextmanager
def stage_progress(output_dir: str | os.PathLike, stage: str, state: Any, stage_names: list[str],
                   last_stage: bool, hub_push: Any = None, hub_every_seconds: float = 0.0):
    """Wraps one stage's work on every rank: this process reports under `stage`; the main process clears the rank
    files of the stage before, keeps progress.json fresh during, and records how the stage ended."""
    root = OutputLayout(output_dir).root
    board = None
    if state.is_main_process:
        for old in rank_file(root, 0).parent.glob("rank-*.json"):  # an earlier stage's or launch's counts
            old.unlink(missing_ok=True)
        # Earlier stages' entries come from progress.json itself (also those of an earlier launch: a resume).
        board = ProgressBoard(root, state.num_processes, stage_names, hub_push, hub_every_seconds)
        board.start(stage)
    state.wait_for_everyone()  # no rank writes its file before the old ones are gone
    _ACTIVE.stage, _ACTIVE.output_dir = stage, root
    stop = threading.Event()
    beat = None
    if board is not None:
        beat = threading.Thread(target=_heartbeat, args=(board, stop), name="rsgen-progress", daemon=True)
        beat.start()
    ended = STOPPED
    try:
        yield
        ended = DONE
    finally:
        if _ACTIVE.work is not None:  # stopped inside the loop (SIGTERM, an error): its last counts, every
            _ACTIVE.work.close(flushed=True)  # record flushed by the writer's exit on the way out
        _ACTIVE.stage = _ACTIVE.output_dir = _ACTIVE.work = None
        stop.set()
        if board is not None:
            beat.join()
            board.end(stage, ended, run_finished=ended == DONE and last_stage)


# ------------------------------------------------------------------------------------------------ reading


def run_state(progress: dict[str, Any], now: float | None = None) -> tuple[str, float]:
    """("finished" | "running" | "stopped", seconds since progress.json was last written)."""
    now = time.time() if now is None else now
    age = max(now - progress.get("written_unix", 0.0), 0.0)
    if progress.get("state") == FINISHED:
        return FINISHED, age
    if progress.get("state") == STOPPED or age > STALE_AFTER_SECONDS:
        return STOPPED, age
    return RUNNING, age


def state_line(progress: dict[str, Any], now: float | None = None) -> str:
    state, age = run_state(progress, now)
    where = f"{progress.get('output_dir')}"
    if state == FINISHED:
        return f"finished ({where}; last written {progress.get('written_at')})"
    if state == STOPPED:
        minutes = int(age // 60)
        return (f"stopped {minutes} minute{'s' if minutes != 1 else ''} ago, in {progress.get('current_stage')} "
                f"({where}; last written {progress.get('written_at')}; rerun the same command to continue)")
    processes = progress.get("world_size")
    return f"running: {progress.get('current_stage')} ({where}; {processes} process{'es' if processes != 1 else ''}, " \
           f"last written {age:.0f} s ago)"


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


STATUS_HEAD = ["stage", "state", "done / total", "on disk", "items/s", "ETA", "gen tokens", "retries", "accept rate"]


def status_rows(progress: dict[str, Any], now: float | None = None) -> list[list[str]]:
    gone = run_state(progress, now)[0] == STOPPED  # a stage "running" in the file of a dead run is stopped
    rows = []
    for name, entry in progress.get("stages", {}).items():
        entry = {**entry, "state": STOPPED} if gone and entry.get("state") == RUNNING else entry
        if "total" in entry:
            done = f"{entry['done']:,} / {entry['total']:,} {entry['unit']}s"
            accept = f"{entry['accept_rate']:.1%}" if entry.get("accept_rate") is not None else "-"
            rows.append([name, entry["state"], done, f"{entry.get('on_disk', entry['done']):,}",
                         f"{entry['items_per_second']:.2f}",
                         _duration(entry["eta_seconds"]) if entry["state"] == RUNNING else "-",
                         f"{entry['generated_tokens']:,}", f"{entry['retries']:,}", accept])
        else:
            rows.append([name, entry.get("state", "waiting"), *["-"] * (len(STATUS_HEAD) - 2)])
    return rows


def status_table(progress: dict[str, Any], now: float | None = None) -> str:
    """What `rsgen status` prints: the run's state, then one line per stage."""
    rows = [STATUS_HEAD, *status_rows(progress, now)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(STATUS_HEAD))]
    lines = [state_line(progress, now), ""]
    lines += ["  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
              for row in rows]
    return "\n".join(lines)


def progress_markdown(progress: dict[str, Any]) -> str:
    """The card's progress section (between markers, so a later push replaces it)."""
    rows = status_rows(progress)
    table = "\n".join(["| " + " | ".join(STATUS_HEAD) + " |", "|---" * len(STATUS_HEAD) + "|",
                       *("| " + " | ".join(row) + " |" for row in rows)])
    return (f"{CARD_SECTION_START}\n## Progress\n\nState: {state_line(progress)}.\n\n{table}\n\n"
            f"Written by rsgen at {progress.get('written_at')} (UTC).\n{CARD_SECTION_END}\n")


def card_with_progress(card: str | None, section: str, title: str) -> str:
    """`card` (the last emitted card, or None) with its progress section replaced by `section`."""
    if card is None:
        return f"# {title}\n\nThis dataset is being generated by rsgen; the full card comes when the run ends.\n\n" \
               + section
    if CARD_SECTION_START in card and CARD_SECTION_END in card:
        head, _, rest = card.partition(CARD_SECTION_START)
        _, _, tail = rest.partition(CARD_SECTION_END)
        return head + section.rstrip("\n") + tail
    return card.rstrip("\n") + "\n\n" + section
