"""Servers rsgen starts itself (`engine_server: vllm | sglang | transformers`) and stops at the end.

`serving(recipe, state, roles)` wraps the stages of a run: on each machine its local main process launches the
serving command for every model the run asks a server for (the generator's, and the judge's when it is another
model at another URL), at the host and port of that role's `engine_base_url`, with its output in
OUTPUT_DIR/work/server.log; every process then waits for the server's health endpoint and checks that it serves the
model (`GET /v1/models`) before any work. The server is stopped when the block ends: at the end of the run, on an
error, and on SIGTERM/SIGINT (which rsgen turns into an exception, rsgen.interrupt). The server runs in a process
group of its own, stopped as a whole (vLLM's workers included), and is told to die with rsgen (Linux's parent-death
signal) should rsgen itself be killed outright.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from rsgen.config import RecipeError
from rsgen.engine.launcher import check_launcher  # noqa: F401 (the check, where the servers are)
from rsgen.layout import OutputLayout

logger = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 3600.0  # a first start may download the weights; a server that dies is noticed at once
STOP_GRACE_SECONDS = 30.0
LOG_TAIL_LINES = 15
LOCAL_HOSTS = ("127.0.0.1", "localhost", "0.0.0.0", "::1", "[::1]")


def serve_command(server: str, model_path: str, served_name: str, host: str, port: int,
                  extra_args: list[str]) -> list[str]:
    """The command that serves `model_path` under `served_name` at host:port. Every command keeps the server from
    applying the model's own sampling defaults (generation_config.json), so that requests alone decide decoding."""
    extra = [str(a) for a in extra_args]
    if server == "vllm":
        return ["vllm", "serve", model_path, "--served-model-name", served_name, "--host", host, "--port", str(port),
                "--generation-config", "vllm", *extra]
    if server == "sglang":
        return [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path, "--served-model-name",
                served_name, "--host", host, "--port", str(port), *extra]
    if server == "transformers":
        # `transformers serve` names the model by the path it was given (rsgen asks for that name).
        return [sys.executable, "-m", "transformers.cli.transformers", "serve", model_path, "--host", host,
                "--port", str(port), *extra]
    raise RecipeError(f"engine_server must be vllm, sglang or transformers, got {server!r}")


def custom_command(command: list, model_path: str, served_name: str, host: str, port: int) -> list[str]:
    """`engine_server_command` with its placeholders filled in ({model}, {served_name}, {host}, {port})."""
    values = {"model": model_path, "served_name": served_name, "host": host, "port": str(port)}
    return [str(arg).format(**values) for arg in command]


@dataclass(frozen=True)
class ServerPlan:
    """One server to start: which model, where, and under which name requests ask for it."""

    model_path: str
    served_name: str
    base_url: str

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.base_url)
        host = parts.hostname or "127.0.0.1"
        if host not in LOCAL_HOSTS:
            raise RecipeError(f"engine_server starts the server on this machine, but engine_base_url {self.base_url!r}"
                              " names another host; use http://127.0.0.1:PORT/v1 (or engine_server: null to use a "
                              "server elsewhere)")
        return ("0.0.0.0" if host == "0.0.0.0" else "127.0.0.1"), parts.port or 80

    @property
    def root(self) -> str:
        """The server's root URL (the health endpoint lives beside /v1)."""
        parts = urlsplit(self.base_url)
        return f"{parts.scheme}://{parts.netloc}"


def server_plans(recipe, roles: tuple[str, ...]) -> list[ServerPlan]:
    """The servers the roles need, one per distinct URL (the judge's is the generator's when they share the model
    and the URL). rsgen starts one server per URL on each machine; several servers per machine (several URLs) are
    for the user to start, with engine_server: null."""
    from rsgen.engine import engine_spec

    plans: dict[str, ServerPlan] = {}
    for role in roles:
        spec = engine_spec(recipe, role)
        if len(spec.base_urls) != 1:
            raise RecipeError(f"engine_server starts one server per machine, but the {role} role has "
                              f"{len(spec.base_urls)} URLs; give one URL (each machine of a multi-node run starts its "
                              "own), or start the servers yourself and set engine_server: null")
        url = spec.base_urls[0].rstrip("/")
        plan = ServerPlan(spec.model_path, spec.served_model, url)
        other = plans.get(url)
        if other is not None and other.served_name != plan.served_name:
            raise RecipeError(f"the generator ({other.served_name!r}) and the judge ({plan.served_name!r}) would share "
                              f"the server at {url}; set engine_judge_base_url to another port so that rsgen starts a "
                              "second server for the judge")
        plans[url] = plan
    return list(plans.values())


