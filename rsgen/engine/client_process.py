"""An asyncio client in a process of its own: jobs go to it through a pipe, results come back through another.

Why a process and not a thread: the `openai` engine's HTTP client on an event loop in a thread shared one GIL with
the stage that builds each request body and verifies and checkpoints each answer. Every socket call of the loop
gave the GIL up and waited for the stage's thread to hand it back, so on the 2-core machine the generate stage
reached 47-81% of a minimal aiohttp client posting the same bodies (bench/bench_server.py). In a process of its
own the client has its own interpreter: the stage's work and the client's run side by side.

The process is forked (not spawned): it starts in milliseconds and works on a copy of the engine as it is (its
settings, its API key, which never cross a pipe). It takes no signal itself (SIGINT/SIGTERM go to the stage,
which closes it) and ends when its job pipe closes, also when the parent is SIGKILLed. It never logs: what the
parent must count or log (retries) comes back as reports.

Forked from a process with threads (the progress heartbeat, the output lock's heartbeat): only the forking thread
goes on in the child, and a lock another thread held at the fork stays held there for ever. So the child touches
none: it never logs (the logging module re-creates its locks in a forked child anyway), never writes progress or
records (it calls only the engine's HTTP code: the session, the parse of an answer, the scrubbing of messages),
imports nothing the parent has not (the engine imports aiohttp before it forks: an import in the child could wait
on a module lock a thread held), and ends with os._exit, not through multiprocessing's exit path, which flushes
sys.stdout and sys.stderr (their buffers' locks may be a heartbeat thread's at the fork: a warning being written);
a failure's traceback goes to file descriptor 2 in one raw write.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import multiprocessing
import os
import pickle
import select
import signal
import stat
import struct
import sys
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

from rsgen.interrupt import deferred

_HEADER = struct.Struct("<Q")  # each message: its length, then its pickle
WAIT_SECONDS = 0.2  # the parent waits for results this long at a time, so signal handlers run between waits
CLOSE_SECONDS = 10.0
PIPE_BYTES = 1 << 20


class ClientProcessError(RuntimeError):
    """The client process failed: it ended without being told to, or a job raised an exception that cannot cross
    the pipe (its traceback is in the message)."""


def _frame(message: Any) -> bytes:
    payload = pickle.dumps(message, pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(payload)) + payload


def _unframe(buffer: bytearray) -> list[Any]:
    """Every whole message at the start of `buffer` (removed from it)."""
    messages = []
    start = 0
    while len(buffer) - start >= _HEADER.size:
        (size,) = _HEADER.unpack_from(buffer, start)
        end = start + _HEADER.size + size
        if len(buffer) < end:
            break
        messages.append(pickle.loads(memoryview(buffer)[start + _HEADER.size:end]))
        start = end
    del buffer[:start]
    return messages


class ClientProcess:
    """Runs `call(client, job, report)` in a forked process for every job sent, at most `limit` at once on one event
    loop; jobs sent beyond the limit wait there, so the child never idles while the parent is busy or not
    scheduled (a loaded machine) -- the parent keeps a window of jobs ahead.

    `open_client()` (a coroutine function) makes the client object once in the child (an aiohttp session: it
    must be made there, on the child's loop); it is closed with `await client.close()`. `report(x)` sends `x` back
    at once, ahead of the job's result (a retry to count). `send` and `receive` are called from one thread.
    `running` and `peak` are the jobs running in the child (not waiting) as it last said, and the most at once."""

    def __init__(self, open_client: Callable[[], Awaitable[Any]],
                 call: Callable[[Any, Any, Callable[[Any], None]], Awaitable[Any]], name: str = "rsgen-http"):
        jobs_read, self._jobs = os.pipe()
        self._results, results_write = os.pipe()
        for fd in (self._jobs, self._results):
            _widen(fd)
        self._buffer = bytearray()
        self.running = self.peak = 0
        self.process = multiprocessing.get_context("fork").Process(
            target=_child_main, args=(open_client, call, jobs_read, results_write), name=name, daemon=True)
        try:
            # A SIGTERM that lands during the fork would run the stage's handler inside one of the at-fork hooks
            # (logging's lock release), where its exception is printed and dropped: the signal lost, the run going
            # on. Deferred, it is raised here once the child exists.
            with deferred():
                self.process.start()
        finally:
            os.close(jobs_read)
            os.close(results_write)
            if self.process.pid is not None and sys.exc_info()[0] is not None:
                self.close()  # interrupted once the child existed: it ends with its job pipe

    def send(self, limit: int, jobs: list[tuple[int, Any]]) -> None:
        """Hand the child `(id, job)` pairs and the most it may run at once from now on."""
        data = memoryview(_frame((limit, jobs)))
        while data:
            data = data[os.write(self._jobs, data):]

    def receive(self) -> tuple[list[tuple[int, Any]], list[Any]]:
        """Wait for the child's next results: `(id, result)` pairs (a result may be an exception the job raised)
        and reports, every one that has arrived."""
        while True:
            messages = _unframe(self._buffer)
            if messages:
                results = [r for done, *_ in messages for r in done]
                reports = [r for _, reported, *_ in messages for r in reported]
                _, _, self.running, peak = messages[-1]
                self.peak = max(self.peak, peak)
                return results, reports
            if not select.select([self._results], [], [], WAIT_SECONDS)[0]:
                continue
            data = os.read(self._results, 1 << 20)
            if not data:
                self.process.join(timeout=CLOSE_SECONDS)
                raise ClientProcessError(f"the HTTP client process ended unexpectedly (exit code "
                                         f"{self.process.exitcode})")
            self._buffer += data

    def close(self) -> None:
        """Stop the child: its job pipe closes, it cancels what is in flight and ends."""
        for fd in (self._jobs, self._results):
            try:
                os.close(fd)
            except OSError:
                pass
        self.process.join(timeout=CLOSE_SECONDS)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _widen(fd: int) -> None:
    """A pipe of 1 MiB where Linux allows it (64 KiB by default): a window of request bodies is written without
    waiting for the child to read (each wait is a scheduling round on a loaded machine)."""
    try:
        import fcntl

        fcntl.fcntl(fd, getattr(fcntl, "F_SETPIPE_SZ", 1031), PIPE_BYTES)
    except (ImportError, OSError):
        pass  # not Linux, or above /proc/sys/fs/pipe-max-size: the default size works, a little slower


def _child_main(open_client, call, jobs_read: int, results_write: int) -> None:
    # The stage's handlers raise in the stage; here a Ctrl-C or SIGTERM to the process group must not cut the
    # client short with a traceback: the stage closes it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _close_inherited(keep=(0, 1, 2, jobs_read, results_write))
    code = 0
    try:
        asyncio.run(_serve(open_client, call, jobs_read, results_write))
    except BaseException as err:  # the parent says the exit code; the cause is on stderr, written without its lock
        code = 1
        try:
            os.write(2, ("rsgen HTTP client process: " + "".join(traceback.format_exception(err))).encode())
        except OSError:
            pass
    os._exit(code)


def _close_inherited(keep: tuple[int, ...]) -> None:
    """Close the sockets and pipes the fork copied from the parent: a copy held here would keep them open after the
    parent closes them (a listening socket would still take connections nobody answers; the job pipe would never
    close). The parent's objects that own them are never collected here (frozen), so none closes a number this
    process has reused meanwhile."""
    gc.freeze()
    fd_dir = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"
    for name in os.listdir(fd_dir):
        fd = int(name)
        if fd in keep:
            continue
        try:
            mode = os.fstat(fd).st_mode
        except OSError:  # the listing's own descriptor, closed by now
            continue
        if stat.S_ISSOCK(mode) or stat.S_ISFIFO(mode):
            os.close(fd)


class _JobReader(asyncio.Protocol):
    def __init__(self, start: Callable[[list], None], ended: asyncio.Future):
        self.start = start
        self.ended = ended
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        for jobs in _unframe(self.buffer):
            self.start(jobs)

    def eof_received(self) -> bool:
        if not self.ended.done():
            self.ended.set_result(None)
        return False

    def connection_lost(self, exc) -> None:
        self.eof_received()


async def _serve(open_client, call, jobs_read: int, results_write: int) -> None:
    loop = asyncio.get_running_loop()
    client = await open_client()
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, os.fdopen(results_write, "wb", buffering=0))
    done: list[tuple[int, Any]] = []
    reports: list[Any] = []
    flush_pending = False
    waiting: collections.deque[tuple[int, Any]] = collections.deque()
    workers: set[asyncio.Task] = set()
    limit = busy = peak = 0

    def flush() -> None:
        """One message for everything finished in one turn of the loop (written without blocking: the loop's
        transport buffers what the pipe does not take yet, so the child keeps reading jobs meanwhile)."""
        nonlocal done, reports, flush_pending
        flush_pending = False
        if not out.is_closing():
            out.write(_frame((done, reports, busy, peak)))
        done, reports = [], []

    def later() -> None:
        nonlocal flush_pending
        if not flush_pending:
            flush_pending = True
            loop.call_soon(flush)

    def report(item: Any) -> None:
        reports.append(item)
        later()

    def launch() -> None:
        """A worker per job that can start now, up to the limit (each takes the next job when its own ends)."""
        nonlocal busy, peak
        while waiting and len(workers) < limit:
            busy += 1
            workers.add(loop.create_task(work(waiting.popleft())))
        peak = max(peak, busy)

    async def work(job: tuple[int, Any]) -> None:
        """Run jobs one after another while there are some and this worker is within the limit: a task per
        worker, not per job (a task made and ended per request was ~5% of this process's CPU)."""
        nonlocal busy, peak
        try:
            while True:
                job_id, payload = job
                try:
                    result = await call(client, payload, report)
                except asyncio.CancelledError:
                    raise
                except BaseException as err:  # the parent raises it where it takes the result
                    result = err if _crosses(err) else ClientProcessError(
                        "the HTTP client failed: " + "".join(traceback.format_exception(err)))
                done.append((job_id, result))
                later()
                if not waiting or len(workers) > limit:  # nothing to do, or the limit came down: this one ends
                    busy -= 1
                    return
                job = waiting.popleft()
        finally:
            workers.discard(asyncio.current_task())

    def start(message: tuple[int, list]) -> None:
        nonlocal limit
        limit, jobs = message
        waiting.extend(jobs)
        launch()

    ended = loop.create_future()
    await loop.connect_read_pipe(lambda: _JobReader(start, ended), os.fdopen(jobs_read, "rb", buffering=0))
    try:
        await ended
    finally:
        waiting.clear()
        for task in list(workers):
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await client.close()
        out.close()


def _crosses(err: BaseException) -> bool:
    """Whether an exception survives the pipe as itself (pickled and read back)."""
    try:
        pickle.loads(pickle.dumps(err))
    except Exception:
        return False
    return True
