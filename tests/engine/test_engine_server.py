"""Servers rsgen starts itself (rsgen.engine.server): the commands, which servers a run needs, and the lifetime
(started, healthy, checked, stopped on success and on error) with the STUB server's process standing in for the
serving command (the real `transformers serve` lifetime, SIGTERM included, is tested in test_openai_server.py)."""

from __future__ import annotations

import shutil
import socket
import sys
from types import SimpleNamespace

import pytest

from rsgen.config import RecipeConfig, RecipeError
from rsgen.engine import server as server_module
from rsgen.engine.launcher import check_launcher
from rsgen.engine.server import serve_command, server_plans, serving
from rsgen.testing.stub_server import STUB_MODEL, free_port


def test_commands_serve_the_model_under_its_recipe_name_without_its_sampling_defaults():
    vllm = serve_command("vllm", "/m", "org/m", "127.0.0.1", 8000, ["--data-parallel-size", 8])
    assert vllm[:3] == ["vllm", "serve", "/m"] and vllm[-2:] == ["--data-parallel-size", "8"]
    assert "--served-model-name" in vllm and vllm[vllm.index("--generation-config") + 1] == "vllm"
    sglang = serve_command("sglang", "/m", "org/m", "127.0.0.1", 8000, [])
    assert sglang[1:3] == ["-m", "sglang.launch_server"] and sglang[sglang.index("--served-model-name") + 1] == "org/m"
    hf = serve_command("transformers", "/m", "/m", "0.0.0.0", 9, [])
    assert hf[3:5] == ["serve", "/m"] and hf[hf.index("--host") + 1] == "0.0.0.0"


def _recipe(**keys) -> RecipeConfig:
    return RecipeConfig(engine="openai", engine_server="vllm", model_name_or_path="org/vlm", **keys)


def test_one_server_per_url_and_a_judge_of_another_model_needs_its_own_port():
    (plan,) = server_plans(_recipe(engine_base_url=["http://127.0.0.1:8000/v1"]), ("generate", "judge"))
    assert (plan.served_name, plan.host_port) == ("org/vlm", ("127.0.0.1", 8000))
    with pytest.raises(RecipeError, match="set engine_judge_base_url to another port"):
        server_plans(_recipe(judge_model_name_or_path="org/judge"), ("generate", "judge"))
    plans = server_plans(_recipe(judge_model_name_or_path="org/judge", engine_judge_base_url=["http://127.0.0.1:8001/v1"]),
                         ("generate", "judge"))
    assert [p.served_name for p in plans] == ["org/vlm", "org/judge"]
    with pytest.raises(RecipeError, match="names another host"):
        _ = server_plans(_recipe(engine_base_url=["http://gpu-node-7:8000/v1"]), ("generate",))[0].host_port
    with pytest.raises(RecipeError, match="has 2 URLs"):
        server_plans(_recipe(engine_base_url=["http://127.0.0.1:1/v1", "http://127.0.0.1:2/v1"]), ("generate",))


def test_a_missing_serving_package_is_named_before_any_work():
    if shutil.which("vllm") is None:
        with pytest.raises(RecipeError, match="pip install vllm"):
            check_launcher("vllm")
    check_launcher("transformers")  # fastapi and uvicorn come with rsgen[serve] (in [dev])


