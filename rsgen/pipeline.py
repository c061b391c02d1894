"""The pipeline: a list of stages (`STAGES`), run in order with barriers between them, on one process or under
accelerate.

Each stage is resumable on its own (its outputs on disk say what is finished), so `run` is simply every stage
in order; a rerun redoes nothing finished. run.json pins, per stage, the recipe keys that stage's work depends on
(the `pin` metadata of RecipeConfig's fields): a rerun that changes a key of a stage with work on disk is refused
(it would mix results of two setups); a key of a stage with no work yet may change, and the change is recorded
in run.json. Everything that walks the stages reads `STAGES`: adding a stage is one package and one entry here.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import importlib.metadata
import json
import logging
import os
import tempfile
from typing import TYPE_CHECKING, Any

from rsgen import blind, emit, explore, generate, judge, prepare, verify
from rsgen.config import RecipeConfig, RecipeError
from rsgen.engine.server import serving
from rsgen.layout import OutputLayout
from rsgen.lock import locked_output_dir, output_dir_errors, unwritable
from rsgen.stage import Stage
from rsgen.store.progress import progress_json, stage_progress

if TYPE_CHECKING:
    from accelerate import PartialState

logger = logging.getLogger(__name__)

# Verify decides the stored responses before anything reads a decision; explore runs before the judge: the judge
# grades the explore samples that need a verdict too.
STAGES: tuple[Stage, ...] = (prepare.STAGE, generate.STAGE, verify.STAGE, explore.STAGE, judge.STAGE,
                             blind.STAGE, emit.STAGE)



def stage_pins() -> dict[str, tuple[str, ...]]:
    """Per stage, the recipe keys its work depends on (stages without pins are left out). Read from STAGES when
    asked, so a stage added to the list is pinned like the others."""
    return {stage.name: stage.pins for stage in STAGES if stage.pins}


def stage_named(name: str) -> Stage:
    for stage in STAGES:
        if stage.name == name:
            return stage
    raise RecipeError(f"unknown stage {name!r}; choose one of {', '.join(s.name for s in STAGES)}")


def stage_work(layout: OutputLayout) -> dict[str, Any]:
    """Per stage, the path that holds its work, or None when it has none yet."""
    return {stage.name: stage.has_work(layout) for stage in STAGES}


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
    """(field, old, new) for each field that differs, looking inside lists of mappings (`sources[1].answer_column`)."""
    if _same(old, new):
        return []
    entries = [v for v in (old, new) if isinstance(v, list) and all(isinstance(e, dict) for e in v)]
    if len(entries) == 2:
        out = []
        if len(old) != len(new):
            out.append((f"{key} (number of entries)", len(old), len(new)))
        for i, (a, b) in enumerate(zip(old, new)):
            out += [(f"{key}[{i}].{f}", a.get(f), b.get(f)) for f in sorted(set(a) | set(b))
                    if not _same(a.get(f), b.get(f))]
        return out
    return [(key, old, new)]


def check_and_write_run_json(recipe: RecipeConfig, state: PartialState) -> None:
    """Refuse a recipe that contradicts work on disk; record the resolved recipe, versions and allowed changes."""
    layout = OutputLayout(recipe.output_dir)
    pins = stage_pins()
    values = recipe.to_dict()
    pinned = {key: values[key] for keys in pins.values() for key in keys}
    previous: dict[str, Any] = {}
    changes: list[dict[str, Any]] = []
    if layout.run_json.exists():
        previous = json.loads(layout.run_json.read_text())
        old = previous.get("pinned", {})
        work = stage_work(layout)
        if state.is_main_process:
            _log_resume(layout, work)
        refused = []
        for stage, keys in pins.items():
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
        with output_dir_errors(recipe.output_dir):
            layout.root.mkdir(parents=True, exist_ok=True)
        run = {
            "pinned": pinned,
            "recipe": values,
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
        with output_dir_errors(recipe.output_dir):  # the run's first file
            _write_json(layout.run_json, run)
    state.wait_for_everyone()


def _model_revision(recipe: RecipeConfig) -> str | None:
    """The commit of a Hub model in the local cache, or the requested revision; None for local directories."""
    if recipe.model_revision:
        return recipe.model_revision
    from rsgen.engine import resolve_model_path

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


def _log_resume(layout: OutputLayout, work: dict[str, Any]) -> None:
    """One line on what a rerun finds: the stages with work on disk (each resumes; what is finished is kept)."""
    done = [name for name, path in work.items() if path is not None]
    if done:
        logger.info(f"resuming in {layout.root}: work on disk from {', '.join(done)}; "
                    f"none yet from {', '.join(n for n in work if n not in done) or 'no other stage'}")


def _mark_stage(recipe: RecipeConfig, stage: Stage, started: str) -> None:
    layout = OutputLayout(recipe.output_dir)
    run = json.loads(layout.run_json.read_text())
    # `position`: where it stands in STAGES, so readers (stats.json's per-stage times) list stages in this order.
    run.setdefault("stages", {})[stage.name] = {"started_at": started, "finished_at": _now(),
                                                "position": STAGES.index(stage)}
    if stage is STAGES[-1]:  # the run is finished when its last stage is
        run["finished_at"] = _now()
    _write_json(layout.run_json, run)


def check_output_dir(output_dir: str) -> None:
    """The output directory can be written: tried, by making and removing a folder in the nearest existing one
    (`os.access` says yes to root where nothing can be made, e.g. under /proc). Leaves nothing behind."""
    path = os.path.abspath(output_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise RecipeError(f"output_dir {output_dir!r} is a file, not a directory; set output_dir to a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise RecipeError(f"output_dir {output_dir!r} cannot be written ({existing!r} is a file); set output_dir to "
                          "a folder you can write")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".rsgen-write-check-", dir=existing))
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        raise unwritable(output_dir, err, creating=f"a folder in {existing!r}") from None


def check_before_work(recipe: RecipeConfig, stages: tuple[Stage, ...]) -> None:
    """What can be known wrong before any work, each a one-line RecipeError naming the value and the fix: each
    stage's own pre-flight `check` (models, views, Hub access), the output directory, and the prepared pool when
    the run starts after the stage that writes it (every later stage reads it). Creates nothing."""
    for stage in stages:
        stage.check(recipe)
    check_output_dir(recipe.output_dir)
    if STAGES[0] not in stages:
        from rsgen.schema import prepared_shards  # deferred: pyarrow

        if not prepared_shards(recipe.output_dir):
            prepared = OutputLayout(recipe.output_dir).prepared
            raise RecipeError(f"no prepared pool in {str(prepared)!r}: run `rsgen {STAGES[0].name} --config RECIPE` "
                              "first (or check output_dir)")


def engine_roles(recipe: RecipeConfig, stages: tuple[Stage, ...]) -> tuple[str, ...]:
    """The engine roles the stages will use (each enabled stage that generates is a role of the same name)."""
    roles = {"generate": True, "explore": recipe.explore_samples > 0, "judge": recipe.judge}
    return tuple(stage.name for stage in stages if roles.get(stage.name, False))


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
        progress = progress_json(layout.root)  # written when the stage that found the error started
        if state.is_main_process and made - {progress.name} == {layout.run_json.name}:
            progress.unlink(missing_ok=True)
            layout.run_json.unlink()
            if not existed:
                with contextlib.suppress(OSError):  # only when empty: nothing else is removed
                    layout.root.rmdir()
        raise


def run_stage(name: str | Stage, recipe: RecipeConfig, state: PartialState | None = None,
              checked: bool = False) -> None:
    stage = name if isinstance(name, Stage) else stage_named(name)
    state = state or _distributed_state()
    if checked:  # run_pipeline checked once for every stage and holds the output_dir lock
        _run_stage_work(stage, recipe, state)
        return
    check_before_work(recipe, (stage,))
    with _left_as_it_was_on_recipe_error(recipe, state), locked_output_dir(recipe.output_dir, state), \
            serving(recipe, state, engine_roles(recipe, (stage,))):
        # Every stage checks the recipe against the work on disk (emit writes what the work says).
        check_and_write_run_json(recipe, state)
        _run_stage_work(stage, recipe, state)


def _run_stage_work(stage: Stage, recipe: RecipeConfig, state: PartialState) -> None:
    started = _now()
    with stage_progress(recipe.output_dir, stage.name, state, [s.name for s in STAGES if s.enabled(recipe)],
                        last_stage=stage is STAGES[-1], **_hub_progress(recipe)):
        if stage.every_process or state.is_main_process:
            stage.run(recipe, state)
        state.wait_for_everyone()
    if state.is_main_process and OutputLayout(recipe.output_dir).run_json.exists():
        _mark_stage(recipe, stage, started)
    state.wait_for_everyone()


def _hub_progress(recipe: RecipeConfig) -> dict[str, Any]:
    """With push_to_hub, the card's progress section pushed at most every hub_progress_every_minutes."""
    if not (recipe.push_to_hub and recipe.hub_progress_every_minutes > 0):
        return {}
    return {"hub_push": lambda section: emit.push_progress_section(recipe, section),
            "hub_every_seconds": 60.0 * recipe.hub_progress_every_minutes}


def run_pipeline(recipe: RecipeConfig) -> None:
    check_before_work(recipe, STAGES)  # a wrong model or output_dir fails here, before prepare
    state = _distributed_state()
    # A server rsgen starts itself (engine_server) answers before prepare and is stopped at the end, on error too.
    with _left_as_it_was_on_recipe_error(recipe, state), locked_output_dir(recipe.output_dir, state), \
            serving(recipe, state, engine_roles(recipe, STAGES)):
        check_and_write_run_json(recipe, state)
        for stage in STAGES:
            if stage.enabled(recipe):  # off (explore without explore_samples): not run, not recorded in run.json
                run_stage(stage, recipe, state, checked=True)


def _distributed_state():
    from rsgen.store import distributed_state  # deferred: torch and accelerate load when a stage runs

    return distributed_state()
