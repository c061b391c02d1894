"""The frame every verifier shares: one signature, one set of input checks, one decision type.

A verifier module writes only its rule, on inputs the frame has already checked, and wraps it once:

    @verifier
    def exact(prediction: str, references: tuple[str, ...], options, numeric_tolerance, timeout_seconds) -> Decision:
        ...

The wrapped function is what the registry holds and what callers use:

    exact(prediction, references, *, options=None, numeric_tolerance=None, timeout_seconds=None) -> Decision

A row with options is multiple choice whatever verifier its family names: the frame hands it to `mc`'s rule
(a family that mixes multiple-choice and free-form rows is served by one verifier setting, `relaxed` by default:
its rows with options are compared by option letter, the rest as free form). A row without options goes to the
named verifier's rule.

Before the rule runs, the frame
- turns bad data into a non-match `Decision` (see `rsgen.verifiers.inputs`: `no_answer` for a missing or blank
  prediction, `bad_input` for text that is not text, unusable references or options that are not a list of
  text), so a rule sees a non-blank `str` prediction and a non-empty tuple of usable reference strings;
- raises a `ValueError` for a bad setting (`numeric_tolerance` not a finite number >= 0, `timeout_seconds` not a
  finite number > 0): that is a recipe mistake, the same for every row, so it fails loudly.

Every verifier accepts every keyword (the generate stage passes them all to whichever verifier a family uses);
a rule ignores those it has no use for. `None` means the verifier's own default.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from rsgen.verifiers.decision import BAD_INPUT, Decision
from rsgen.verifiers.inputs import check_inputs, check_options

Rule = Callable[[str, tuple, "list[str] | tuple[str, ...] | None", "float | None", "float | None"], Decision]


def verifier(rule: Rule) -> Callable[..., Decision]:
    """The verifier made of `rule`: the shared signature and input checks around it (see the module docstring)."""

    def framed(
        prediction: str | None,
        references: str | list[str],
        *,
        options: list[str] | None = None,
        numeric_tolerance: float | None = None,
        timeout_seconds: float | None = None,
    ) -> Decision:
        if options is not None or numeric_tolerance is not None or timeout_seconds is not None:
            check_settings(numeric_tolerance, timeout_seconds)
        refs = check_inputs(prediction, references)
        if type(refs) is Decision:
            return refs
        if options is not None and not check_options(options):
            return Decision(False, BAD_INPUT, prediction)
        if options:
            return multiple_choice_rule()(prediction, refs, options, numeric_tolerance, timeout_seconds)
        return rule(prediction, refs, options, numeric_tolerance, timeout_seconds)

    framed.__name__ = rule.__name__
    framed.__qualname__ = rule.__qualname__
    framed.__module__ = rule.__module__
    framed.__doc__ = rule.__doc__
    framed.rule = rule  # the bare rule (the frame hands rows with options to mc's)
    return framed


_MULTIPLE_CHOICE: list[Rule] = []  # mc's rule, registered by `multiple_choice_verifier` (mc is built on this frame)


def multiple_choice_verifier(rule: Rule) -> Callable[..., Decision]:
    """`verifier`, for the rule that decides every row with options (`rsgen.verifiers.mc`): the frame keeps the rule
    it is handed instead of importing mc, so the two modules do not import each other."""
    _MULTIPLE_CHOICE[:] = [rule]
    return verifier(rule)


def multiple_choice_rule() -> Rule:
    """`mc`'s rule, which decides every row with options (importing any verifier imports `rsgen.verifiers`, whose
    registry imports mc, so it is registered before a row can reach this)."""
    return _MULTIPLE_CHOICE[0]


def check_settings(numeric_tolerance, timeout_seconds) -> None:
    """Raise a clear error for a tolerance or time limit no verifier could use (None: the verifier's default)."""
    if numeric_tolerance is not None and not (_finite(numeric_tolerance) and numeric_tolerance >= 0):
        raise ValueError(
            f"numeric_tolerance must be a finite number >= 0 (or None for the default), got {numeric_tolerance!r}"
        )
    if timeout_seconds is not None and not (_finite(timeout_seconds) and timeout_seconds > 0):
        raise ValueError(
            f"timeout_seconds must be a finite number > 0 (or None for the default), got {timeout_seconds!r}"
        )


def _finite(value) -> bool:
    return type(value) in (float, int) and math.isfinite(value)
