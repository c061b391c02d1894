"""Who the judge sees and what its verdict means for a QA pair: the one place these rules are coded (the judge
stage selects its work with them, emit routes every QA pair with them).

- A generate record is judged when the verifier rejected it and it has an extractable answer (`needs_judging`),
  unless the rejection is decisive and `judge_scope` is `undecided` (the default): a number outside the
  verifier's tolerance, or a different option letter, stays `wrong_answer` without asking the judge
  (`rsgen.verifiers.decisive`). Pairs with nothing extractable stay rejected as `no_answer`, pairs whose reference
  the verifier cannot use as `bad_input`.
- Only a `CORRECT` verdict promotes. `WRONG` -> `wrong_answer`, `UNSURE` -> `judge_unsure`; UNSURE never counts.
- The leniency gate: in a family where the judge said WRONG to fewer than `judge_min_specificity` of the
  known-wrong calibration pairs (or where none could be measured), a `CORRECT` is withheld: `judge_withheld`.
  Its recall on known-right pairs (`judge_min_recall`) is reported, never enforced.
- With `judge: false` a rejected pair keeps the verifier's reason.
Calibration records (keys "calibration:{key}", "known_wrong:{id}", "known_right:{id}") never take part in routing.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from rsgen.records import (
    CORRECT,
    REQUEST_FAILED,
    RESPONSE_REASONS,
    UNSURE,
    WRONG,
    GenerateRecord,
    JudgeRecord,
)
from rsgen.verifiers.decision import BAD_INPUT, NO_ANSWER, WRONG_ANSWER
from rsgen.verifiers.decisive import decisive_mismatch

JUDGE_SCOPES = ("undecided", "all")
WITHHELD = "judge_withheld"
JUDGE_UNSURE = "judge_unsure"
BLIND_SOLVABLE = "blind_solvable"
# The reasons routing gives a rejected pair besides the verifier's own (rsgen.verifiers.REASONS, kept as they are with
# judge: false); docs/reasons.md is made from this table.
ROUTING_REASONS: dict[str, str] = {
    WRONG_ANSWER: "the verifier rejected the answer and the judge said WRONG, or the mismatch was decisive (a "
                  "number beyond the tolerance, another option) and never reached the judge",
    JUDGE_UNSURE: "the verifier rejected the answer and the judge said UNSURE (never counts as correct)",
    WITHHELD: "the judge said CORRECT, but in a family whose judge failed the known-wrong calibration "
              "(judge_min_specificity): the promotion is withheld",
    BLIND_SOLVABLE: "accepted, but the model also answered it right without the image (blind_check: drop): in no "
                    "split and no view, counted apart (accepted + rejected + blind-dropped = prepared)",
}


class JudgeMissingError(RuntimeError):
    """A pair that needs a verdict has none: the judge stage did not finish."""


# Rejections no judge can rescue: nothing was answered, or the reference itself cannot be used (bad_input: never
# judged, never promoted, never a DPO pair; it stays bad_input in every count), or the response is no answer at all
# (refused, failed, content null, cut at the token limit: rsgen.records.RESPONSE_REASONS).
UNJUDGEABLE_REASONS = (NO_ANSWER, BAD_INPUT, *RESPONSE_REASONS)


def needs_judging(generate_record: GenerateRecord) -> bool:
    """A verifier rejection with an extractable answer and a usable reference (before the decisive rule)."""
    return (
        not generate_record.match
        and generate_record.extracted is not None
        and generate_record.reason not in UNJUDGEABLE_REASONS
    )


def is_decisive(generate_record: GenerateRecord, answers: Sequence[str], options: Sequence[str] | None,
                numeric_tolerance: float | None) -> bool:
    """A verifier rejection that is final: see `rsgen.verifiers.decisive`."""
    return (
        needs_judging(generate_record)
        and generate_record.reason == WRONG_ANSWER
        and decisive_mismatch(generate_record.verifier or "", generate_record.extracted, list(answers),
                              options=list(options) if options else None, numeric_tolerance=numeric_tolerance)
    )


def goes_to_judge(generate_record: GenerateRecord, answers: Sequence[str], options: Sequence[str] | None,
                  judge_scope: str, numeric_tolerance: float | None) -> bool:
    """Whether the judge grades this record: `needs_judging`, and not decisive unless `judge_scope` is `all`."""
    if not needs_judging(generate_record):
        return False
    return judge_scope == "all" or not is_decisive(generate_record, answers, options, numeric_tolerance)


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


def recall(known_right_promoted: int, known_right_total: int) -> float | None:
    """The share of known-right pairs (verifier false negatives built from the pool) the judge called CORRECT."""
    return known_right_promoted / known_right_total if known_right_total else None


def gate_lines(families: Mapping[str, Mapping[str, int]], min_specificity: float,
               min_recall: float) -> list[tuple[int, str]]:
    """(logging level, line) per family worth a word after the judge: a family whose judge was never consulted
    (every rejection decisive, or none) says so; one whose promotions the leniency gate withholds, and one whose
    judge recovers fewer than `min_recall` of its known-right pairs (report-only), warn.
    `families`: family -> {judged, withheld, known_wrong_rejected, known_wrong_total, known_right_promoted,
    known_right_total}."""
    out = []
    for family, c in families.items():
        if not c["judged"]:
            out.append((logging.INFO, f"family {family}: the judge was never consulted (every verifier rejection "
                                      "was decisive, or there was none); the leniency gate has nothing to decide"))
            continue
        rejected, total = c["known_wrong_rejected"], c["known_wrong_total"]
        if not judge_trusted(rejected, total, min_specificity):
            rate = specificity(rejected, total)
            measured = (f"said WRONG to only {rejected}/{total} known-wrong pairs ({rate:.1%})" if rate is not None
                        else "could not be measured on known-wrong pairs")
            out.append((logging.WARNING, f"family {family}: the judge {measured}, below judge_min_specificity "
                                         f"{min_specificity:.0%}; {c['withheld']} promotion(s) withheld (reason "
                                         f"{WITHHELD})"))
        promoted, right = c["known_right_promoted"], c["known_right_total"]
        rate = recall(promoted, right)
        if rate is not None and rate < min_recall:
            out.append((logging.WARNING, f"family {family}: the judge said CORRECT to only {promoted}/{right} "
                                         f"known-right pairs ({rate:.1%}, below judge_min_recall {min_recall:.0%}): "
                                         "it adds little here, most right answers the verifier rejects stay rejected"))
    return out


def route(
    generate_record: GenerateRecord,
    judge_record: JudgeRecord | None,
    judge_enabled: bool,
    *,
    judged: bool | None = None,
    trusted: bool,
) -> tuple[bool, str | None]:
    """(accepted, reason) for one generate record; reason is None when accepted.

    `judged`: whether the record goes to the judge (`goes_to_judge`); None means `needs_judging` (no decisive
    rule). `trusted`: the family passed the leniency gate (`judge_trusted`); no default, so that a caller cannot
    skip the gate by forgetting it."""
    if generate_record.match:
        return True, None
    if judged is None:
        judged = needs_judging(generate_record)
    if not judge_enabled or not needs_judging(generate_record):
        return False, generate_record.reason
    if not judged:  # a decisive mismatch: final
        return False, WRONG_ANSWER
    if judge_record is None:
        raise JudgeMissingError(
            f"QA pair {generate_record.key!r} was rejected by the verifier but has no judge verdict; "
            "run `rsgen judge` (or `rsgen run`) to finish the judge stage"
        )
    if judge_record.failed:  # the judge's request failed every retry: no verdict yet (the next run asks again)
        return False, REQUEST_FAILED
    verdict = judge_record.verdict
    if verdict == CORRECT:
        return (True, None) if trusted else (False, WITHHELD)
    if verdict == WRONG:
        return False, WRONG_ANSWER
    if verdict == UNSURE:
        return False, JUDGE_UNSURE
    raise ValueError(f"judge record {judge_record.key!r} has an unknown verdict {verdict!r}")
