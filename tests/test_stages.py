"""The stage list is the one place a stage is declared: a throwaway stage added to `rsgen.pipeline.STAGES` (with a
recipe key pinned to it in the field metadata) gets a subcommand with its own `--help`, runs under `rsgen run`,
is pinned in run.json, resumes, refuses a change of its pinned key once it has work, and runs its pre-flight
check before anything is written. Also: each real stage's package reads only the recipe keys it declares."""

from __future__ import annotations

import ast
import dataclasses
import importlib
import json
import logging
import pkgutil
import re
from pathlib import Path
from types import MappingProxyType

import pytest

import rsgen.pipeline
from rsgen.cli import main
from rsgen.config import RecipeConfig, RecipeError
from rsgen.layout import OutputLayout
from rsgen.pipeline import STAGES
from rsgen.stage import Stage

PINNED = "num_card_examples"  # a key the throwaway stage takes over for the test (its metadata is patched)


def tally_stage(runs: list[int]) -> Stage:
    """Writes work/tally/tally.json once (a rerun finds it and does nothing): the least a resumable stage does."""

    def work(layout: OutputLayout) -> Path:
        return layout.work / "tally"

    def run(recipe, state) -> None:
        done = work(OutputLayout(recipe.output_dir)) / "tally.json"
        if done.exists():
            return
        runs.append(getattr(recipe, PINNED))
        done.parent.mkdir(parents=True, exist_ok=True)
        done.write_text(json.dumps({"counted": list(range(getattr(recipe, PINNED)))}))

    def check(recipe) -> None:
        if getattr(recipe, PINNED) > 10:
            raise RecipeError(f"{PINNED}: {getattr(recipe, PINNED)} is more than the tally stage counts to; set 10 "
                              "or less")

    return Stage(name="tally", help="count up to num_card_examples (a stage the tests add)", work=work, run=run,
                 every_process=False, check=check)


@pytest.fixture
def tally(monkeypatch):
    """The pipeline is the throwaway stage alone, and `num_card_examples` is pinned to it and read by it."""
    runs: list[int] = []
    monkeypatch.setattr(rsgen.pipeline, "STAGES", (tally_stage(runs),))
    field = next(f for f in dataclasses.fields(RecipeConfig) if f.name == PINNED)
    monkeypatch.setattr(field, "metadata", MappingProxyType(
        {**field.metadata, "pin": "tally", "read_by": ("tally",), "help": "how far the tally stage counts"}))
    return runs


def _recipe(tmp_path, **keys) -> str:
    path = tmp_path / "r.yaml"
    path.write_text("\n".join([f"output_dir: {tmp_path / 'out'}"] + [f"{k}: {v}" for k, v in keys.items()]) + "\n")
    return str(path)


def _cli(args, capsys) -> tuple[int, str, str]:
    try:
        main(args)
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_stage_added_to_the_list_has_its_subcommand_and_help(tally, capsys):
    code, text, _ = _cli(["--help"], capsys)
    assert code == 0 and "all stages: tally (resumable)" in text and "count up to num_card_examples" in text
    code, text, _ = _cli(["tally", "--help"], capsys)
    listed = set(re.findall(r"^  --(\w+) VALUE", text, re.MULTILINE))
    assert code == 0 and listed == {"output_dir", PINNED}, listed


