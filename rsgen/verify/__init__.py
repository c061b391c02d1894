"""The verify stage: every response generate stored, decided again by the family's verifier, without the model.

(`rsgen.verifiers` is the verifiers themselves; this package runs them over the work of a run.)
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

from rsgen.stage import Stage, lazy_exports

STAGE = Stage.in_package(
    __name__,
    "verify",
    help="decide every stored response with the recipe's verifiers, without the model (seconds; resumable)",
    work=lambda layout: layout.verify_work,
    every_process=True,  # data-parallel like the model stages: each rank decides its stripe of the keys
    checked=False,
)

_stage_exports = lazy_exports(__name__, {"run_verify": "rsgen.verify.stage"})


# Before the verify stage took this name, `rsgen.verify` held the verifiers (now `rsgen.verifiers`). Scripts
# written then keep working, with a DeprecationWarning naming the new path: `rsgen.verify.<module>` is that
# module of rsgen.verifiers (`reward_funcs=[rsgen.verify.rewards.relaxed]`), and the names the verifiers
# export are read through this package (`from rsgen.verify import verify_response`).
def __getattr__(name: str):
    if name == "run_verify":
        return _stage_exports(name)
    import rsgen.verifiers

    if name in rsgen.verifiers.__all__:
        warnings.warn(f"rsgen.verify.{name} is now rsgen.verifiers.{name}", DeprecationWarning, stacklevel=2)
        return getattr(rsgen.verifiers, name)
    return _stage_exports(name)


class _OldVerifierModule(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds `rsgen.verify.<module>` when the stage has no such module and rsgen.verifiers has: the same module
    object (consulted after the normal finders, so the stage's own modules are never shadowed)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, module = fullname.rpartition(".")
        if package != __name__ or importlib.util.find_spec(f"rsgen.verifiers.{module}") is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        new = "rsgen.verifiers." + spec.name.rpartition(".")[2]
        warnings.warn(f"{spec.name} is now {new}", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module):
        pass  # the module object is rsgen.verifiers', already run


if not any(isinstance(finder, _OldVerifierModule) for finder in sys.meta_path):
    sys.meta_path.append(_OldVerifierModule())
__all__ = ["STAGE", "run_verify"]  # noqa: F822 (loaded on first use)
