"""Verifiers as TRL reward functions.

By dotted path, as TRL's scripts take them (`--reward_funcs rsgen.verifiers.rewards.relaxed`) or as objects
(`GRPOTrainer(reward_funcs=[rsgen.verifiers.rewards.relaxed])`): `relaxed`, `exact`, `numeric`, `mc` and `math`
read the reference from the `solution` column (as emitted in `{Family}_grpo`), else `answer`, and `options` when
present; they score 1.0 / 0.0 and None where the reference itself cannot be used (TRL leaves a None out of the
reward instead of teaching the model against a broken reference). `reward_function(name, ...)` builds one with
other columns or verifier settings.

GRPOTrainer calls a reward function as `f(prompts=..., completions=..., completion_ids=..., **columns)`,
where `columns` are the dataset's other columns (one value per completion) plus trainer extras
(`trainer_state`, `log_extra`, `log_metric`). It expects one float per completion back.
"""

from __future__ import annotations

import warnings

from rsgen.verifiers.decision import BAD_INPUT, Decision
from rsgen.verifiers.inputs import check_inputs
from rsgen.verifiers.registry import get_verifier, verify_response


def completion_text(completion) -> str | None:
    """The text of one completion: a plain string, or a conversational list of messages whose `content` is a
    string or a list of content parts ({"type": "text", "text": ...}); several messages are joined by newlines.
    None when the completion has no text at all."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        completion = [completion]
    if not isinstance(completion, (list, tuple)):
        return None
    texts = []
    for message in completion:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, (list, tuple)):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    texts.append(part["text"])
    return "\n".join(texts) if texts else None


class VerifierReward:
    """A GRPOTrainer reward: 1.0 when the completion's final answer matches the reference column, else 0.0.

    Picklable (a plain object with a `__name__`, which TRL shows as the reward's name in its logs).
    When the trainer passes `log_extra`, the extracted answer and the reason of each completion are added to
    TRL's completions table. Bad input (a reference that is not text, a completion without text) scores 0.0
    and warns once.
    """

    def __init__(
        self,
        name: str,
        *,
        answer_column: str = "answer",
        options_column: str = "options",
        numeric_tolerance: float | None = None,
        timeout_seconds: float | None = None,
    ) -> None:
        get_verifier(name)  # unknown names fail here, not in the middle of training
        self.name = name
        self.__name__ = f"rsgen_{name}"
        self.answer_column = answer_column
        self.options_column = options_column
        self.verifier_kwargs = {"numeric_tolerance": numeric_tolerance, "timeout_seconds": timeout_seconds}
        self.bad_input_count = 0
        self._warned = False

    def __call__(self, completions, **kwargs) -> list[float]:
        references = kwargs.get(self.answer_column)
        if references is None:
            raise ValueError(
                f"reward {self.__name__} needs the dataset column {self.answer_column!r} (the official answers); "
                f"the trainer passed {sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}. "
                f"Name the column with reward_function({self.name!r}, answer_column=...)"
            )
        if len(references) != len(completions):
            raise ValueError(
                f"{len(completions)} completions but {len(references)} values in {self.answer_column!r}"
            )
        options = kwargs.get(self.options_column)
        rewards, extracted, reasons = [], [], []
        for i, completion in enumerate(completions):
            decision = verify_response(
                self.name,
                completion_text(completion),
                references[i],
                options=options[i] if options is not None else None,
                **self.verifier_kwargs,
            )
            rewards.append(1.0 if decision.match else 0.0)
            extracted.append(decision.extracted)
            reasons.append(decision.reason)
        bad = reasons.count(BAD_INPUT)
        if bad:
            self.bad_input_count += bad
            if not self._warned:
                self._warned = True
                warnings.warn(
                    f"reward {self.__name__}: {bad} completion(s) with bad input (a reference that is not text, "
                    "or a completion without text) scored 0.0",
                    stacklevel=2,
                )
        log_extra = kwargs.get("log_extra")
        if callable(log_extra):
            log_extra(f"{self.__name__}_extracted", extracted)
            log_extra(f"{self.__name__}_reason", reasons)
        return rewards


def reward_function(name: str, **kw) -> VerifierReward:
    """A GRPOTrainer reward function for verifier `name`.

    kw: `answer_column` (default "answer": a str or a list of acceptable answers per row), `options_column`
    (default "options", used by `mc` when the dataset has it), `numeric_tolerance`, `timeout_seconds`.
    """
    return VerifierReward(name, **kw)


# ---------------------------------------------------------------- rewards by dotted path

REFERENCE_COLUMNS = ("solution", "answer")  # the first one the dataset has is the reference


def _reward(name: str, completions, kwargs) -> list[float | None]:
    column = next((c for c in REFERENCE_COLUMNS if kwargs.get(c) is not None), None)
    if column is None:
        raise ValueError(
            f"reward rsgen.verifiers.rewards.{name} needs a dataset column 'solution' (or 'answer') with the official "
            f"answers; the trainer passed {sorted(k for k in kwargs if k not in ('trainer_state', 'log_extra', 'log_metric'))}"
        )
    references, options = kwargs[column], kwargs.get("options")
    if len(references) != len(completions):
        raise ValueError(f"{len(completions)} completions but {len(references)} values in {column!r}")
    rewards: list[float | None] = []
    for i, completion in enumerate(completions):
        if isinstance(check_inputs("x", references[i]), Decision):  # the reference is unusable, not the answer
            rewards.append(None)
            continue
        decision = verify_response(name, completion_text(completion), references[i],
                                   options=(options[i] or None) if options is not None else None)
        rewards.append(1.0 if decision.match else 0.0)
    return rewards


def relaxed(completions, **kwargs) -> list[float | None]:
    """ChartQA relaxed accuracy of each completion's final answer against `solution` (else `answer`)."""
    return _reward("relaxed", completions, kwargs)


def exact(completions, **kwargs) -> list[float | None]:
    """Exact match (after light normalisation) against `solution` (else `answer`)."""
    return _reward("exact", completions, kwargs)


def numeric(completions, **kwargs) -> list[float | None]:
    """Numeric equality (default tolerance) against `solution` (else `answer`)."""
    return _reward("numeric", completions, kwargs)


def mc(completions, **kwargs) -> list[float | None]:
    """Multiple choice: the option letter named by the completion against `solution` (else `answer`), using
    `options` when the dataset has it."""
    return _reward("mc", completions, kwargs)


def math(completions, **kwargs) -> list[float | None]:
    """Mathematical equivalence (math-verify, time-limited) against `solution` (else `answer`)."""
    return _reward("math", completions, kwargs)