def test_a_stage_added_to_the_list_is_run_pinned_resumed_and_checked(tally, tmp_path, capsys, caplog):
    recipe = _recipe(tmp_path, **{PINNED: 3})
    layout = OutputLayout(tmp_path / "out")

    # Its pre-flight check runs before anything is written.
    code, _, err = _cli(["run", "--config", recipe, f"--{PINNED}", "11"], capsys)
    assert code == 2 and "more than the tally stage counts to" in err
    assert not layout.root.exists()

    assert _cli(["run", "--config", recipe], capsys)[0] == 0
    assert tally == [3]
    assert json.loads((layout.work / "tally" / "tally.json").read_text()) == {"counted": [0, 1, 2]}
    run = json.loads(layout.run_json.read_text())
    assert run["pinned"] == {PINNED: 3}  # the pins are what the stage list's stages pin, nothing else
    assert run["stages"]["tally"]["position"] == 0 and run["finished_at"]  # its time recorded; the run finished

    # Resume: the rerun says what it found and the stage redoes nothing.
    with caplog.at_level(logging.INFO, logger="rsgen"):
        assert _cli(["tally", "--config", recipe], capsys)[0] == 0
    assert tally == [3]
    assert f"resuming in {layout.root}: work on disk from tally" in caplog.text

    # Its pinned key cannot change under its work; it could before it had any.
    code, _, err = _cli(["run", "--config", recipe, f"--{PINNED}", "4"], capsys)
    assert code == 2 and f"{PINNED}: 3 -> 4 (the tally work in {layout.work / 'tally'}" in err
    assert tally == [3]


def test_a_pin_change_before_the_stage_has_work_is_recorded(tally, tmp_path, capsys):
    recipe = _recipe(tmp_path, **{PINNED: 2})
    layout = OutputLayout(tmp_path / "out")
    layout.root.mkdir()
    layout.run_json.write_text(json.dumps({"pinned": {PINNED: 1}}))  # a run that stopped before the stage ran
    assert _cli(["run", "--config", recipe], capsys)[0] == 0
    change = json.loads(layout.run_json.read_text())["recipe_changes"]
    assert [(c["key"], c["from"], c["to"]) for c in change] == [(PINNED, 1, 2)]
    assert tally == [2]


def _package_of(stage: Stage) -> Path:
    """The folder of the package that declares `stage` as its STAGE."""
    import rsgen

    for info in pkgutil.iter_modules(rsgen.__path__, "rsgen."):
        if info.ispkg and getattr(importlib.import_module(info.name), "STAGE", None) is stage:
            return Path(importlib.import_module(info.name).__file__).parent
    raise AssertionError(f"no package of rsgen declares the stage {stage.name!r}")


KEYS = frozenset(f.name for f in dataclasses.fields(RecipeConfig))
ROLE_DISPATCH = ("engine_spec", "build_engine", "check_engine")  # read the keys of the role they are given


def _is_recipe(node: ast.AST) -> bool:
    """`recipe`, `self.recipe`, `work.recipe`: an expression that is the run's recipe."""
    return (isinstance(node, ast.Name) and node.id == "recipe") or (isinstance(node, ast.Attribute)
                                                                     and node.attr == "recipe")


def _keys_read(tree: ast.AST) -> set[str]:
    """Keys read directly: `recipe.KEY`, `self.recipe.KEY`, `getattr(recipe, "KEY", ...)`."""
    read = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in KEYS and _is_recipe(node.value):
            read.add(node.attr)
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and _is_recipe(node.args[0]) and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in KEYS):
            read.add(node.args[1].value)
    return read


def _role_of(call: ast.Call) -> str | None:
    role = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "role"), None)
    if isinstance(role, ast.Constant):
        return role.value
    if isinstance(role, ast.Attribute) and isinstance(role.value, ast.Name) and role.value.id == "Role":
        return role.attr.lower()
    return None


def _helpers_called(tree: ast.AST) -> set[tuple[str, str | None]]:
    """(function, role) for every call handed the recipe (`helper(recipe, ...)`, `recipe.method()`)."""
    called = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and _is_recipe(func.value) and func.attr not in KEYS:
            called.add(("RecipeConfig." + func.attr, None))
        elif any(_is_recipe(a) for a in [*node.args, *(k.value for k in node.keywords)]):
            name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None
            if name:
                called.add((name, _role_of(node) if name in ROLE_DISPATCH else None))
    return called


class _KeyRecorder:
    """A recipe that records the keys read from it (the role dispatch of rsgen.engine, run for one role)."""

    def __init__(self):
        object.__setattr__(self, "read", set())

    def __getattr__(self, name):
        if name in KEYS:
            self.read.add(name)
        return getattr(RecipeConfig(), name)


def _engine_keys(role: str) -> set[str]:
    from rsgen.engine import engine_spec

    recorder = _KeyRecorder()
    engine_spec(recorder, role)
    return recorder.read