def _stub_command(server, model_path, served_name, host, port, extra):
    return [sys.executable, "-m", "rsgen.testing.stub_server", "--port", str(port)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


STATE = SimpleNamespace(is_local_main_process=True)


@pytest.mark.slow  # starts a process
def test_serving_starts_checks_and_stops_the_server_also_on_error(tmp_path, monkeypatch):
    monkeypatch.setattr(server_module, "serve_command", _stub_command)
    port = free_port()
    recipe = RecipeConfig(engine="openai", engine_server="transformers", model_name_or_path=STUB_MODEL,
                          engine_base_url=[f"http://127.0.0.1:{port}/v1"], output_dir=str(tmp_path))
    monkeypatch.setattr(server_module, "server_plans", lambda recipe, roles: [
        server_module.ServerPlan(STUB_MODEL, STUB_MODEL, f"http://127.0.0.1:{port}/v1")])
    with serving(recipe, STATE, ("generate",)):
        assert _listening(port)
    assert not _listening(port)
    assert "rsgen starts:" in (tmp_path / "work" / "server.log").read_text()
    with pytest.raises(RuntimeError, match="a stage failed"):
        with serving(recipe, STATE, ("generate",)):
            raise RuntimeError("a stage failed")
    assert not _listening(port)


@pytest.mark.slow  # starts a process
def test_a_server_that_exits_at_start_is_one_line_with_the_end_of_its_log(tmp_path, monkeypatch):
    monkeypatch.setattr(server_module, "serve_command",
                        lambda *a: [sys.executable, "-c", "import sys; print('CUDA out of memory at load'); sys.exit(3)"])
    recipe = RecipeConfig(engine="openai", engine_server="transformers", model_name_or_path="m",
                          engine_base_url=[f"http://127.0.0.1:{free_port()}/v1"], output_dir=str(tmp_path), judge=False)
    with pytest.raises(RecipeError, match="exited with code 3 before it answered; end of its log: .*CUDA out of memory"):
        with serving(recipe, STATE, ("generate",)):
            pass


def test_serving_is_a_no_op_without_an_engine_server(tmp_path):
    with serving(RecipeConfig(output_dir=str(tmp_path)), STATE, ("generate", "judge")):
        pass
    assert not (tmp_path / "work").exists()


# ---------------------------------------------------------------------- engine_server_command


def test_without_vllm_on_path_one_line_names_both_ways(monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RecipeError) as info:
        check_launcher("vllm")
    message = str(info.value)
    assert "\n" not in message and "pip install vllm" in message and "engine_server_command" in message
    with pytest.raises(RecipeError, match="'/nowhere/vllm', which is not an executable here"):
        check_launcher("vllm", ["/nowhere/vllm", "serve", "{model}"])


def test_engine_server_command_is_checked_when_the_recipe_loads():
    from rsgen.config import recipe_from_dict

    base = {"engine": "openai", "model_name_or_path": "org/vlm", "engine_server": "vllm"}
    with pytest.raises(RecipeError, match="placeholder {gpu}; the placeholders are {model}, {served_name}"):
        recipe_from_dict({**base, "engine_server_command": ["vllm", "serve", "{model}", "--gpu", "{gpu}"]})
    with pytest.raises(RecipeError, match="set engine_server to the kind it starts"):
        recipe_from_dict({**base, "engine_server": None, "engine_server_command": ["vllm", "serve", "{model}"]})
    with pytest.raises(RecipeError, match="must be a non-empty list"):
        recipe_from_dict({**base, "engine_server_command": "vllm serve {model}"})


def test_a_command_without_served_name_serves_the_model_under_its_path():
    from rsgen.engine import engine_spec
    from rsgen.engine.models import resolve_model_path

    with_name = _recipe(engine_server_command=["v", "serve", "{model}", "--served-model-name", "{served_name}"])
    assert engine_spec(with_name, "generate").served_model == "org/vlm"
    without = _recipe(engine_server_command=["v", "serve", "{model}"])
    assert engine_spec(without, "generate").served_model == resolve_model_path("org/vlm")
    command = server_module.custom_command(["srun", "-N1", "v", "{model}", "--port={port}", "{host}"], "/m", "n",
                                           "127.0.0.1", 8123)
    assert command == ["srun", "-N1", "v", "/m", "--port=8123", "127.0.0.1"]


@pytest.mark.slow  # starts a process
def test_serving_runs_the_engine_server_command_with_its_placeholders(tmp_path):
    port = free_port()
    recipe = RecipeConfig(engine="openai", engine_server="vllm", model_name_or_path=STUB_MODEL,
                          engine_base_url=[f"http://127.0.0.1:{port}/v1"], output_dir=str(tmp_path), judge=False,
                          engine_server_command=[sys.executable, "-m", "rsgen.testing.stub_server", "--port", "{port}",
                                                 "--served-name", "{served_name}"])
    with serving(recipe, STATE, ("generate",)):
        assert _listening(port)
    assert not _listening(port)
    assert f"rsgen.testing.stub_server --port {port} --served-name {STUB_MODEL}" in \
        (tmp_path / "work" / "server.log").read_text()
