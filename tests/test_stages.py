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


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.name)
def test_a_stage_package_reads_only_the_keys_it_declares(stage):
    """`recipe.KEY` anywhere in the stage's package is a key the field metadata says that stage reads (its
    `--help` lists exactly those): a stage cannot depend on a key without the key saying so."""
    package = _package_of(stage)
    keys = {f.name for f in dataclasses.fields(RecipeConfig)}
    read = {node.attr for path in package.rglob("*.py") for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "recipe"
            and node.attr in keys}
    assert read, f"no recipe key read in {package}: the check reads the wrong package"
    assert read <= set(stage.keys), sorted(read - set(stage.keys))


def test_stage_names_are_unique_and_the_list_ends_with_the_stage_that_finishes_a_run():
    names = [stage.name for stage in STAGES]
    assert len(names) == len(set(names))
    assert names[0] == "prepare" and names[-1] == "emit"
