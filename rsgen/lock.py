"""One run at a time per output directory: OUTPUT_DIR/rsgen.lock.

A second `rsgen` on a busy output_dir (a resubmitted Slurm job, a second terminal) would work on the same keys
as the first. The lock file is created with O_CREAT|O_EXCL, which is atomic on local and on shared (NFSv3+,
Lustre, GPFS) filesystems, so it also refuses a run on another node. It names its holder (host, pid, start
time). The holder refreshes the file's mtime every HEARTBEAT_SECONDS; a lock is stale, and taken over with a
warning, when its holder is a dead process on this host, or, for a holder on another host (whose processes
cannot be seen from here), when its heartbeat is older than STALE_SECONDS.

All ranks of one launch share the lock: the main process takes it and tells the others the outcome
(`locked_output_dir`).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from rsgen.config import RecipeError

logger = logging.getLogger(__name__)

LOCK_NAME = "rsgen.lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 600.0


class OutputDirBusy(RecipeError):
    """Another live run holds the output directory (a RecipeError: the CLI exits with code 2)."""


class OutputDirUnwritable(RecipeError):
    """The output directory, its lock or its first file cannot be created (a RecipeError: exit code 2)."""


def unwritable(output_dir: str | os.PathLike, err: OSError, creating: str | None = None) -> OutputDirUnwritable:
    """One line: the output_dir, what the system said and what it was creating (`creating`, else the error's file)."""
    creating = creating or (repr(str(err.filename)) if err.filename else None)
    what = (err.strerror or type(err).__name__) + (f" creating {creating}" if creating else "")
    return OutputDirUnwritable(f"output_dir {str(output_dir)!r} cannot be written ({what}); set output_dir to a "
                               "folder you can write, or fix its permissions")


@contextlib.contextmanager
def output_dir_errors(output_dir: str | os.PathLike) -> Iterator[None]:
    """Any OSError of the block (creating output_dir, its lock, its first file) as one line naming the folder. A
    full disk stays an OSError: the CLI says so, and that a rerun continues."""
    try:
        yield
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise unwritable(output_dir, err) from None


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None (no /proc, no process)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """When `pid` started, in clock ticks since boot, so that a recycled pid is not taken for its predecessor."""
    stat = _proc_stat(pid)
    return stat[19] if stat else None


def _alive(pid: int, start: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    stat = _proc_stat(pid)
    if stat is None:  # no /proc: the pid exists, which is all we can tell
        return True
    return stat[0] != "Z" and (start is None or stat[19] == start)  # a zombie has finished


class OutputDirLock:
    """The lock file of one output directory. `acquire()` raises OutputDirBusy naming a live holder."""

    def __init__(self, output_dir: str | os.PathLike):
        self.path = Path(output_dir) / LOCK_NAME
        pid = os.getpid()
        self.holder = {
            "host": socket.gethostname(),
            "pid": pid,
            "process_start": _process_start(pid),
            "started_at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "token": uuid.uuid4().hex,  # tells this lock from a later one of the same process
        }
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self) -> None:
        with output_dir_errors(self.path.parent):
            self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # a few rounds: other runs may be taking over the same stale lock
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                text = self._read()
                if text is None:  # released meanwhile
                    continue
                stale = self._stale_reason(text)
                if stale is None:
                    raise OutputDirBusy(self._busy_message(text)) from None
                self._take_over(text, stale)
                continue
            except OSError as err:
                if err.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                raise unwritable(self.path.parent, err) from None
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(self.holder) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            self._heartbeat = threading.Thread(target=self._beat, name="rsgen-lock-heartbeat", daemon=True)
            self._heartbeat.start()
            return
        raise OutputDirBusy(f"could not take the lock {self.path} (other runs keep taking it); try again")

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        text = self._read()
        if text is not None and _parse(text).get("token") == self.holder["token"]:
            self.path.unlink(missing_ok=True)

    def _read(self) -> str | None:
        try:
            return self.path.read_text()
        except FileNotFoundError:
            return None

    def _stale_reason(self, text: str) -> str | None:
        """Why the lock in `text` may be taken over, or None while its holder may be alive."""
        holder = _parse(text)
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return "released"
        if not holder:
            # Unreadable: a holder that died between creating and writing it (or garbage). Give a creator a moment.
            return "unreadable and not refreshed" if age > HEARTBEAT_SECONDS else None
        if holder.get("host") == self.holder["host"]:
            if not _alive(int(holder["pid"]), holder.get("process_start")):
                return f"process {holder['pid']} on this host is gone"
            return None
        if age > STALE_SECONDS:
            return f"no heartbeat for {age:.0f} s"
        return None

    def _take_over(self, text: str, reason: str) -> None:
        """Move the stale lock aside, unless another run replaced it meanwhile (then put that one back)."""
        aside = self.path.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if aside.read_text() != text:  # we moved a fresh lock of another run: give it back
            os.rename(aside, self.path)
            return
        aside.unlink()
        holder = _parse(text)
        logger.warning("taking over the lock of %s: %s (%s)", self.path.parent, _describe(holder), reason)

    def _busy_message(self, text: str) -> str:
        return (f"output_dir {str(self.path.parent)!r} is in use by another rsgen run: {_describe(_parse(text))}. "
                f"Wait for it to finish, or use another output_dir. If that run is gone for sure, delete {self.path}.")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(self.path)


def _parse(text: str) -> dict:
    try:
        holder = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return holder if isinstance(holder, dict) and "pid" in holder and "host" in holder else {}


def _describe(holder: dict) -> str:
    if not holder:
        return "holder unknown (lock file unreadable)"
    return f"host {holder['host']}, pid {holder['pid']}, started {holder.get('started_at', '?')}"


@contextlib.contextmanager
def locked_output_dir(output_dir: str | os.PathLike, state=None) -> Iterator[None]:
    """Hold the output_dir lock for the block. Under a launch (`state`: accelerate's PartialState) the main
    process takes it and every rank learns the outcome, so all ranks fail alike when it is busy."""
    lock = OutputDirLock(output_dir)
    main = state is None or state.is_main_process
    error = None  # (kind, message): the outcome every rank learns
    if main:
        try:
            lock.acquire()
        except (OutputDirBusy, OutputDirUnwritable) as err:
            error = (type(err).__name__, str(err))
    if state is not None and state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        error = broadcast_object_list([error], from_process=0)[0]
    if error is not None:
        raise {"OutputDirBusy": OutputDirBusy, "OutputDirUnwritable": OutputDirUnwritable}[error[0]](error[1])
    try:
        yield
    finally:
        if main:
            lock.release()
