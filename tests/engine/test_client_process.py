"""The forked client process of the `openai` engine (rsgen.engine.client_process): jobs and their results across
the pipes, its concurrency limit, exceptions, and that it never outlives or outholds its parent."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from rsgen.engine import EngineUnavailable
from rsgen.engine.client_process import ClientProcess, ClientProcessError


class _Client:
    """What open_client gives the child: counts the jobs running at once."""

    def __init__(self):
        self.running = 0
        self.most = 0

    async def close(self):
        pass


async def _open():
    return _Client()


async def _call(client, job, report):
    kind, value = job
    client.running += 1
    client.most = max(client.most, client.running)
    try:
        await asyncio.sleep(0.01)
        if kind == "report":
            report(value)
        elif kind == "unavailable":
            raise EngineUnavailable(value)
        elif kind == "unpicklable":
            raise _Unpicklable(value)
        return (value, client.most)
    finally:
        client.running -= 1


class _Unpicklable(Exception):
    def __init__(self, value):
        super().__init__(value)
        self.handle = lambda: value  # a lambda does not pickle


def _receive_all(client: ClientProcess, n: int) -> tuple[dict, list]:
    results, reports = {}, []
    while len(results) < n:
        done, reported = client.receive()
        results.update(done)
        reports.extend(reported)
    return results, reports


def test_every_job_comes_back_once_under_the_limit_with_reports_and_exceptions():
    client = ClientProcess(_open, _call)
    try:
        client.send(3, [(i, ("value", i)) for i in range(20)])  # 17 wait in the child
        client.send(3, [(20, ("report", "429")), (21, ("unavailable", "server gone")),
                        (22, ("unpicklable", "odd"))])
        results, reports = _receive_all(client, 23)
    finally:
        client.close()
    assert sorted(results) == list(range(23))
    assert all(results[i][0] == i and results[i][1] <= 3 for i in range(20))  # never more than 3 at once
    assert client.peak == 3 and reports == ["429"]
    assert isinstance(results[21], EngineUnavailable) and str(results[21]) == "server gone"
    assert isinstance(results[22], ClientProcessError) and "_Unpicklable: odd" in str(results[22])
    assert not client.process.is_alive()


def test_the_child_holds_none_of_the_parents_sockets():
    """A server socket of this process (a stub in a test, say), closed here, is closed: the child's copy from the
    fork would otherwise keep it listening, and connections to it would hang instead of being refused."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = ClientProcess(_open, _call)
    try:
        client.send(1, [(0, ("value", 0))])
        _receive_all(client, 1)  # the child is up and has closed what it inherited
        listener.close()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", port), timeout=5)
    finally:
        client.close()


# The head of the scripts below, which run a ClientProcess in a Python of their own: a client with nothing to close.
IDLE_CLIENT = textwrap.dedent("""
    import asyncio, os, signal, sys
    from rsgen import interrupt
    from rsgen.engine.client_process import ClientProcess

    class Client:
        async def close(self):
            pass

    async def open_client():
        return Client()
""")


def test_the_child_ends_when_its_parent_is_killed():
    script = IDLE_CLIENT + textwrap.dedent("""
        async def call(client, job, report):
            await asyncio.sleep(3600)

        client = ClientProcess(open_client, call)
        client.send(1, [(0, None)])
        print(client.process.pid, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"  # a zombie has ended (its parent, init, reaps it)
    except FileNotFoundError:
        return False
    except IndexError:
        return os.path.exists(f"/proc/{pid}")


def test_a_sigterm_during_the_fork_is_raised_not_lost():
    """A SIGTERM that lands while the client process is forked runs the stage's handler inside an at-fork hook
    (logging's lock release), where an exception is printed and dropped: CI saw a SIGTERMed run go on to the end.
    Here a hook of the test's own sends the signal at that moment; the stage must still be interrupted."""
    script = IDLE_CLIENT + textwrap.dedent("""
        def hook():
            os.kill(os.getpid(), signal.SIGTERM)
            sum(range(10000))  # Python code in the hook: the handler runs here

        async def call(client, job, report):
            return job

        os.register_at_fork(after_in_parent=hook)
        with interrupt.interruptible():
            try:
                ClientProcess(open_client, call).close()
                print("not interrupted")
            except interrupt.Interrupted:
                print("interrupted")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "interrupted", out.stdout + out.stderr
