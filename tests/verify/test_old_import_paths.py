"""Import paths from before the verify stage took the name `rsgen.verify` (issue 37): scripts that use them keep
working, with a warning naming the new path, or fail with one line naming it."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _run(code: str) -> subprocess.CompletedProcess:
    # a fresh interpreter: the old paths are resolved on first import
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)


def test_a_reward_by_its_old_dotted_path_is_the_verifiers_reward():
    done = _run(
        "import warnings; warnings.simplefilter('always')\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    import rsgen.verify.rewards\n"
        "import rsgen.verifiers.rewards\n"
        "assert rsgen.verify.rewards is rsgen.verifiers.rewards\n"
        "assert rsgen.verify.rewards.relaxed is rsgen.verifiers.rewards.relaxed\n"
        "print([str(w.message) for w in caught])"
    )
    assert done.returncode == 0, done.stderr
    assert "rsgen.verify.rewards is now rsgen.verifiers.rewards" in done.stdout


def test_the_old_package_names_are_the_verifiers():
    import rsgen.verifiers
    import rsgen.verify

    with pytest.warns(DeprecationWarning, match="rsgen.verify.verify_response is now rsgen.verifiers.verify_response"):
        from rsgen.verify import verify_response
    assert verify_response is rsgen.verifiers.verify_response
    assert rsgen.verify.STAGE.name == "verify"  # the package is the stage's
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = rsgen.verify.no_such_name


def test_the_stage_modules_are_not_shadowed_and_unknown_modules_still_fail():
    import rsgen.verify.stage

    assert rsgen.verify.stage.__name__ == "rsgen.verify.stage"
    with pytest.raises(ModuleNotFoundError):
        import rsgen.verify.no_such_module  # noqa: F401


def test_the_old_stage_package_names_the_new_one():
    done = _run("import rsgen.verification")
    assert done.returncode != 0
    assert "ImportError: rsgen.verification is now rsgen.verify (the verify stage)" in done.stderr
