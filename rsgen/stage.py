"""The unit rsgen is built from: a `Stage`. The pipeline is a list of them (`rsgen.pipeline.STAGES`), and everything
that walks the stages reads that one list: `rsgen run`, the run.json pins, the command line's subcommands and
their `--help`, the resume summary, the per-stage times in stats.json.

A stage lives in its own package, which declares it as `STAGE = Stage.in_package(__name__, ...)` in its `__init__.py` (importing
nothing heavy there: the command line reads the list to build its help). What a stage depends on is not declared
here but where the recipe keys are: the `pin` and `read_by` metadata of `RecipeConfig`'s fields.
See docs/architecture.md, "Adding a stage".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, keys_read_by, pinned_keys
from rsgen.layout import OutputLayout


def _no_check(recipe: RecipeConfig) -> None:
    return None


def _always(recipe: RecipeConfig) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    name: str  # the subcommand (`rsgen NAME`), the `stage` of its recipe keys, its entry in run.json
    help: str  # one line for `rsgen --help`
    work: Callable[[OutputLayout], Path]  # where its work lives in the output directory
    # run(recipe, state): do the stage's work on this process; `state` is the process's accelerate PartialState.
    # A stage is resumable on its own: what its work on disk says is finished is not done again.
    run: Callable[[RecipeConfig, Any], Any]
    # True: every process of a launch calls `run` (data-parallel stages); False: the main process does the work and
    # the others wait at the barrier after it.
    every_process: bool = False
    # Pre-flight: what can be known wrong from the recipe alone (a model that is not a VLM, an unknown view, ...),
    # raised as a one-line RecipeError before any stage starts. Creates nothing.
    check: Callable[[RecipeConfig], None] = _no_check
    # Whether `rsgen run` runs it for this recipe (explore: only with explore_samples > 0). `rsgen NAME` always does.
    enabled: Callable[[RecipeConfig], bool] = _always

    @property
    def pins(self) -> tuple[str, ...]:
        """The recipe keys its work depends on (metadata `pin`): refused changes while it has work on disk."""
        return pinned_keys(self.name)

    @property
    def keys(self) -> tuple[str, ...]:
        """The recipe keys it reads (metadata `read_by`): what `rsgen NAME --help` lists."""
        return keys_read_by(self.name)

    @classmethod
    def in_package(cls, package: str, name: str, *, checked: bool = True, **fields: Any) -> Stage:
        """The stage whose code is the module `package.stage`: `run_NAME(recipe, state)` and, when `checked`,
        `check_NAME(recipe)`, both imported on first call. Every stage package declares itself with this, as
        `STAGE = Stage.in_package(__name__, "NAME", help=..., work=..., ...)`; `fields` are the rest of Stage's."""
        code = f"{package}.stage"
        if checked:
            fields["check"] = lazy(f"{code}:check_{name}")
        return cls(name=name, run=lazy(f"{code}:run_{name}"), **fields)

    def has_work(self, layout: OutputLayout) -> Path | None:
        """Where its work is, when there is any on disk (None: none yet)."""
        path = self.work(layout)
        return path if path.is_dir() and any(path.iterdir()) else None


def lazy(target: str) -> Callable[..., Any]:
    """The function `module:name`, imported on its first call: a package declares its STAGE without importing its
    code (torch, transformers) when the command line only reads the list."""
    module, _, name = target.partition(":")

    def call(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"`{target}`, imported when first called."
    return call


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A package's module `__getattr__` (PEP 562): `from package import name` imports `exports[name]` (a module)
    on first use, so importing the package for its STAGE stays cheap."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
