"""The per-round table `rsgen iterate` prints at the end (the same figures as iterate.json and the card)."""

from __future__ import annotations

import math
from typing import Any


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def loss_span(training: dict[str, Any]) -> str:
    """First and last logged training loss of a round, e.g. `1.234 -> 0.567`."""
    losses = training.get("losses") or []
    if not losses:
        return "-"
    return f"{losses[0][1]:.3f} -> {losses[-1][1]:.3f}"


def rate_change(now: dict[str, Any], before: dict[str, Any], key: str = "truth_rate") -> tuple[float, float] | None:
    """(change in points, its standard error in points) of a held-out rate between two rounds. The standard error
    treats the two rounds as independent samples of their size (sqrt(p1 q1 / n1 + p0 q0 / n0)); the rounds answer
    the same questions, so this overstates it when their answers are correlated: a conservative error bar."""
    p1, p0, n1, n0 = now.get(key), before.get(key), now.get("qa") or 0, before.get("qa") or 0
    if p1 is None or p0 is None or not n1 or not n0:
        return None
    return 100 * (p1 - p0), 100 * math.sqrt(p1 * (1 - p1) / n1 + p0 * (1 - p0) / n0)


def change_text(change: tuple[float, float] | None) -> str:
    return "-" if change is None else f"{change[0]:+.1f} ± {change[1]:.1f}"


def truth_graded(data: dict[str, Any]) -> bool:
    """Whether the rounds were graded against the demo pool's truth (rsgen.iterate.measure)."""
    return any("truth_rate" in r.get("held_out", {}) for r in data["rounds"])


def rounds_table(data: dict[str, Any]) -> str:
    graded = truth_graded(data)
    truth_header = f" {'held-out truth':>15} {'change ± se':>13}" if graded else ""
    header = (f"{'round':<6} {'held-out verifier':>18} {'held-out + judge':>17}{truth_header} {'train-slice':>12} "
              f"{'kept in final':>14} {'fine-tuned on':>14} {'loss first -> last':>19}  model")
    lines = [header, "-" * (len(header) + 12)]
    for i, r in enumerate(data["rounds"]):
        held, train, training = r.get("held_out", {}), r.get("train", {}), r.get("training", {})
        rows = f"{training['rows']} pairs" if "rows" in training else "-"
        if (r.get("dpo") or {}).get("rows"):
            rows += f" + {r['dpo']['rows']} DPO"
        truth = ""
        if graded:
            change = rate_change(held, data["rounds"][i - 1].get("held_out", {})) if i else None
            truth = f" {_pct(held.get('truth_rate')):>15} {change_text(change):>13}"
        lines.append(f"{r['round']:<6} {_pct(held.get('verifier_rate')):>18} {_pct(held.get('accept_rate')):>17}"
                     f"{truth} {_pct(train.get('accept_rate')):>12} {r.get('contributed_accepted', '-'):>14} "
                     f"{rows:>14} {loss_span(training):>19}  {r['model']}")
    held = data["held_out"]
    lines.append(f"held out: {held['images']} images ({held['fraction']:.0%} of each family's), "
                 f"{data['rounds'][0].get('held_out', {}).get('qa', 0)} QA pairs; accept rates are greedy")
    if data.get("judge_model"):
        lines.append(f"judge in every round: {data['judge_model']} (never a fine-tuned model grading itself)")
    if graded:
        lines.append(truth_lines(data))
    if data.get("stopped"):
        lines.append(f"stopped early: {data['stopped']}")
    return "\n".join(lines)


def truth_lines(data: dict[str, Any]) -> str:
    """The demo's truth check per round, and the last round's held-out change over the base."""
    rounds = data["rounds"]
    checks = ", ".join(f"round {r['round']} {r['truth']['accepted_wrong']} of {r['truth']['accepted']}"
                       for r in rounds if "truth" in r)
    text = (f"truth check (accepted pairs that contradict the scene the pool drew): {checks}; held-out truth = greedy "
            "answers that state the scene's answer; change ± se in points against the round before")
    if len(rounds) > 1:
        change = rate_change(rounds[-1].get("held_out", {}), rounds[0].get("held_out", {}))
        text += f"\nheld-out truth, round {rounds[-1]['round']} against the base: {change_text(change)} points"
    return text


def print_rounds_table(data: dict[str, Any]) -> None:
    print("\n" + rounds_table(data))


def main(argv: list[str] | None = None) -> int:
    """`python -m rsgen.iterate.report OUTPUT_DIR`: the table of a loop on disk, finished or still running (the
    rounds iterate.json has measured so far)."""
    import json
    import sys
    from pathlib import Path

    from rsgen.layout import OutputLayout

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m rsgen.iterate.report OUTPUT_DIR", file=sys.stderr)
        return 2
    path = OutputLayout(Path(args[0])).iterate_json
    if not path.is_file():
        print(f"no iterate.json in {args[0]!r}: not an `rsgen iterate` output directory", file=sys.stderr)
        return 2
    data = json.loads(path.read_text(encoding="utf-8"))
    data["rounds"] = [r for r in data.get("rounds", []) if "held_out" in r]  # a running round is not measured yet
    print(rounds_table(data))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
