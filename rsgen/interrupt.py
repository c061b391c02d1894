"""SIGTERM and SIGINT as an exception, so finished work is flushed on the way out.

Slurm and Kubernetes send SIGTERM some seconds before SIGKILL. Its default action ends the process at once and
loses every record buffered since the last checkpoint; here it raises `Interrupted` in the main thread instead,
so the `with` blocks that hold finished work (rsgen.store.PartWriter) write it before the process exits. Writes
that must not be cut in the middle (a checkpoint part, a folder swap) run under `deferred()`: a signal that
arrives meanwhile takes effect right after them.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RERUN_HINT = "interrupted; rerun the same command to continue"


class Interrupted(BaseException):
    """Raised in the main thread by SIGTERM/SIGINT. A BaseException (like KeyboardInterrupt), so that
    `except Exception` handlers let it through."""

    def __init__(self, signum: int):
        super().__init__(f"{signal.Signals(signum).name}: {RERUN_HINT}")
        self.signum = signum


_deferring = 0
_pending: int | None = None
_raised = False


def _handler(signum, frame) -> None:
    global _pending, _raised
    if _raised:
        # Once only: under a launcher a process gets SIGTERM twice (from Slurm, then forwarded by torchrun), and
        # the second must not cut the flush the first one started. SIGKILL still ends it.
        return
    if _deferring:
        _pending = signum
        return
    _raised = True
    raise Interrupted(signum)


class _Deferred:
    """The context manager `deferred()` returns: one object, as its state is the module's (nested blocks count)."""

    __slots__ = ()

    def __enter__(self) -> None:
        global _deferring
        _deferring += 1

    def __exit__(self, *exc) -> None:
        global _deferring, _pending, _raised
        _deferring -= 1
        if not _deferring and _pending is not None:
            signum, _pending = _pending, None
            _raised = True
            raise Interrupted(signum)


_DEFERRED = _Deferred()


def deferred() -> _Deferred:
    """Run the block whole: a SIGTERM/SIGINT that arrives inside it is raised when it ends. (A class, not a
    generator: the keyed-work loop enters it once per record, and a generator's context manager cost ~1.5 us.)"""
    return _DEFERRED


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise `Interrupted` (nested blocks and other threads: no change)."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) is _handler:
        yield
        return
    global _raised
    _raised = False
    previous = {signum: signal.signal(signum, _handler) for signum in SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
