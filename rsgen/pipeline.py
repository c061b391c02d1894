"""prepare -> generate -> explore -> judge -> emit, with barriers between stages, on one process or under accelerate.

Each stage is resumable on its own (its outputs on disk say what is finished), so `run` is simply every stage
in order; a rerun redoes nothing finished. run.json pins, per stage, the keys that stage's work depends on: a
rerun that changes a key of a stage with work on disk is refused (it would mix results of two setups); a key
of a stage with no work yet may change, and the change is recorded in run.json.
"""

from __future__ import annotations

import contextlib
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
from rsgen.explore import run_explore
from rsgen.generate import run_generate
from rsgen.judge import run_judge
from rsgen.layout import OutputLayout
from rsgen.lock import locked_output_dir
from rsgen.prepare import check_prepare, run_prepare
from rsgen.schema import prepared_shards
from rsgen.store import distributed_state

# Explore runs before the judge: the judge grades the explore samples that need a verdict too.
STAGES = ("prepare", "generate", "explore", "judge", "emit")

# Per stage: the keys its work depends on, and what on disk shows that it has work. Generate records carry the
# verifier's decision, so the verifier keys belong to generate; the judge reads those decisions.
STAGE_PINS: dict[str, tuple[str, ...]] = {
    "prepare": ("sources", "instruction", "max_image_pixels", "max_aspect_ratio"),
    "generate": ("model_name_or_path", "engine", "model_revision", "torch_dtype", "enable_thinking",
                 "chat_template_kwargs", "max_new_tokens", "temperature", "top_p", "num_samples", "seed", "verifier",
                 "numeric_tolerance", "math_timeout_seconds"),
    "explore": ("explore_samples", "explore_temperature", "explore_top_p", "explore_stop"),
    "judge": ("judge_model_name_or_path", "judge_chat_template_kwargs", "judge_prompt_file", "judge_max_new_tokens",
              "judge_calibration_size", "judge_calibration_seed"),
}
PINNED_KEYS = tuple(key for keys in STAGE_PINS.values() for key in keys)


def stage_work(layout: OutputLayout) -> dict[str, Any]:
    """Per pinned stage, the path that holds its work, or None when it has none yet."""

    def nonempty(path):
        return path if path.is_dir() and any(path.iterdir()) else None

    return {
        "prepare": layout.prepared if layout.prepared.is_dir() else None,
        "generate": nonempty(layout.generate_work),
        "explore": nonempty(layout.explore_work),
        "judge": nonempty(layout.judge_work),
    }


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


