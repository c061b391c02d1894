"""Every documented way to reach the command line prints the same help."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
