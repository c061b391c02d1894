"""prepare -> generate -> judge -> emit, with barriers between stages, on one process or under accelerate.

Each stage is resumable on its own (its outputs on disk say what is finished), so `run` is simply every stage
in order; a rerun redoes nothing finished. run.json pins what the finished work depends on: a rerun with a
recipe that changes any of it is refused instead of mixing results from two setups.
"""

from __future__ import annotations

import datetime as _dt
import importlib.metadata
import json
import os
from typing import Any

from accelerate import PartialState

from rsgen.config import RecipeConfig, RecipeError
from rsgen.emit import run_emit
from rsgen.engine import resolve_model_path
from rsgen.generate import run_generate
from rsgen.judge import run_judge
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.store import distributed_state

# Keys whose change invalidates finished work in an existing output directory.
PINNED_KEYS = (
    "model_name_or_path",
    "model_revision",
    "sources",
    "instruction",
    "enable_thinking",
    "chat_template_kwargs",
    "max_new_tokens",
    "temperature",
    "top_p",
    "num_samples",
    "seed",
    "verifier",
    "numeric_tolerance",
    "judge_model_name_or_path",
    "judge_chat_template_kwargs",
    "judge_prompt_file",
    "judge_max_new_tokens",
    "judge_calibration_size",
    "judge_calibration_seed",
    "max_image_pixels",
    "max_aspect_ratio",
)
PACKAGES = ("rsgen", "torch", "transformers", "accelerate", "datasets", "trl", "evaluate", "math-verify", "huggingface_hub")


def _package_versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def check_and_write_run_json(recipe: RecipeConfig, state: PartialState) -> None:
    """Refuse a recipe that contradicts finished work; record the resolved recipe and versions."""
    layout = OutputLayout(recipe.output_dir)
    pinned = {k: recipe.to_dict()[k] for k in PINNED_KEYS}
    previous: dict[str, Any] = {}
    if layout.run_json.exists():
        previous = json.loads(layout.run_json.read_text())
        old = previous.get("pinned", {})
        changed = [k for k in PINNED_KEYS if k in old and json.dumps(old[k], sort_keys=True) != json.dumps(pinned[k], sort_keys=True)]
        if changed:
            details = "; ".join(f"{k}: {old[k]!r} -> {pinned[k]!r}" for k in changed)
            raise RecipeError(
                f"output_dir {recipe.output_dir!r} holds work made with a different recipe ({details}). "
                "Use a new output_dir, or delete the old one to start over."
            )
    state.wait_for_everyone()
    if state.is_main_process:
        layout.root.mkdir(parents=True, exist_ok=True)
        run = {
            "pinned": pinned,
            "recipe": recipe.to_dict(),
            "packages": _package_versions(),
            "model_revision": _model_revision(recipe),
            "world_size": state.num_processes,
            "started_at": previous.get("started_at", _now()),
            "last_started_at": _now(),
            "finished_at": previous.get("finished_at"),
            "stages": previous.get("stages", {}),
        }
        _write_json(layout.run_json, run)
    state.wait_for_everyone()


def _model_revision(recipe: RecipeConfig) -> str | None:
    """The commit of a Hub model in the local cache, or the requested revision; None for local directories."""
    if recipe.model_revision:
        return recipe.model_revision
    path = resolve_model_path(recipe.model_name_or_path)
    if os.path.isdir(path):
        return None
    try:
        from huggingface_hub import snapshot_download

        snap = snapshot_download(path, local_files_only=True, allow_patterns=["config.json"])
        return os.path.basename(snap)
    except Exception:  # not cached yet: the loader resolves it when it downloads
        return None


def _write_json(path, data) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def _mark_stage(recipe: RecipeConfig, stage: str, started: str) -> None:
    layout = OutputLayout(recipe.output_dir)
    run = json.loads(layout.run_json.read_text())
    run.setdefault("stages", {})[stage] = {"started_at": started, "finished_at": _now()}
    if stage == "emit":
        run["finished_at"] = _now()
    _write_json(layout.run_json, run)


def run_stage(name: str, recipe: RecipeConfig, state: PartialState | None = None) -> None:
    state = state or distributed_state()
    if name == "prepare" or name == "generate":
        check_and_write_run_json(recipe, state)
    started = _now()
    if name == "prepare":
        # Prepare is cheap next to generation and writes shared files: the main process does it.
        if state.is_main_process:
            run_prepare(recipe)
    elif name == "generate":
        run_generate(recipe, state)
    elif name == "judge":
        run_judge(recipe, state)
    elif name == "emit":
        if state.is_main_process:
            run_emit(recipe)
    else:
        raise RecipeError(f"unknown stage {name!r}")
    state.wait_for_everyone()
    if state.is_main_process and OutputLayout(recipe.output_dir).run_json.exists():
        _mark_stage(recipe, name, started)
    state.wait_for_everyone()


def run_pipeline(recipe: RecipeConfig) -> None:
    state = distributed_state()
    if recipe.push_to_hub:
        # Fail before any model work when the upload cannot happen.
        from rsgen.emit.push import check_hub_access

        check_hub_access(recipe)
    check_and_write_run_json(recipe, state)
    for stage in ("prepare", "generate", "judge", "emit"):
        run_stage(stage, recipe, state)
