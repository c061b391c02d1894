"""`pip install` from a wheel works like the clone: the wheel is built from a copy of the repository, installed
(not editable) into a fresh environment, and `rsgen demo` runs there from another directory — so the demo model,
its recipe, the card template, the judge prompt and the `evaluate` metric must ship inside the package.

The fresh environment takes its dependencies (torch, transformers, ...) from the environment running the tests
through a .pth line, not from the network; that line adds folders to sys.path without running their .pth files,
so an editable rsgen there stays invisible and only the installed wheel can answer `import rsgen`."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ["rsgen/demo/recipe.yaml", "rsgen/demo/model/model.safetensors", "rsgen/demo/model/config.json",
           "rsgen/emit/card_template.md", "rsgen/emit/card_parts.jinja", "rsgen/judge/prompt.txt", "rsgen/metrics/rsgen_verify/rsgen_verify.py"]


def run(cmd, cwd, env, timeout=600):
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{cmd}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of the fresh environment, its environment variables, a working directory outside the repository)."""
    tmp = tmp_path_factory.mktemp("wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    # Build from a copy: setuptools writes build/ and *.egg-info next to the sources.
    source = tmp / "source"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "runs",
                                                                "__pycache__", ".*_cache", "tests"))
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp / "dist"),
         str(source)], tmp, env)
    (wheel,) = (tmp / "dist").glob("rsgen-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in SHIPPED if name not in names]
    assert not missing, f"not in the wheel: {missing}"

    venv = tmp / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp, env)
    python = venv / "bin" / "python"
    purelib = Path(run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], tmp,
                       env).stdout.strip())
    (purelib / "rsgen_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q",
         str(wheel)], tmp, env)
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return python, env, elsewhere


def test_rsgen_comes_from_the_installed_wheel(installed):
    python, env, elsewhere = installed
    where = run([str(python), "-c", "import rsgen; print(rsgen.__file__)"], elsewhere, env).stdout.strip()
    assert Path(where).is_relative_to(python.parent.parent), where


def test_rsgen_demo_runs_from_another_directory(installed):
    python, env, elsewhere = installed
    out = run([str(python.parent / "rsgen"), "demo", "--output-dir", "out", "--num-images", "4"], elsewhere, env)
    assert "truth check:" in out.stdout
    stats = json.loads((elsewhere / "out" / "stats.json").read_text())
    assert stats["totals"]["prepared_qa"] > 0
    card = (elsewhere / "out" / "dataset" / "README.md").read_text()
    assert "## Statistics" in card and "This is a demo dataset" in card  # the shipped template rendered


def test_the_evaluate_metric_loads_from_the_installed_package(installed):
    python, env, elsewhere = installed
    code = ("import evaluate; from rsgen.metrics import metric_path; "
            "print(evaluate.load(metric_path(), 'relaxed').compute(predictions=['Answer: 41'], "
            "references=['42'])['accuracy'])")
    assert run([str(python), "-c", code], elsewhere, env).stdout.strip().endswith("1.0")
