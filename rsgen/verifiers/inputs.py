"""Input checks shared by every verifier: what counts as bad input, decided once and the same everywhere.

- prediction None (extraction found nothing) or blank text -> `no_answer`;
- prediction that is not a `str` (a number, bytes, a list...) -> `bad_input`;
- references: a `str`, or a non-empty list/tuple of `str`; blank references are ignored; anything else, or
  nothing left -> `bad_input`. A reference is text whatever it says: "nan", "inf", "None" and "null" are answers
  like any other (a pool's missing values are prepare's business: it drops blank answers as `answer_empty`).
  Numbers are not silently turned into text: `3` and `3.0` would read differently.
- options (multiple-choice option texts): None, or a list/tuple of `str`; anything else -> `bad_input`.

`rsgen.verifiers.frame` runs these checks for every verifier.
"""

from __future__ import annotations

from rsgen.verifiers.decision import BAD_INPUT, NO_ANSWER, Decision

_NO_ANSWER = Decision(False, NO_ANSWER, None)


def check_inputs(prediction, references) -> tuple[str, ...] | Decision:
    """The usable references as a tuple, or the non-match Decision that bad input deserves."""
    # Fast path for the common case: one text reference and a non-blank text prediction.
    if type(prediction) is str and type(references) is str and prediction and references:
        if not prediction.isspace() and not references.isspace():
            return (references,)
    if type(prediction) is not str:
        if prediction is None:
            return _NO_ANSWER
        return Decision(False, BAD_INPUT, None)
    if not prediction or prediction.isspace():
        return Decision(False, NO_ANSWER, prediction)
    if type(references) is str:
        if _usable(references):
            return (references,)
        return Decision(False, BAD_INPUT, prediction)
    if isinstance(references, (list, tuple)) and all(type(r) is str for r in references):
        refs = tuple(r for r in references if _usable(r))
        if refs:
            return refs
    return Decision(False, BAD_INPUT, prediction)


def _usable(reference: str) -> bool:
    return bool(reference) and not reference.isspace()


def check_options(options) -> bool:
    """Whether `options` (not None) is a list or tuple of option texts."""
    if not isinstance(options, (list, tuple)):
        return False
    try:
        "".join(options)  # raises unless every option is a str, at C speed
    except TypeError:
        return False
    return True
