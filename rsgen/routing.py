"""Who the judge sees and what its verdict means for a QA pair: the one place these rules are coded (the judge
stage selects its work with them, emit routes every QA pair with them).

- A generate record is judged when the verifier rejected it and it has an extractable answer (`needs_judging`),
  unless the rejection is decisive and `judge_scope` is `undecided` (the default): a number outside the
  verifier's tolerance, or a different option letter, stays `wrong_answer` without asking the judge
  (`rsgen.verify.decisive`). Pairs with nothing extractable stay rejected as `no_answer`, pairs whose reference
  the verifier cannot use as `bad_input`.
- Only a `CORRECT` verdict promotes. `WRONG` -> `wrong_answer`, `UNSURE` -> `judge_unsure`; UNSURE never counts.
- The leniency gate: in a family where the judge said WRONG to fewer than `judge_min_specificity` of the
  known-wrong calibration pairs (or where none could be measured), a `CORRECT` is withheld: `judge_withheld`.
- With `judge: false` a rejected pair keeps the verifier's reason.
Calibration records (keys "calibration:{key}" and "known_wrong:{id}") never take part in routing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rsgen.verify.decisive import decisive_mismatch

CORRECT = "CORRECT"
WRONG = "WRONG"
UNSURE = "UNSURE"
VERDICTS = (CORRECT, WRONG, UNSURE)
REJECTED = "rejected"
CALIBRATION = "calibration"  # a verifier-accepted pair: the judge should say CORRECT
KNOWN_WRONG = "known_wrong"  # a pair built to be wrong: the judge should say WRONG
CALIBRATION_PREFIX = CALIBRATION + ":"
KNOWN_WRONG_PREFIX = KNOWN_WRONG + ":"
JUDGE_SCOPES = ("undecided", "all")
WITHHELD = "judge_withheld"
# The reasons routing gives a rejected pair besides the verifier's own (rsgen.verify.REASONS, kept as they are with
# judge: false); docs/reasons.md is made from this table.
ROUTING_REASONS: dict[str, str] = {
    "wrong_answer": "the verifier rejected the answer and the judge said WRONG, or the mismatch was decisive (a "
                    "number beyond the tolerance, another option) and never reached the judge",
    "judge_unsure": "the verifier rejected the answer and the judge said UNSURE (never counts as correct)",
    WITHHELD: "the judge said CORRECT, but in a family whose judge failed the known-wrong calibration "
              "(judge_min_specificity): the promotion is withheld",
}


class JudgeMissingError(RuntimeError):
    """A pair that needs a verdict has none: the judge stage did not finish."""


# Rejections no judge can rescue: nothing was answered, or the reference itself cannot be used (bad_input: never
# judged, never promoted, never a DPO pair; it stays bad_input in every count).
UNJUDGEABLE_REASONS = ("no_answer", "bad_input")


def needs_judging(generate_record: dict[str, Any]) -> bool:
    """A verifier rejection with an extractable answer and a usable reference (before the decisive rule)."""
    return (
        not generate_record["match"]
        and generate_record.get("extracted") is not None
        and generate_record.get("reason") not in UNJUDGEABLE_REASONS
    )


def is_decisive(generate_record: dict[str, Any], answers: Sequence[str], options: Sequence[str] | None,
                numeric_tolerance: float | None) -> bool:
    """A verifier rejection that is final: see `rsgen.verify.decisive`."""
    return (
        needs_judging(generate_record)
        and generate_record.get("reason") == "wrong_answer"
        and decisive_mismatch(generate_record.get("verifier") or "", generate_record["extracted"], list(answers),
                              options=list(options) if options else None, numeric_tolerance=numeric_tolerance)
    )


def goes_to_judge(generate_record: dict[str, Any], answers: Sequence[str], options: Sequence[str] | None,
                  judge_scope: str, numeric_tolerance: float | None) -> bool:
    """Whether the judge grades this record: `needs_judging`, and not decisive unless `judge_scope` is `all`."""
    if not needs_judging(generate_record):
        return False
    return judge_scope == "all" or not is_decisive(generate_record, answers, options, numeric_tolerance)


def judge_key(generate_key: str, kind: str = REJECTED) -> str:
    """Key of the judge record for a generate record: the generate key itself (the QA id when num_samples is 1),
    prefixed with "calibration:" for a calibration pair."""
    return CALIBRATION_PREFIX + generate_key if kind == CALIBRATION else generate_key


def known_wrong_key(qa_id: str) -> str:
    return KNOWN_WRONG_PREFIX + qa_id


def specificity(known_wrong_rejected: int, known_wrong_total: int) -> float | None:
    """The share of known-wrong pairs the judge called WRONG; None when none was measured."""
    return known_wrong_rejected / known_wrong_total if known_wrong_total else None


def judge_trusted(known_wrong_rejected: int, known_wrong_total: int, min_specificity: float) -> bool:
    """The leniency gate of one family: its promotions count only when the judge rejected at least
    `min_specificity` of its known-wrong pairs. Unmeasured (no known-wrong pair) is untrusted, unless the gate is
    off (`min_specificity` 0)."""
    if min_specificity <= 0:
        return True
    rate = specificity(known_wrong_rejected, known_wrong_total)
    return rate is not None and rate >= min_specificity


def route(
    generate_record: dict[str, Any],
    judge_record: dict[str, Any] | None,
    judge_enabled: bool,
    *,
    judged: bool | None = None,
    trusted: bool = True,
) -> tuple[bool, str | None]:
    """(accepted, reason) for one generate record; reason is None when accepted.

    `judged`: whether the record goes to the judge (`goes_to_judge`); None means `needs_judging` (no decisive
    rule). `trusted`: the family passed the leniency gate (`judge_trusted`)."""
    if generate_record["match"]:
        return True, None
    if judged is None:
        judged = needs_judging(generate_record)
    if not judge_enabled or not needs_judging(generate_record):
        return False, generate_record.get("reason")
    if not judged:  # a decisive mismatch: final
        return False, "wrong_answer"
    if judge_record is None:
        raise JudgeMissingError(
            f"QA pair {generate_record['key']!r} was rejected by the verifier but has no judge verdict; "
            "run `rsgen judge` (or `rsgen run`) to finish the judge stage"
        )
    verdict = judge_record["verdict"]
    if verdict == CORRECT:
        return (True, None) if trusted else (False, WITHHELD)
    if verdict == WRONG:
        return False, "wrong_answer"
    if verdict == UNSURE:
        return False, "judge_unsure"
    raise ValueError(f"judge record {judge_record['key']!r} has an unknown verdict {verdict!r}")
