"""Print pip constraints pinning every dependency of pyproject.toml (and its `dev` extra) to its declared floor.

    python .ci/floors.py > floors.txt && pip install -c floors.txt -e ".[dev]"

installs exactly the oldest versions rsgen claims to support, so CI can prove the claim; `--check` then verifies
that each installed version is its floor.
"""

import importlib.metadata
import re
import sys
from pathlib import Path

import tomllib  # Python 3.11+: CI's interpreter (rsgen itself supports 3.10)

pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
project = pyproject["project"]
extras = project["optional-dependencies"]


def expand(requirements: list[str]) -> list[str]:
    """`rsgen[serve]` inside an extra stands for that extra's requirements (rsgen itself has no floor)."""
    out = []
    for requirement in requirements:
        own = re.match(r"^\s*rsgen\[([^\]]+)\]\s*$", requirement)
        out += expand([r for name in own.group(1).split(",") for r in extras[name.strip()]]) if own else [requirement]
    return out


requirements = list(dict.fromkeys(expand(project["dependencies"] + extras["dev"])))
printed = set()
for requirement in requirements:
    match = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*(.*)$", requirement)
    name, spec = match.group(1), match.group(3)
    floor = re.search(r">=\s*([0-9][^,;\s]*)", spec)
    if floor is None:
        sys.exit(f"{requirement!r} has no `>=` floor; every dependency declares the oldest version it works with")
    if "--check" in sys.argv:  # inside the floors environment, which has packaging
        from packaging.version import Version

        installed = importlib.metadata.version(name)
        if Version(Version(installed).base_version) != Version(floor.group(1)):
            sys.exit(f"{name} {installed} is installed, not its declared floor {floor.group(1)}")
        print(f"{name} {installed} (floor {floor.group(1)})")
    elif (name.lower(), floor.group(1)) not in printed:  # transformers: a dependency and, with [serving], an extra
        printed.add((name.lower(), floor.group(1)))
        print(f"{name}=={floor.group(1)}")
