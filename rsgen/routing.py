"""Who the judge sees and what its verdict means for a QA pair: the one place these rules are coded (the judge
stage selects its work with them, emit routes every QA pair with them).

- A generate record is judged when the verifier rejected it and it has an extractable answer
  (`needs_judging`). Pairs with nothing extractable stay rejected as `no_answer`.
- Only a `CORRECT` verdict promotes. `WRONG` -> `wrong_answer`, `UNSURE` -> `judge_unsure`; UNSURE never counts.
- With `judge: false` a rejected pair keeps the verifier's reason.
Calibration records (key "calibration:{key}") never take part in routing.
"""

from __future__ import annotations

from typing import Any

CORRECT = "CORRECT"
WRONG = "WRONG"
UNSURE = "UNSURE"
VERDICTS = (CORRECT, WRONG, UNSURE)
CALIBRATION_PREFIX = "calibration:"
REJECTED = "rejected"
CALIBRATION = "calibration"


class JudgeMissingError(RuntimeError):
    """A pair that needs a verdict has none: the judge stage did not finish."""


def needs_judging(generate_record: dict[str, Any]) -> bool:
    return (
        not generate_record["match"]
        and generate_record.get("extracted") is not None
        and generate_record.get("reason") != "no_answer"
    )


def judge_key(generate_key: str, kind: str = REJECTED) -> str:
    """Key of the judge record for a generate record: the generate key itself (the QA id when num_samples is 1),
    prefixed with "calibration:" for a calibration pair."""
    return CALIBRATION_PREFIX + generate_key if kind == CALIBRATION else generate_key


def route(
    generate_record: dict[str, Any], judge_record: dict[str, Any] | None, judge_enabled: bool
) -> tuple[bool, str | None]:
    """(accepted, reason) for one generate record; reason is None when accepted."""
    if generate_record["match"]:
        return True, None
    if not judge_enabled or not needs_judging(generate_record):
        return False, generate_record.get("reason")
    if judge_record is None:
        raise JudgeMissingError(
            f"QA pair {generate_record['key']!r} was rejected by the verifier but has no judge verdict; "
            "run `rsgen judge` (or `rsgen run`) to finish the judge stage"
        )
    verdict = judge_record["verdict"]
    if verdict == CORRECT:
        return True, None
    if verdict == WRONG:
        return False, "wrong_answer"
    if verdict == UNSURE:
        return False, "judge_unsure"
    raise ValueError(f"judge record {judge_record['key']!r} has an unknown verdict {verdict!r}")
