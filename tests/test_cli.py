"""Every documented way to reach the command line prints the same help."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rsgen.cli import _build_parser, _recipe_overrides, main
from rsgen.config import SourceConfig, recipe_keys_by_stage

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(cmd, cwd):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "cmd, where",
    [
        (["rsgen", "--help"], "tmp"),
        ([sys.executable, "-m", "rsgen", "--help"], "tmp"),
        (["accelerate", "launch", "rsgen", "--help"], "root"),  # runs rsgen/__main__.py as a script
        (["accelerate", "launch", "-m", "rsgen", "--help"], "tmp"),
    ],
)
def test_help_everywhere(cmd, where, tmp_path):
    out = run(cmd, ROOT if where == "root" else tmp_path)
    assert out.returncode == 0, out.stderr
    for command in ("run", "prepare", "generate", "judge", "emit", "demo", "card"):
        assert command in out.stdout


def test_bad_recipe_key_exits_with_a_named_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dirr: x\n")
    out = run([sys.executable, "-m", "rsgen", "prepare", "--config", str(recipe)], tmp_path)
    assert out.returncode == 2
    assert "unknown key 'output_dirr'" in out.stderr and "output_dir" in out.stderr


@pytest.mark.parametrize("command", ["run", "prepare", "generate", "judge", "emit"])
def test_recipe_command_help_lists_every_key_by_stage(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    text = capsys.readouterr().out
    for stage, fields in recipe_keys_by_stage().items():
        block = text.split(f"\n{stage} keys:\n", 1)[1].split(" keys:\n", 1)[0]  # this stage's group
        for f in fields:
            assert f"--{f.name} VALUE" in block and f.metadata["help"].split()[0] in block, f.name
    for f in dataclasses.fields(SourceConfig):
        assert f"  {f.name} " in text


def test_recipe_keys_on_the_command_line_are_yaml_values():
    parser = _build_parser()
    args, rest = parser.parse_known_args(
        ["run", "--config", "r.yaml", "--judge", "false", "--max-new-tokens", "5", "--verifier={A: exact}",
         "--sources", "[{dataset_name: x, family: X}]"]
    )
    overrides = _recipe_overrides(args, rest)
    assert overrides == {"judge": False, "max_new_tokens": 5, "verifier": {"A": "exact"},
                         "sources": [{"dataset_name": "x", "family": "X"}]}


def test_abbreviated_key_is_not_guessed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: x\n")
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", "--config", str(recipe), "--max_new", "5"])
    assert exit_.value.code == 2
