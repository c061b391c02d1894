"""`engine: openai` end to end against a REAL `transformers serve` on 127.0.0.1 (CPU): a tiny LLaVA from the test
zoo as the generator, a tiny text-only LM as the judge, each served by its own `transformers serve`.

The pool is built so that both sides of the comparison have rows: a first `engine: transformers` pass over it
tells what the model answers, and half of the questions get that answer as their official one. The whole pipeline
with `engine: openai` must then give the same prepared pool and the same accepted, rejected and `_sft` rows as
`engine: transformers` — and the same after a SIGKILL, after the server went away mid-run, and never with the API
key anywhere in OUTPUT_DIR or the output.

Server-side defaults: the requests pin temperature 0 and top_p 1, and `frequency_penalty: 0`, which
`transformers serve` turns into `repetition_penalty: 1.0` (the transformers engine resets the model's own
repetition penalty the same way); nothing else of the server's defaults had to be pinned for equal rows.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_helpers
import yaml
from run_helpers import dataset_rows, finish, parquet_rows

from rsgen.engine.server import wait_until_healthy
from rsgen.testing.images import make_test_image
from rsgen.testing.stub_server import free_port

pytestmark = pytest.mark.slow

SECRET = "sk-rsgen-test-3f9a1c77e2"
KEY_ENV = "RSGEN_TEST_SERVER_KEY"
QUESTIONS = ("How many objects are there?", "What colour is the largest shape?", "Is there a disc? Say yes or no.")


# ---------------------------------------------------------------------- servers and runs


class Served:
    """A `transformers serve` of one model directory on a free port of 127.0.0.1, started by the test."""

    def __init__(self, model_dir: str, log: Path, extra: tuple[str, ...] = ()):
        self.model_dir, self.log, self.extra = model_dir, log, extra
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.process: subprocess.Popen | None = None

    def start(self) -> Served:
        cmd = [sys.executable, "-m", "transformers.cli.transformers", "serve", self.model_dir, "--device", "cpu",
               "--host", "127.0.0.1", "--port", str(self.port), *self.extra]
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                            env={**os.environ, "OMP_NUM_THREADS": "1"})
        return self

    def wait(self) -> Served:
        wait_until_healthy(f"http://127.0.0.1:{self.port}", self.process, lambda: self.log.read_text()[-2000:], 300)
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=60)
        self.process = None


def write_pool(path: Path, answers: dict[str, str] | None = None, long_question: bool = False) -> Path:
    """A local parquet pool: 6 drawn images x 3 questions; `answers` by question id (default "zzz", which the
    random model never says)."""
    import datasets

    rows = {"image": [], "question": [], "answer": [], "qid": []}
    for i in range(6):
        for j, question in enumerate(QUESTIONS):
            qid = f"img{i}-q{j}"
            if long_question and (i, j) == (0, 0):
                question = "Describe every object in full detail please. " * 40  # longer than the server allows
            rows["image"].append(make_test_image(100 + i))
            rows["question"].append(question)
            rows["answer"].append((answers or {}).get(qid, "zzz"))
            rows["qid"].append(qid)
    features = datasets.Features(image=datasets.Image(), question=datasets.Value("string"),
                                 answer=datasets.Value("string"), qid=datasets.Value("string"))
    datasets.Dataset.from_dict(rows, features=features).to_parquet(str(path))
    return path


def write_recipe(tmp: Path, name: str, pool: Path, vlm: str, judge_model: str, **overrides) -> Path:
    recipe = {
        "model_name_or_path": vlm,
        "judge_model_name_or_path": judge_model,
        "output_dir": str(tmp / name),
        "sources": [{"data_files": [str(pool)], "family": "Toy", "source_id_column": "qid"}],
        "max_new_tokens": 24,
        "judge_max_new_tokens": 16,
        "verifier": "exact",
        "judge_calibration_size": 3,
        "judge_min_specificity": 0.0,
        "checkpoint_every_items": 2,
        "prepare_num_proc": 1,
        **overrides,
    }
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def rsgen(*args: str, extra_env: dict | None = None) -> subprocess.Popen:
    return run_helpers.rsgen(*args, env={"OMP_NUM_THREADS": "1", **(extra_env or {})})


def prepared_rows(output_dir: Path) -> list[str]:
    return parquet_rows(sorted((output_dir / "prepared").glob("*.parquet")))


def records(directory: Path) -> list[dict]:
    return [json.loads(line) for part in sorted(directory.glob("*.jsonl")) for line in part.read_text().splitlines()]


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def models(tiny_vlm_factory, tmp_path_factory):
    from rsgen.testing.zoo import build_tiny_text_lm

    return tiny_vlm_factory("llava"), build_tiny_text_lm(tmp_path_factory.mktemp("judge-lm"))


@pytest.fixture(scope="module")
def servers(models, tmp_path_factory):
    logs = tmp_path_factory.mktemp("serve-logs")
    vlm, judge = models
    generator, judging = Served(vlm, logs / "vlm.log").start(), Served(judge, logs / "judge.log").start()
    try:
        yield generator.wait(), judging.wait()
    finally:
        generator.stop()
        judging.stop()


@pytest.fixture(scope="module")
def reference(models, tmp_path_factory):
    """The pool (half of its answers what the model says) and the `engine: transformers` run over it."""
    tmp = tmp_path_factory.mktemp("openai-e2e")
    vlm, judge = models
    probe = write_recipe(tmp, "probe", write_pool(tmp / "probe.parquet"), vlm, judge, judge=False)
    finish(rsgen("prepare", "--config", str(probe)))
    finish(rsgen("generate", "--config", str(probe)))
    from rsgen.schema import load_prepared

    source_id = {qa["id"]: qa["source_row_id"] for row in load_prepared(tmp / "probe") for qa in row["qa"]}
    said = {source_id[rec["id"]]: rec["extracted"] for rec in records(tmp / "probe" / "work" / "generate")
            if rec["extracted"]}
    chosen = dict(sorted(said.items())[::2])  # half of what the model answers becomes the official answer
    assert chosen, "the model extracted no answer at all"
    pool = write_pool(tmp / "pool.parquet", chosen)
    recipe = write_recipe(tmp, "transformers", pool, vlm, judge)
    finish(rsgen("run", "--config", str(recipe)))
    rows = dataset_rows(tmp / "transformers")
    stats = json.loads((tmp / "transformers" / "stats.json").read_text())
    assert stats["totals"]["accepted_qa"] > 0 and stats["totals"]["rejected_qa"] > 0, stats["totals"]
    assert any(name.endswith("_sft") and r for name, r in rows.items())
    return tmp, pool, rows


def openai_recipe(reference, servers, models, name: str, **overrides) -> Path:
    tmp, pool, _ = reference
    generator, judging = servers
    vlm, judge = models
    keys = {"engine": "openai", "engine_base_url": generator.base_url, "engine_judge_base_url": judging.base_url,
            "engine_max_retries": 2, **overrides}
    return write_recipe(tmp, name, pool, vlm, judge, **keys)


# ---------------------------------------------------------------------- tests


def test_same_rows_as_the_transformers_engine_and_the_key_is_never_written(reference, servers, models):
    tmp, _, rows = reference
    recipe = openai_recipe(reference, servers, models, "openai", engine_api_key_env=KEY_ENV)
    out = finish(rsgen("run", "--config", str(recipe), extra_env={KEY_ENV: SECRET}))
    assert prepared_rows(tmp / "openai") == prepared_rows(tmp / "transformers")
    assert dataset_rows(tmp / "openai") == rows
    stats = json.loads((tmp / "openai" / "stats.json").read_text())
    reference_stats = json.loads((tmp / "transformers" / "stats.json").read_text())
    assert stats["families"]["Toy"]["tokens"] == reference_stats["families"]["Toy"]["tokens"]  # usage = real counts
    # The key: in no file of OUTPUT_DIR (run.json holds the variable's name only), not in the output.
    assert SECRET not in out
    for path in (tmp / "openai").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    assert json.loads((tmp / "openai" / "run.json").read_text())["recipe"]["engine_api_key_env"] == KEY_ENV


def test_sigkill_in_generate_then_rerun_gives_the_same_rows(reference, servers, models):
    tmp, _, rows = reference
    recipe = openai_recipe(reference, servers, models, "killed", engine_max_concurrency=2)
    proc = rsgen("run", "--config", str(recipe))
    work = tmp / "killed" / "work" / "generate"
    while proc.poll() is None and not any(work.glob("*.jsonl")):
        time.sleep(0.02)
    assert proc.poll() is None, "generate ended before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 0 < len(records(work)) < 18
    finish(rsgen("run", "--config", str(recipe)))
    assert dataset_rows(tmp / "killed") == rows


def test_server_gone_mid_run_is_one_line_keeps_the_records_and_the_rerun_is_identical(reference, servers, models):
    tmp, _, rows = reference
    generator, _ = servers
    recipe = openai_recipe(reference, servers, models, "gone", engine_max_concurrency=1)
    proc = rsgen("run", "--config", str(recipe))
    work = tmp / "gone" / "work" / "generate"
    try:
        while proc.poll() is None and not any(work.glob("*.jsonl")):
            time.sleep(0.02)
        generator.stop()
        out = finish(proc, code=1)
        on_disk = len(records(work))
    finally:
        generator.start().wait()
    errors = [line for line in out.splitlines() if line.startswith("rsgen: error:")]
    assert len(errors) == 1 and generator.base_url in errors[0] and "rerun the same command" in errors[0], out[-3000:]
    assert "Traceback" not in out and 0 < on_disk < 18
    finish(rsgen("run", "--config", str(recipe)))
    assert dataset_rows(tmp / "gone") == rows


def test_wrong_url_or_model_is_exit_2_before_prepare(reference, servers, models):
    tmp, _, _ = reference
    generator, _ = servers
    vlm, _ = models
    nowhere = f"http://127.0.0.1:{free_port()}/v1"
    recipe = openai_recipe(reference, servers, models, "wrong_url", engine_base_url=nowhere)
    out = finish(rsgen("run", "--config", str(recipe)), code=2)
    assert f"engine server {nowhere} is unreachable" in out and not (tmp / "wrong_url" / "prepared").exists()
    recipe = openai_recipe(reference, servers, models, "wrong_model", model_name_or_path="org/not-served")
    out = finish(rsgen("run", "--config", str(recipe)), code=2)
    assert f"engine server {generator.base_url} does not serve model 'org/not-served'; it serves '{vlm}'" in out
    assert not (tmp / "wrong_model" / "prepared").exists()


def test_rsgen_starts_and_stops_transformers_serve_and_a_400_is_a_recorded_drop(reference, models):
    """engine_server: transformers — rsgen starts the server (its log in work/server.log), uses it and stops it;
    `--max-model-len` makes the server refuse the one long question with a 400: a counted drop with its reason and
    the server's message."""
    tmp, _, _ = reference
    vlm, judge = models
    pool = write_pool(tmp / "long.parquet", long_question=True)
    port = free_port()
    recipe = write_recipe(tmp, "managed", pool, vlm, judge, engine="openai", judge=False,
                          engine_base_url=f"http://127.0.0.1:{port}/v1", engine_server="transformers",
                          engine_server_args=["--device", "cpu", "--max-model-len", "200"])
    out = finish(rsgen("run", "--config", str(recipe)))
    log = (tmp / "managed" / "work" / "server.log").read_text()
    assert "rsgen starts:" in log and "Uvicorn running" in log
    assert not _listening(port), "the server outlived the run"
    refused = [r for r in records(tmp / "managed" / "work" / "generate") if r["reason"] == "request_refused"]
    assert len(refused) == 1 and refused[0]["question"].startswith("Describe every object")
    assert refused[0]["refused"].startswith("HTTP 400:") and "200" in refused[0]["refused"]
    stats = json.loads((tmp / "managed" / "stats.json").read_text())
    fam = stats["families"]["Toy"]
    assert fam["rejected_reasons"]["request_refused"] == 1
    assert fam["accepted_qa"] + fam["rejected_qa"] == fam["prepared_qa"] == 18  # nothing lost
    assert "refused request" in out