def _helper_index() -> dict[str, list[tuple[Path, ast.FunctionDef]]]:
    """Every function of rsgen taking a `recipe` (by name), and RecipeConfig's methods (as RecipeConfig.NAME)."""
    index: dict[str, list] = {}
    for path in Path(rsgen.pipeline.__file__).parent.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and node.name == "RecipeConfig":
                for method in node.body:
                    if isinstance(method, ast.FunctionDef):
                        index.setdefault("RecipeConfig." + method.name, []).append((path, method))
            elif isinstance(node, ast.FunctionDef) and "recipe" in [a.arg for a in node.args.args]:
                index.setdefault(node.name, []).append((path, node))
    return index


def _self_keys(method: ast.FunctionDef) -> set[str]:
    return {n.attr for n in ast.walk(method) if isinstance(n, ast.Attribute) and n.attr in KEYS
            and isinstance(n.value, ast.Name) and n.value.id == "self"}


def keys_read_by_package(package: Path) -> tuple[set[str], set[str]]:
    """(keys the package reads itself, keys it reads through helpers outside it, followed call by call)."""
    trees = [ast.parse(path.read_text()) for path in package.rglob("*.py")]
    direct = set().union(*(_keys_read(tree) for tree in trees))
    index = _helper_index()
    todo = set().union(*(_helpers_called(tree) for tree in trees))
    seen, through = set(), set()
    while todo:
        name, role = todo.pop()
        if (name, role) in seen:
            continue
        seen.add((name, role))
        if name in ROLE_DISPATCH and role is not None:
            through |= _engine_keys(role)
        for path, function in index.get(name, []):
            if package in path.parents:
                continue  # the package's own functions: read directly above
            if name.startswith("RecipeConfig."):
                through |= _self_keys(function)
                continue
            through |= _keys_read(function)
            todo |= {(n, r) for n, r in _helpers_called(function) if n != "engine_spec" or r is not None}
    return direct, through


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.name)
def test_a_stage_package_reads_only_the_keys_it_declares(stage):
    """Every recipe key the stage's package reads -- `recipe.KEY`, `self.recipe.KEY`, `getattr(recipe, "KEY")`,
    or through a helper outside the package that it hands the recipe to (`build_engine(recipe, "judge")` reads
    the judge role's keys) -- is a key the field metadata says that stage reads (its `--help` lists exactly
    those): a stage cannot depend on a key without the key saying so."""
    direct, through = keys_read_by_package(_package_of(stage))
    assert direct, f"no recipe key read in {_package_of(stage)}: the check reads the wrong package"
    assert direct <= set(stage.keys), sorted(direct - set(stage.keys))
    assert through <= set(stage.keys), sorted(through - set(stage.keys))


def test_the_key_check_sees_self_recipe_getattr_and_helpers(tmp_path):
    package = tmp_path / "fake_stage"
    package.mkdir()
    (package / "stage.py").write_text(
        "class Runner:\n"
        "    def go(self):\n"
        "        return self.recipe.judge_scope, getattr(recipe, 'explore_stop', None)\n"
        "def run(recipe):\n"
        "    build_engine(recipe, 'judge')\n"
        "    return judge_base_urls(recipe), recipe.generation_chat_template_kwargs()\n")
    direct, through = keys_read_by_package(package)
    assert direct == {"judge_scope", "explore_stop"}
    assert {"judge_model_name_or_path", "judge_max_new_tokens"} <= through  # the judge role's engine keys
    assert "explore_temperature" not in through  # not the other roles'
    assert {"engine_judge_base_url", "engine_base_url"} <= through  # judge_base_urls reads them
    assert {"chat_template_kwargs", "enable_thinking"} <= through  # RecipeConfig.generation_chat_template_kwargs


def test_stage_names_are_unique_and_the_list_ends_with_the_stage_that_finishes_a_run():
    names = [stage.name for stage in STAGES]
    assert len(names) == len(set(names))
    assert names[0] == "prepare" and names[-1] == "emit"
