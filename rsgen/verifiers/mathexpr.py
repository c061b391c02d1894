"""`math` -- mathematical equivalence with math-verify (`parse` + `verify`), under a hard per-item time limit.

Semantics: the prediction and each reference are parsed by math-verify as LaTeX/expressions (a bare answer
such as `\\frac{1}{2}` or `x+1` is read as if it were boxed) and compared with `math_verify.verify(gold,
prediction)`; any reference counts. Answers equal after `exact`'s normalisation, or plain numbers of equal
value ("1,000" vs "1000"), match without calling math-verify. A prediction or reference longer than
`MAX_MATH_CHARS` is not parsed (it only matches by string equality).

Time limit (`timeout_seconds`, default 5): the whole item (parsing both sides and comparing) runs in a
worker process (`rsgen.verifiers._math_worker`) under an alarm; past the limit the item is a non-match with
reason `math_timeout`. If the worker does not answer within `timeout_seconds + KILL_GRACE_SECONDS` (work
stuck in C code), it is killed and restarted, and the item is `math_timeout` too. So a math check never
takes longer than that bound, in any thread, and never hangs a run. An item that exhausts the worker's
memory limit (`RSGEN_MATH_WORKER_MEMORY_MB`, default 4096) is `math_timeout` as well; one that makes
math-verify fail in any other way is a `wrong_answer`. The worker is started on first use (about a second),
shared by all threads of the process (calls are serialised) and restarted after a fork.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from rsgen.verifiers.decision import MATH_TIMEOUT, WRONG_ANSWER, Decision, accepted, rejected
from rsgen.verifiers.frame import verifier
from rsgen.verifiers.normalize import normalize_text, parse_number

DEFAULT_TIMEOUT_SECONDS = 5.0
KILL_GRACE_SECONDS = 1.0
STARTUP_TIMEOUT_SECONDS = 120.0
MAX_MATH_CHARS = 5000


class MathWorkerError(RuntimeError):
    """The math-verify worker process could not be started (math-verify missing, no subprocesses allowed)."""


class MathWorker:
    """One math-verify worker process and the protocol to talk to it with a deadline."""

    def __init__(self, command: list[str] | None = None) -> None:
        # `command` replaces the worker program (tests use a stand-in that never answers, to check the kill).
        self.command = command or [sys.executable, "-m", "rsgen.verifiers._math_worker"]
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._owner_pid: int | None = None
        self._buffer = b""
        self._stderr = None
        self.starts = 0  # worker processes started so far: 1 + kills after late replies + crashes + forks

    def check(self, golds: list[str], prediction: str, timeout: float) -> str:
        """One item: "match", "nomatch", "timeout" or "error", within timeout + KILL_GRACE_SECONDS."""
        request = (json.dumps({"gold": golds, "pred": prediction, "timeout": timeout}) + "\n").encode("ascii")
        with self._lock:
            if self._proc is None or self._owner_pid != os.getpid() or self._proc.poll() is not None:
                self._start()
            try:
                self._proc.stdin.write(request)
                self._proc.stdin.flush()
            except OSError:  # died between items
                self._kill()
                return "timeout"
            reply = self._read_line(time.monotonic() + timeout + KILL_GRACE_SECONDS)
            if reply is None:
                self._kill()
                return "timeout"
            try:
                return json.loads(reply)["status"]
            except (ValueError, KeyError, TypeError):
                self._kill()
                return "error"

    def _start(self) -> None:
        if self._proc is not None and self._owner_pid == os.getpid():
            self._kill()
        # A process inherited through fork belongs to the parent: leave it alone and start our own.
        self._proc = None
        self._buffer = b""
        if self._stderr is not None and self._owner_pid == os.getpid():
            self._stderr.close()
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self._stderr = tempfile.TemporaryFile()
        try:
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._stderr,
                env=env,
                close_fds=True,
            )
        except OSError as e:
            raise MathWorkerError(f"cannot start the math-verify worker process: {e}") from e
        self._proc, self._owner_pid = proc, os.getpid()
        self.starts += 1
        ready = self._read_line(time.monotonic() + STARTUP_TIMEOUT_SECONDS)
        if ready is None or b"ready" not in ready:
            self._kill()
            self._stderr.seek(0)
            detail = self._stderr.read()[-2000:].decode("utf-8", "replace")
            raise MathWorkerError(
                "the math-verify worker did not start (is `math-verify` installed in this environment?)\n"
                + detail
            )

    def _read_line(self, deadline: float) -> bytes | None:
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            readable, _, _ = select.select([fd], [], [], remaining)
            if not readable:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        self._buffer = b""
        if proc is None:
            return
        try:
            proc.kill()
            proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        for stream in (proc.stdin, proc.stdout):
            try:
                stream.close()
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._owner_pid == os.getpid():
                self._kill()
            self._proc = None


_worker: MathWorker | None = None
_worker_lock = threading.Lock()


def math_worker() -> MathWorker:
    """The process-wide worker (created on first use, closed at interpreter exit)."""
    global _worker
    if _worker is None:
        with _worker_lock:
            if _worker is None:
                _worker = MathWorker()
                atexit.register(_worker.close)
    return _worker


def _plain_number(text: str) -> float | None:
    number = parse_number(text)
    if number is None or number.percent or number.currency or number.unit:
        return None
    return number.value


@verifier
def math_verifier(
    prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds
) -> Decision:
    """Mathematical equivalence of an extracted answer with any reference (math-verify, time-limited)."""
    timeout = DEFAULT_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    pred_text = normalize_text(prediction)
    pred_number = _plain_number(pred_text)
    for ref in references:
        ref_text = normalize_text(ref)
        if pred_text == ref_text:
            return accepted(prediction)
        if pred_number is not None and _plain_number(ref_text) == pred_number:
            return accepted(prediction)
    golds = [ref for ref in references if len(ref) <= MAX_MATH_CHARS]
    if len(prediction) > MAX_MATH_CHARS or not golds:
        return rejected(WRONG_ANSWER, prediction)
    status = math_worker().check(golds, prediction, float(timeout))
    if status == "match":
        return accepted(prediction)
    if status == "timeout":
        return rejected(MATH_TIMEOUT, prediction)
    return rejected(WRONG_ANSWER, prediction)
