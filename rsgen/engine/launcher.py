"""Whether the serving command `engine_server` names is installed here: checked before any work (rsgen.engine's
check_engine), apart from `rsgen.engine.server`, which starts it and reads the recipe's engine specs."""

from __future__ import annotations

import importlib.util
import shutil

from rsgen.config import RecipeError


def check_launcher(server: str) -> None:
    """The serving command of `server` is installed here (checked before any work)."""
    if server == "vllm":
        ok, fix = shutil.which("vllm") is not None, "pip install vllm"
    elif server == "sglang":
        ok, fix = importlib.util.find_spec("sglang") is not None, "pip install 'sglang[all]'"
    elif server == "transformers":
        ok = all(importlib.util.find_spec(m) is not None for m in ("fastapi", "uvicorn"))
        fix = "pip install 'rsgen[serve]'"
    else:
        raise RecipeError(f"engine_server must be vllm, sglang or transformers, got {server!r}")
    if not ok:
        raise RecipeError(f"engine_server: {server} needs its serving package, which is not installed: {fix} "
                          "(or start the server yourself and set engine_server: null)")
