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
from rsgen.emit.stats import written_kinds
from rsgen.engine import check_engine, resolve_model_path
from rsgen.generate import run_generate
from rsgen.judge import run_judge
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.schema import prepared_shards
from rsgen.store import distributed_state

STAGES = ("prepare", "generate", "judge", "emit")

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


def check_output_dir(output_dir: str) -> None:
    """The output directory can be written (checked on the nearest existing folder; nothing is created)."""
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RecipeError(f"output_dir {output_dir!r} is a file, not a directory; set output_dir to a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise RecipeError(f"output_dir {output_dir!r} cannot be written ({existing!r} is not writable): set "
                          "output_dir to a folder you can write, or fix its permissions")


def check_before_work(recipe: RecipeConfig, stages: tuple[str, ...]) -> None:
    """What can be known wrong before any work, each a one-line RecipeError naming the value and the fix: the
    models of the stages to run (config only), the output directory, the prepared pool a later stage reads, the
    emitted views, the Hub access of a push. Creates nothing."""
    if "generate" in stages:
        check_engine(recipe, "generate")
    if "judge" in stages and recipe.judge:
        check_engine(recipe, "judge")
    check_output_dir(recipe.output_dir)
    if "prepare" not in stages and not prepared_shards(recipe.output_dir):
        prepared = OutputLayout(recipe.output_dir).prepared
        raise RecipeError(f"no prepared pool in {str(prepared)!r}: run `rsgen prepare --config RECIPE` first "
                          "(or check output_dir)")
    if "emit" in stages:
        written_kinds(recipe.views)
        if recipe.push_to_hub:
            from rsgen.emit.push import check_hub_access

            check_hub_access(recipe)


def run_stage(name: str, recipe: RecipeConfig, state: PartialState | None = None, checked: bool = False) -> None:
    if name not in STAGES:
        raise RecipeError(f"unknown stage {name!r}; choose one of {', '.join(STAGES)}")
    if not checked:
        check_before_work(recipe, (name,))
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
    state.wait_for_everyone()
    if state.is_main_process and OutputLayout(recipe.output_dir).run_json.exists():
        _mark_stage(recipe, name, started)
    state.wait_for_everyone()


def run_pipeline(recipe: RecipeConfig) -> None:
    check_before_work(recipe, STAGES)  # a wrong model or output_dir fails here, before prepare
    state = distributed_state()
    check_and_write_run_json(recipe, state)
    for stage in STAGES:
        run_stage(stage, recipe, state, checked=True)