def _same(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


def changed_fields(key: str, old: Any, new: Any) -> list[tuple[str, Any, Any]]:
    """(field, old, new) for each field that differs, looking inside `sources` (`sources[1].answer_column`)."""
    if _same(old, new):
        return []
    if key == "sources" and isinstance(old, list) and isinstance(new, list):
        out = []
        if len(old) != len(new):
            out.append(("sources (number of entries)", len(old), len(new)))
        for i, (a, b) in enumerate(zip(old, new)):
            if isinstance(a, dict) and isinstance(b, dict):
                out += [(f"sources[{i}].{f}", a.get(f), b.get(f)) for f in sorted(set(a) | set(b))
                        if not _same(a.get(f), b.get(f))]
            elif not _same(a, b):
                out.append((f"sources[{i}]", a, b))
        return out
    return [(key, old, new)]


def check_and_write_run_json(recipe: RecipeConfig, state: PartialState) -> None:
    """Refuse a recipe that contradicts work on disk; record the resolved recipe, versions and allowed changes."""
    layout = OutputLayout(recipe.output_dir)
    pinned = {k: recipe.to_dict()[k] for k in PINNED_KEYS}
    previous: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    if layout.run_json.exists():
        previous = json.loads(layout.run_json.read_text())
        old = previous.get("pinned", {})
        work = stage_work(layout)
        refused = []
        for stage, keys in STAGE_PINS.items():
            for key in keys:
                if key not in old:
                    continue
                for name, before, after in changed_fields(key, old[key], pinned[key]):
                    if work[stage] is not None:
                        refused.append(f"{name}: {before!r} -> {after!r} (the {stage} work in {work[stage]} "
                                       "was made with the old value)")
                    else:
                        changes.append({"key": name, "from": before, "to": after, "at": _now()})
        if refused:
            raise RecipeError(
                f"output_dir {recipe.output_dir!r} holds work that this recipe contradicts: " + "; ".join(refused)
                + ". Put the old values back, use a new output_dir, or delete the named work to redo that stage "
                "(and the stages after it)."
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
            # Keys changed while their stage had no work yet: allowed, and kept here.
            "recipe_changes": previous.get("recipe_changes", []) + changes,
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
    emitted views, the Hub access of a push, the sources prepare will read (files, declared columns). Creates
    nothing: a recipe error found here leaves the output_dir as it was."""
    if "generate" in stages:
        check_engine(recipe, "generate")
    if "explore" in stages and recipe.explore_samples:
        check_engine(recipe, "explore")
    if "judge" in stages and recipe.judge:
        check_engine(recipe, "judge")
    check_output_dir(recipe.output_dir)
    if "prepare" in stages:
        check_prepare(recipe)
    if "prepare" not in stages and not prepared_shards(recipe.output_dir):
        prepared = OutputLayout(recipe.output_dir).prepared
        raise RecipeError(f"no prepared pool in {str(prepared)!r}: run `rsgen prepare --config RECIPE` first "
                          "(or check output_dir)")
    if "emit" in stages:
        written_kinds(recipe.views, explore=recipe.explore_samples > 0)
        if recipe.push_to_hub:
            from rsgen.emit.push import check_hub_access

            check_hub_access(recipe)


@contextlib.contextmanager
def _left_as_it_was_on_recipe_error(recipe: RecipeConfig, state: PartialState):
    """A recipe error that left nothing but the run.json this run wrote (a JSON source without a named key, found as
    prepare reads it) takes back that run.json and the output_dir it created, so the corrected recipe starts there
    as on a fresh folder. (Errors found before the run starts never write anything: `check_before_work`.)"""
    layout = OutputLayout(recipe.output_dir)
    existed = layout.root.is_dir()
    before = {p.name for p in layout.root.iterdir()} if existed else set()
    try:
        yield
    except RecipeError:
        made = ({p.name for p in layout.root.iterdir()} if layout.root.is_dir() else set()) - before
        if state.is_main_process and made == {layout.run_json.name}:
            layout.run_json.unlink()
            if not existed:
                with contextlib.suppress(OSError):  # only when empty: nothing else is removed
                    layout.root.rmdir()
        raise


def run_stage(name: str, recipe: RecipeConfig, state: PartialState | None = None, checked: bool = False) -> None:
    if name not in STAGES:
        raise RecipeError(f"unknown stage {name!r}; choose one of {', '.join(STAGES)}")
    state = state or distributed_state()
    if checked:  # run_pipeline checked once for every stage and holds the output_dir lock
        _run_stage_work(name, recipe, state)
        return
    check_before_work(recipe, (name,))
    with _left_as_it_was_on_recipe_error(recipe, state), locked_output_dir(recipe.output_dir, state):
        # Every stage checks the recipe against the work on disk (emit writes what the work says).
        check_and_write_run_json(recipe, state)
        _run_stage_work(name, recipe, state)


def _run_stage_work(name: str, recipe: RecipeConfig, state: PartialState) -> None:
    started = _now()
    if name == "prepare":
        # Prepare is cheap next to generation and writes shared files: the main process does it.
        if state.is_main_process:
            run_prepare(recipe)
    elif name == "generate":
        run_generate(recipe, state)
    elif name == "explore":
        run_explore(recipe, state)
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
    with _left_as_it_was_on_recipe_error(recipe, state), locked_output_dir(recipe.output_dir, state):
        check_and_write_run_json(recipe, state)
        for stage in STAGES:
            if stage == "explore" and not recipe.explore_samples:
                continue  # off by default: not run, not recorded in run.json
            run_stage(stage, recipe, state, checked=True)
