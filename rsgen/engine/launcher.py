"""Whether the serving command `engine_server` names is installed here: checked before any work (rsgen.engine's
check_engine), apart from `rsgen.engine.server`, which starts it and reads the recipe's engine specs."""

from __future__ import annotations

import importlib.util
import shutil

from rsgen.config import RecipeError


def command_serves_under_its_path(command: list | None) -> bool:
    """A custom command that does not name the served model serves it under the path it was given."""
    return command is not None and not any("{served_name}" in str(arg) for arg in command)


def check_launcher(server: str, command: list | None = None) -> None:
    """The serving command of `server` (or `engine_server_command`) can be run here (checked before any work)."""
    if command:
        program = str(command[0])
        if shutil.which(program) is None:
            raise RecipeError(f"engine_server_command starts with {program!r}, which is not an executable here "
                              "(give its full path, e.g. /opt/vllm-env/bin/vllm, or a launcher on PATH: docker, "
                              "apptainer, srun)")
        return
    if server == "vllm":
        ok = shutil.which("vllm") is not None
        fix = ("pip install vllm, or set engine_server_command to the command that starts it (a vLLM in its own "
               "virtual environment, a container, srun), e.g. [/opt/vllm-env/bin/vllm, serve, '{model}', --host, "
               "'{host}', --port, '{port}', --generation-config, vllm]")
    elif server == "sglang":
        ok, fix = importlib.util.find_spec("sglang") is not None, "pip install 'sglang[all]'"
    elif server == "transformers":
        ok = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
        fix = "pip install 'rsgen[serve]'"
    else:
        raise RecipeError(f"engine_server must be vllm, sglang or transformers, got {server!r}")
    if not ok:
        raise RecipeError(f"engine_server: {server} needs its serving package, which is not installed here: {fix} "
                          "(or start the server yourself and set engine_server: null)")
