"""Read the figures back out of a rendered dataset card and compare them with stats.json, table by table.

Shared by the card tests (tests/emit) and the demo runs (tests/demo): whatever the template does with the words,
every number the card shows must be the one stats.json holds.
"""

from __future__ import annotations

import re
from typing import Any


def n(value: int) -> str:
    return f"{value:,}"


def rate(value: float) -> str:
    return f"{value:.1%}"


def table_after(text: str, header_start: str) -> list[list[str]]:
    """The body rows (cells stripped) of the first markdown table whose header line starts with `header_start`."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]])
    return rows


def section(text: str, heading: str) -> str:
    """The text under a `### heading` line, up to the next heading of any level."""
    body = text.split(f"\n{heading}\n", 1)[1]
    return re.split(r"\n#{1,4} ", body, maxsplit=1)[0]


def assert_card_figures_match_stats(card: str, stats: dict[str, Any]) -> int:
    """Every table of figures on the card equals stats.json; returns how many figures were compared."""
    compared = 0

    def same(shown: list[str], expected: list[str], where: str) -> None:
        nonlocal compared
        assert shown == expected, f"{where}: card shows {shown}, stats.json says {expected}"
        compared += len(expected)

    families = stats["families"]
    overview = {row[0]: row for row in table_after(card, "| family | verifier | QA pairs |")}
    for family, fam in families.items():
        promoted = n(fam["judge"]["promoted"]) if fam["judge"]["enabled"] else "judge off"
        same(overview[family][1:], [f"`{fam['verifier']}`", n(fam["prepared_qa"]), n(fam["accepted_qa"]),
                                    n(fam["rejected_qa"]), f"**{rate(fam['accept_rate'])}**", promoted],
             f"overview {family}")
    t = stats["totals"]
    same(overview["**all**"][2:6], [n(t["prepared_qa"]), n(t["accepted_qa"]), n(t["rejected_qa"]),
                                    f"**{rate(t['accept_rate'])}**"], "overview totals")

    for family, fam in families.items():
        part = section(card, f"### {family}")
        splits = list(fam["splits"].values())
        configs = table_after(part, "| | `")
        for row, key in zip(configs[:3], ("rows", "qa_pairs", "shards")):
            same(row[1:], [n(split[key]) for split in splits], f"{family} configs {key}")
        summary = {row[0]: row[1] for row in table_after(part, "| | |")}
        same([summary["accepted / rejected (whole family)"], summary["accept rate"]],
             [f"{n(fam['accepted_qa'])} / {n(fam['rejected_qa'])}", f"**{rate(fam['accept_rate'])}**"],
             f"{family} summary")
        if fam["rejected_reasons"]:
            same([summary["rejected by reason"]],
                 [", ".join(f"`{r}` {n(c)}" for r, c in fam["rejected_reasons"].items())], f"{family} reasons")

    tokens = {row[0]: row[1:] for row in table_after(card, "| family | responses |")}
    for family, fam in families.items():
        tok = fam["tokens"]
        same(tokens[family], [n(tok[k]) for k in ("samples", "prompt", "generated", "hit_limit", "judge_generated")],
             f"tokens {family}")

    if stats["judge_enabled"]:
        judged = {row[0]: row[1:] for row in table_after(card, "| family | decisive (not judged) |")}
        for family, fam in families.items():
            j, c = fam["judge"], fam["calibration"]
            same(judged[family], [n(j["decisive"]), n(j["judged"]), n(j["promoted"]), n(j["withheld"]),
                                  n(j["wrong"]), n(j["unsure"]),
                                  f"{n(c['agreed'])}/{n(c['total'])}" if c else "–",
                                  f"{n(c['known_wrong_rejected'])}/{n(c['known_wrong_total'])}" if c else "–",
                                  f"{n(c['known_right_promoted'])}/{n(c['known_right_total'])}"
                                  if c and c.get("known_right_total") else "–"],
                 f"judge {family}")
        calib, counts = stats["calibration"], stats["judge_counts"]
        if calib and calib["total"] and calib["known_wrong_total"]:
            for sentence in (f"it agreed on {n(calib['agreed'])}/{n(calib['total'])} answers the verifier accepted",
                             f"it said `WRONG` to {n(calib['known_wrong_rejected'])}/{n(calib['known_wrong_total'])} "
                             "questions"):
                assert sentence in card, sentence
            compared += 4
        if calib and calib.get("known_right_total"):
            sentence = (f"it said `CORRECT` to {n(calib['known_right_promoted'])}/{n(calib['known_right_total'])} "
                        "right answers")
            assert sentence in card, sentence
            compared += 2
        paths = (f"{n(counts['judged'])} answers were graded by the judge, {n(counts['promoted'])} QA pairs promoted "
                 f"and {n(counts['withheld'])} promotions withheld")
        assert paths in card, paths
        compared += 3

    explored = {f: fam["explore"] for f, fam in families.items() if fam.get("explore")}
    if explored:
        table = {row[0]: row[1:] for row in table_after(card, "| family | questions | responses drawn |")}
        for family, e in explored.items():
            same(table[family][:3], [n(e["questions"]), n(e["responses"]), n(e["explore_samples"])],
                 f"explore {family}")
            same(table[family][5:], [f"{n(e['learnable'])} ({rate(e['learnable_share'])})",
                                     rate(e["mean_pass_rate"])], f"explore {family}")
    return compared