def _die_with_parent() -> None:
    """In the server's process (before exec): SIGTERM it when rsgen dies, even by SIGKILL (Linux only)."""
    try:
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


class ManagedServer:
    """A serving process rsgen started: its own process group, its output appended to a log file."""

    def __init__(self, plan: ServerPlan, server: str, extra_args: list[str], log_path: Path,
                 command: list | None = None):
        self.plan = plan
        host, port = plan.host_port
        if command:
            self.command = custom_command(command, plan.model_path, plan.served_name, host, port) + \
                [str(a) for a in extra_args]
        else:
            self.command = serve_command(server, plan.model_path, plan.served_name, host, port, extra_args)
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "ab") as log:
            log.write(f"\n== rsgen starts: {' '.join(self.command)}\n".encode())
            log.flush()
            try:
                self.process = subprocess.Popen(
                    self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True, preexec_fn=_die_with_parent if sys.platform == "linux" else None,
                )
            except (FileNotFoundError, PermissionError) as err:
                raise RecipeError(f"cannot start {' '.join(self.command[:3])}: {err.strerror}; install the server, "
                                  "set engine_server_command (see docs/engines.md) or set engine_server: null") from None
        logger.info("started %s (pid %d) at %s; its log: %s", server, self.process.pid, plan.base_url, log_path)

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return " | ".join(line.strip() for line in lines[-LOG_TAIL_LINES:] if line.strip())

    def stop(self) -> None:
        """SIGTERM to the whole process group, SIGKILL after a grace period."""
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        logger.info("stopped the server at %s (pid %d)", self.plan.base_url, self.process.pid)


def wait_until_healthy(root: str, process: subprocess.Popen | None = None, describe=lambda: "",
                       timeout: float = START_TIMEOUT_SECONDS) -> None:
    """Poll GET {root}/health until it answers 200. With the `process` rsgen started, its exit is an error carrying
    the end of its log (`describe()`)."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise RecipeError(f"the server for {root} exited with code {process.returncode} before it answered; "
                              f"end of its log: {describe()}")
        try:
            with urllib.request.urlopen(root + "/health", timeout=5) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, OSError):  # not listening yet, or loading
            pass
        if time.monotonic() > deadline:
            raise RecipeError(f"the server at {root} did not answer {root}/health within {timeout:.0f} s; "
                              f"end of its log: {describe()}")
        time.sleep(0.5)


@contextlib.contextmanager
def serving(recipe, state, roles: tuple[str, ...]) -> Iterator[None]:
    """Start the servers the roles need (local main process of each machine), wait until every one is healthy and
    serves its model, run the block, stop them — on success, error or interruption alike. A no-op unless the
    recipe sets `engine: openai` with an `engine_server`."""
    if recipe.engine != "openai" or not recipe.engine_server or not roles:
        yield
        return
    from rsgen.engine.openai_engine import check_servers

    plans = server_plans(recipe, roles)
    started: list[ManagedServer] = []
    try:
        if state.is_local_main_process:
            log = OutputLayout(recipe.output_dir).work / "server.log"
            for plan in plans:
                started.append(ManagedServer(plan, recipe.engine_server, recipe.engine_server_args, log,
                                             recipe.engine_server_command))
        for plan in plans:
            own = next((s for s in started if s.plan == plan), None)
            wait_until_healthy(plan.root, own.process if own else None, own.log_tail if own else (lambda: ""))
            check_servers([plan.base_url], plan.served_name, None)
        logger.info("server(s) ready: %s", ", ".join(p.base_url for p in plans))
        yield
    finally:
        for server in started:
            server.stop()
