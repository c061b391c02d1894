"""The per-round table `rsgen iterate` prints at the end (the same figures as iterate.json and the card)."""

from __future__ import annotations

from typing import Any


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def loss_span(training: dict[str, Any]) -> str:
    """First and last logged training loss of a round, e.g. `1.234 -> 0.567`."""
    losses = training.get("losses") or []
    if not losses:
        return "-"
    return f"{losses[0][1]:.3f} -> {losses[-1][1]:.3f}"


def rounds_table(data: dict[str, Any]) -> str:
    header = (f"{'round':<6} {'held-out verifier':>18} {'held-out + judge':>17} {'train-slice':>12} "
              f"{'kept in final':>14} {'fine-tuned on':>14} {'loss first -> last':>19}  model")
    lines = [header, "-" * (len(header) + 12)]
    for r in data["rounds"]:
        held, train, training = r.get("held_out", {}), r.get("train", {}), r.get("training", {})
        rows = f"{training['rows']} pairs" if "rows" in training else "-"
        if (r.get("dpo") or {}).get("rows"):
            rows += f" + {r['dpo']['rows']} DPO"
        lines.append(f"{r['round']:<6} {_pct(held.get('verifier_rate')):>18} {_pct(held.get('accept_rate')):>17} "
                     f"{_pct(train.get('accept_rate')):>12} {r.get('contributed_accepted', '-'):>14} {rows:>14} "
                     f"{loss_span(training):>19}  {r['model']}")
    held = data["held_out"]
    lines.append(f"held out: {held['images']} images ({held['fraction']:.0%} of each family's), "
                 f"{data['rounds'][0].get('held_out', {}).get('qa', 0)} QA pairs; accept rates are greedy")
    if data.get("stopped"):
        lines.append(f"stopped early: {data['stopped']}")
    return "\n".join(lines)


def print_rounds_table(data: dict[str, Any]) -> None:
    print("\n" + rounds_table(data))
