"""The card's figure, drawn from stats.json only: accept rate per family and the response-length histogram."""

from __future__ import annotations

from pathlib import Path
from typing import Any

PLOT_NAME = "stats.png"
PASS_RATE_PLOT_NAME = "pass_rates.png"
ITERATE_PLOT_NAME = "iterate.png"


def draw_stats_plot(stats: dict[str, Any], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on servers; also keeps the output independent of the backend
    import matplotlib.pyplot as plt

    families = stats["families"]
    names = list(families)
    rates = [100.0 * families[n]["accept_rate"] for n in names]
    fig, (ax_rate, ax_len) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)

    bars = ax_rate.bar(names, rates, color="#4C72B0")
    for bar, rate in zip(bars, rates):
        ax_rate.annotate(f"{rate:.1f}%", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                         ha="center", va="bottom", fontsize=9)
    ax_rate.set_ylim(0, 110)
    ax_rate.set_ylabel("accept rate (%)")
    ax_rate.set_title("Accepted QA pairs per family")
    ax_rate.tick_params(axis="x", labelrotation=20)

    for name in names:
        hist = families[name]["response_lengths"]
        edges, counts = hist["bin_edges"], hist["counts"]
        ax_len.stairs(counts, edges, label=name, linewidth=1.5)
    ax_len.set_xlabel(f"response length ({families[names[0]]['response_lengths']['unit']})" if names else "")
    ax_len.set_ylabel("responses")
    ax_len.set_title("Response lengths")
    if names:
        ax_len.legend(fontsize=8)

    return _save(fig, path)


def draw_pass_rate_plot(stats: dict[str, Any], path: Path) -> Path:
    """Questions per pass-rate bin, one group of bars per family (families with an explore pass)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    explored = {name: fam["explore"] for name, fam in stats["families"].items() if fam.get("explore")}
    bins = next(iter(explored.values()))["pass_rate_histogram"]["bins"]
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    width = 0.8 / len(explored)
    for i, (name, explore) in enumerate(explored.items()):
        counts = explore["pass_rate_histogram"]["counts"]
        total = max(1, sum(counts))
        ax.bar([b + (i - (len(explored) - 1) / 2) * width for b in range(len(bins))],
               [100.0 * c / total for c in counts], width, label=name)
    ax.set_xticks(range(len(bins)), bins)
    ax.set_xlabel("pass rate (correct responses / responses drawn)")
    ax.set_ylabel("questions (%)")
    ax.set_title("Pass rate per question (learnable zone: between 0 and 1)")
    ax.legend(fontsize=8)
    return _save(fig, path)


def draw_iterate_plot(stats: dict[str, Any], path: Path) -> Path:
    """`rsgen iterate`: held-out accept rate per round (all families and each one), and each round's training loss."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = stats["iterate"]["rounds"]
    numbers = [r["round"] for r in rounds]
    fig, (ax_rate, ax_loss) = plt.subplots(1, 2, figsize=(11, 4), dpi=100)

    def percent(values):
        return [100.0 * v if v is not None else float("nan") for v in values]

    ax_rate.plot(numbers, percent([r["held_out"]["verifier_rate"] for r in rounds]), "o-", color="black",
                 linewidth=2, label="all families, verifier")
    ax_rate.plot(numbers, percent([r["held_out"]["accept_rate"] for r in rounds]), "o--", color="black",
                 linewidth=1, label="all families, verifier + judge")
    families = sorted({f for r in rounds for f in r["held_out"]["families"]})
    for family in families:
        ax_rate.plot(numbers, percent([r["held_out"]["families"].get(family, {}).get("verifier_rate") for r in rounds]),
                     "o-", linewidth=1, label=f"{family}, verifier")
    ax_rate.set_xticks(numbers)
    ax_rate.set_xlabel("round (model k answered)")
    ax_rate.set_ylabel("held-out accept rate (%)")
    ax_rate.set_ylim(0, 100)
    ax_rate.set_title("Held-out accept rate per round (greedy)")
    ax_rate.legend(fontsize=7)

    for r in rounds:
        losses = r.get("training", {}).get("losses") or []
        if losses:
            ax_loss.plot([s for s, _ in losses], [v for _, v in losses], linewidth=1.5,
                         label=f"round {r['round']} -> model {r['round'] + 1}")
    ax_loss.set_xlabel("training step")
    ax_loss.set_ylabel("SFT loss")
    ax_loss.set_title("Fine-tuning loss per round")
    if any(r.get("training", {}).get("losses") for r in rounds):
        ax_loss.legend(fontsize=8)
    return _save(fig, path)


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    # No metadata: the PNG must be the same bytes on every render of the same stats.
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
    return path
