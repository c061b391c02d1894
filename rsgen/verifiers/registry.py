"""The verifier registry and the two entry points the pipeline, the metric and the rewards use."""

from __future__ import annotations

from collections.abc import Callable

from rsgen.verifiers.decision import Decision
from rsgen.verifiers.exact import exact
from rsgen.verifiers.extract import extract_answer
from rsgen.verifiers.inputs import check_inputs, check_options
from rsgen.verifiers.mathexpr import math_verifier
from rsgen.verifiers.mc import mc, reference_letter
from rsgen.verifiers.numeric import numeric
from rsgen.verifiers.relaxed import relaxed

VERIFIERS: dict[str, Callable[..., Decision]] = {
    "relaxed": relaxed,
    "exact": exact,
    "numeric": numeric,
    "mc": mc,
    "math": math_verifier,
}
"""name -> verifier(prediction, references, *, options=None, numeric_tolerance=None, timeout_seconds=None).

Each is a rule wrapped by `rsgen.verifiers.frame.verifier`, which gives them this one signature and input checks.
A new verifier: a module with its `@verifier` rule, and one line here."""


def clear_caches() -> None:
    """Forget the memoised normalisations and option letters (benchmarks start cold; tests reset state)."""
    from rsgen.verifiers import mc as mc_module
    from rsgen.verifiers import normalize

    normalize._info_cache.clear()
    mc_module._forms_cache.clear()
    mc_module._option_pattern_cache.clear()


def get_verifier(name: str) -> Callable[..., Decision]:
    """The verifier called `name`; a clear error naming the choices otherwise (a recipe/config mistake)."""
    try:
        return VERIFIERS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown verifier {name!r}; choose one of {', '.join(sorted(VERIFIERS))}") from None


def compare(
    name: str, prediction: str | None, references: str | list[str], *, options=None, **kw
) -> Decision:
    """Compare an already extracted answer with the reference(s) using verifier `name`.

    kw: `numeric_tolerance` (numeric), `timeout_seconds` (math); every verifier accepts both.
    """
    verifier = VERIFIERS.get(name) if type(name) is str else None
    if verifier is None:
        verifier = get_verifier(name)  # raises the clear error
    if options is None and not kw:
        return verifier(prediction, references)  # a positional call is cheaper; this is the hot path
    return verifier(prediction, references, options=options, **kw)


def verify_response(name: str, response: str, references: str | list[str], *, options=None, **kw) -> Decision:
    """Extract the final answer from a raw model response, then compare it with verifier `name`."""
    verifier = VERIFIERS.get(name) if type(name) is str else None
    if verifier is None:
        verifier = get_verifier(name)  # raises the clear error
    extraction = extract_answer(response)
    if extraction.answer is None:
        return Decision(False, extraction.reason, None)  # (rare path: the readable constructor is fine)
    if options is None and not kw:
        return verifier(extraction.answer, references)
    return verifier(extraction.answer, references, options=options, **kw)


def unusable_reference(name: str, references, options=None) -> str | None:
    """Why verifier `name` can use none of `references` whatever the answer -- every answer is then `bad_input`
    -- or None when it can. Decided by the references and options alone, so it is known before any model runs."""
    get_verifier(name)
    refs = check_inputs("x", references)  # "x": any usable answer; only the references are looked at
    if type(refs) is Decision:
        return "no reference is non-blank text"
    if options is not None and not check_options(options):
        return "the options are not a list of texts"
    if (options or name == "mc") and all(reference_letter(ref, options or None) is None for ref in refs):
        if options:
            return "the reference names no option (neither a letter nor one option's text)"
        return "the reference is not an option letter and the row has no options"
    return None