def test_rsgen_stops_the_server_it_started_on_sigterm(reference, models):
    tmp, pool, _ = reference
    vlm, judge = models
    port = free_port()
    recipe = write_recipe(tmp, "sigterm", pool, vlm, judge, engine="openai", engine_server="transformers", judge=False,
                          engine_base_url=f"http://127.0.0.1:{port}/v1", engine_server_args=["--device", "cpu"],
                          engine_max_concurrency=1, max_new_tokens=64)
    proc = rsgen("run", "--config", str(recipe))
    while proc.poll() is None and not (_listening(port) and (tmp / "sigterm" / "prepared").exists()):
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal"
    os.kill(proc.pid, signal.SIGTERM)
    out = finish(proc, code=128 + signal.SIGTERM)
    assert "interrupted; rerun the same command" in out
    assert not _listening(port), "the server outlived rsgen's SIGTERM"


def _listening(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_two_processes_each_their_own_client_give_the_same_rows(reference, servers, models):
    """`accelerate launch` with the server engine: each rank is a client of the same server, keys striped."""
    tmp, _, rows = reference
    recipe = openai_recipe(reference, servers, models, "two_procs")
    proc = run_helpers.rsgen("run", "--config", str(recipe), processes=2, port=free_port(),
                             env={"OMP_NUM_THREADS": "1"})
    finish(proc)
    ranks = {part.name.split("-rank")[1][:5] for part in (tmp / "two_procs" / "work" / "generate").glob("*.jsonl")}
    assert ranks == {"00000", "00001"}  # both ranks asked the server
    assert dataset_rows(tmp / "two_procs") == rows


def test_explore_samples_through_the_server_are_the_same_on_a_rerun(reference, servers, models):
    """Sampling sends one request per sample key with a seed of that key: two runs draw the same samples."""
    tmp, _, _ = reference
    drawn = []
    for name in ("explore_a", "explore_b"):
        recipe = openai_recipe(reference, servers, models, name, judge=False, explore_samples=2,
                               explore_stop="never", explore_temperature=1.0)
        finish(rsgen("run", "--config", str(recipe)))
        drawn.append({r["key"]: r["response"] for r in records(tmp / name / "work" / "explore")})
    assert len(drawn[0]) == 36 and drawn[0] == drawn[1]
    by_question: dict[str, set[str]] = {}
    for key, response in drawn[0].items():
        by_question.setdefault(key.split("#")[0], set()).add(response)
    assert any(len(responses) > 1 for responses in by_question.values())  # each sample key its own seed
