"""The figures and tables of the dataset card, each computed from stats.json alone (rsgen/emit/card.py hands them
to the card template as `card_context`). Tables are markdown strings built from rows; the sentences around
figures come from the macros of card_parts.jinja (`card_parts()`), so the words live in templates, not here."""

from __future__ import annotations

import functools
import html
from pathlib import Path
from typing import Any

from rsgen.emit.card_header import DERIVED_LICENSE_NAME
from rsgen.emit.plots import ITERATE_PLOT_NAME, PASS_RATE_PLOT_NAME
from rsgen.emit.splits import EmitError

# ------------------------------------------------------------------------------------------------ helpers


def _n(value: int) -> str:
    return f"{value:,}"


def _rate(value: float) -> str:
    return f"{value:.1%}"


def _cell(text: str | None) -> str:
    if text is None:
        return "*(none)*"
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r\n", "\n").replace("\n", "<br>")


def _table(head: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    return "\n".join([line(head), "|---" * len(head) + "|", *(line(row) for row in rows)])


def _fraction(num: int, den: int) -> str:
    return f"{_n(num)}/{_n(den)}"


def _size(nbytes: int) -> str:
    """Decimal units, as the Hub shows sizes."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


def _pct(value: float | None) -> str:
    return "–" if value is None else _rate(value)


@functools.cache
def card_parts():
    """The macros of card_parts.jinja, callable from Python (`card_parts().license_other(...)`): the card's prose
    beside its template, rendered with the same formatting helper `n` the template gets."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), autoescape=False)
    env.globals["n"] = _n
    return env.get_template("card_parts.jinja").module


# ------------------------------------------------------------------------------------------------ figures


def _verifier_names(stats: dict[str, Any]) -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for family, fam in stats["families"].items():
        used.setdefault(fam["verifier"], []).append(family)
    return dict(sorted(used.items()))


def overview_table(stats: dict[str, Any]) -> str:
    rows = ["| family | verifier | QA pairs | accepted | rejected | accept rate | judge promotions |",
            "|---|---|---|---|---|---|---|"]
    for family, fam in stats["families"].items():
        promoted = _n(fam["judge"]["promoted"]) if fam["judge"]["enabled"] else "judge off"
        rows.append(f"| {family} | `{fam['verifier']}` | {_n(fam['prepared_qa'])} | {_n(fam['accepted_qa'])} | "
                    f"{_n(fam['rejected_qa'])} | **{_rate(fam['accept_rate'])}** | {promoted} |")
    t = stats["totals"]
    rows.append(f"| **all** | | {_n(t['prepared_qa'])} | {_n(t['accepted_qa'])} | {_n(t['rejected_qa'])} | "
                f"**{_rate(t['accept_rate'])}** | |")
    return "\n".join(rows)


def disk_bytes(stats: dict[str, Any]) -> dict[str, int]:
    """Bytes of parquet on disk per config kind, over all families."""
    out: dict[str, int] = {}
    for fam in stats["families"].values():
        for kind, split in fam["splits"].items():
            out[kind] = out.get(kind, 0) + split["download_size"]
    return out


def family_tables(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family: its configs side by side (rows, QA pairs, shards, size) and its accept/reject summary."""
    out = []
    for family, fam in stats["families"].items():
        splits = fam["splits"].values()
        split_rows = [[label, *(fmt(split[key]) for split in splits)]
                      for label, key, fmt in (("rows", "rows", _n), ("QA pairs", "qa_pairs", _n),
                                              ("shards", "shards", _n), ("size on disk", "download_size", _size))]
        summary = [["accepted / rejected (whole family)", f"{_n(fam['accepted_qa'])} / {_n(fam['rejected_qa'])}"],
                   ["accept rate", f"**{_rate(fam['accept_rate'])}**"],
                   ["verifier", f"`{fam['verifier']}`"]]
        if fam["rejected_reasons"]:
            summary.append(["rejected by reason",
                            ", ".join(f"`{r}` {_n(c)}" for r, c in fam["rejected_reasons"].items())])
        skipped = (fam["splits"].get("dpo") or {}).get("skipped") or {}
        if any(skipped.values()):
            summary.append(["rejected pairs without a DPO pair",
                            ", ".join(f"{why} {_n(c)}" for why, c in skipped.items() if c)])
        out.append({
            "family": family,
            "split_table": _table(["", *(f"`{split['config']}`" for split in splits)], split_rows),
            "summary_table": _table(["", ""], summary),
            "empty_configs": [split["config"] for split in splits if not split["rows"]],
        })
    return out


def tokens_table(stats: dict[str, Any]) -> str:
    """Tokens per family, then the notes of card_parts.jinja (tokens, cost and server requests by stage)."""
    rows = []
    for family, fam in stats["families"].items():
        tok = fam["tokens"]
        rows.append([family, _n(tok["samples"]), _n(tok["prompt"]), _n(tok["generated"]), _n(tok["hit_limit"]),
                     _n(tok["judge_generated"])])
    table = _table(["family", "responses", "prompt tokens", "generated tokens", "stopped at the token limit",
                    "judge tokens"], rows)
    samples = sum(f["tokens"]["samples"] for f in stats["families"].values())
    with_reasoning = sum(f["tokens"].get("with_reasoning", samples) for f in stats["families"].values())
    # tokens_by_stage: stats.json written before the openai engine lacks it
    return table + card_parts().token_notes(
        engine=stats.get("engine", "transformers"), by_stage=stats.get("tokens_by_stage"), cost=stats.get("cost"),
        requests=stats.get("server_requests"),
        no_reasoning=bool(stats["generation"]["enable_thinking"] and samples and not with_reasoning))


def judge_table(stats: dict[str, Any]) -> str:
    rows = []
    for family, fam in stats["families"].items():
        j, c = fam["judge"], fam["calibration"]
        agreed = _fraction(c["agreed"], c["total"]) if c else "–"
        rejected = _fraction(c["known_wrong_rejected"], c["known_wrong_total"]) if c and "known_wrong_total" in c \
            else "–"
        recovered = (_fraction(c["known_right_promoted"], c["known_right_total"]) if c and c.get("known_right_total")
                     else "–")
        rows.append([family, _n(j.get("decisive", 0)), _n(j["judged"]), _n(j["promoted"]), _n(j.get("withheld", 0)),
                     _n(j["wrong"]), _n(j["unsure"]), agreed, rejected, recovered])
    return _table(["family", "decisive (not judged)", "judged", "promoted (`CORRECT`)", "withheld", "`WRONG`",
                   "`UNSURE`", "accepted pairs `CORRECT`", "known-wrong pairs `WRONG`", "known-right pairs `CORRECT`"],
                  rows)


FORM_WORDS = {  # how each form of a built calibration pair reads (rsgen.judge.calibration)
    "near_number": "the reference's number moved just beyond the tolerance",
    "neighbour_letter": "the neighbouring option letter",
    "number_word": "a number word",
    "other_word": "another question's reference",
    "option_text": "an option's text in a sentence",
    "sentence": "a sentence around the value",
    "unrelated": "an unrelated answer",
    "count_noun": "a count with its noun",
    "article": "an article",
    "plural": "a plural",
}


def _forms(forms: dict[str, dict[str, int]] | None) -> str:
    return ", ".join(f"{FORM_WORDS.get(form, form)} (`{form}`) {_fraction(c['as_expected'], c['total'])}"
                     for form, c in (forms or {}).items())


def calibration_figures(calib: dict[str, Any] | None) -> dict[str, Any] | None:
    """The three sides of the calibration, formatted: agreement on verifier-accepted pairs, `WRONG` on known-wrong
    pairs (and the false-promotion rate that implies) and `CORRECT` on known-right pairs (recall), with the mix of
    forms of each built side."""
    if not calib:
        return None
    # stats.json written before #13 / #23 lacks the built sides
    calib = {"known_wrong_rejected": 0, "known_wrong_total": 0, "known_right_promoted": 0, "known_right_total": 0,
             **calib}
    out = {key: _n(value) for key, value in calib.items() if isinstance(value, int)}
    out["total"] = calib["total"]  # the template tests these for zero
    out["known_wrong_total"] = calib["known_wrong_total"] and _n(calib["known_wrong_total"])
    out["known_right_total"] = calib["known_right_total"] and _n(calib["known_right_total"])
    out["known_wrong_forms"] = _forms(calib.get("known_wrong_forms"))
    out["known_right_forms"] = _forms(calib.get("known_right_forms"))
    if calib["known_wrong_total"]:
        promoted = calib["known_wrong_total"] - calib["known_wrong_rejected"]
        out["false_promotion_rate"] = _rate(promoted / calib["known_wrong_total"])
    if calib["known_right_total"]:
        out["recall"] = _rate(calib["known_right_promoted"] / calib["known_right_total"])
    return out


def calibration_examples(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family and side, the first few calibration pairs with the judge's verdict, for a reader to check."""
    sides = (("accepted", "verifier-accepted pairs (should be `CORRECT`)"),
             ("known_wrong", "known-wrong pairs (should be `WRONG`)"),
             ("known_right", "known-right pairs (should be `CORRECT`)"))
    out = []
    for family, fam in stats["families"].items():
        examples = (fam.get("calibration") or {}).get("examples") or {}
        for side, title in sides:
            shown = examples.get(side, [])[:3]
            if shown:
                out.append({"family": family, "title": title, "table": _table(
                    ["question", "reference", "candidate", "form", "verdict"],
                    [[_cell(e["question"]), _cell(e["reference"]), _cell(e["candidate"]), e.get("form") or "–",
                      f"`{e['verdict']}`"] for e in shown])})
    return out


def gate_figures(stats: dict[str, Any]) -> dict[str, Any]:
    """The leniency gate's threshold and the families whose promotions it withheld."""
    minimum = stats.get("judge_min_specificity", 0.95)
    withheld = []
    for family, fam in stats["families"].items():
        if not fam["judge"].get("gate", {}).get("withheld"):
            continue
        c = fam["calibration"] or {"known_wrong_rejected": 0, "known_wrong_total": 0}
        withheld.append({"family": family, "known_wrong_rejected": _n(c["known_wrong_rejected"]),
                         "known_wrong_total": c["known_wrong_total"] and _n(c["known_wrong_total"]),
                         "specificity": _rate(fam["judge"]["gate"]["specificity"]) if c["known_wrong_total"] else None,
                         "withheld": fam["judge"]["withheld"]})
    never = [family for family, fam in stats["families"].items()
             if fam["judge"].get("enabled", True) and fam["judge"].get("gate", {}).get("consulted") is False]
    little = []
    for family, fam in stats["families"].items():
        gate, c = fam["judge"].get("gate", {}), fam["calibration"] or {}
        if gate.get("adds_little"):
            little.append({"family": family, "promoted": _n(c["known_right_promoted"]),
                           "total": _n(c["known_right_total"]), "recall": _rate(gate["recall"])})
    return {"off": minimum <= 0, "min_specificity": _rate(minimum), "withheld": withheld, "never_consulted": never,
            "adds_little": little, "min_recall": _rate(stats.get("judge_min_recall", 0.5))}


def spot_checks(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """Per family, up to 10 promoted pairs (and up to 10 the gate withheld), for a reader to check."""
    out = []
    for family, fam in stats["families"].items():
        judge = fam["judge"]
        for kind, pairs, count in (("promoted", judge.get("promotions"), judge["promoted"]),
                                   ("withheld", judge.get("withheld_promotions"), judge.get("withheld", 0))):
            if pairs:
                table = _table(["question", "reference", "the judge's `CORRECT` answer"],
                               [[_cell(p["question"]), _cell(p["reference"]), _cell(p["candidate"])] for p in pairs])
                out.append({"family": family, "kind": kind, "count": count, "shown": len(pairs), "table": table})
    return out


def explore_figures(stats: dict[str, Any]) -> dict[str, Any] | None:
    """Pair hunting: what the explore pass drew and found, per family (None without one)."""
    explored = {f: fam["explore"] for f, fam in stats["families"].items() if fam.get("explore")}
    if not explored:
        return None
    rows = []
    for family, e in explored.items():
        pairs = _n(e["pairs"]) if e["pairs"] is not None else "view not written"
        per_pair = f"{e['samples_per_pair']:.1f}" if e["samples_per_pair"] is not None else "–"
        rows.append([family, _n(e["questions"]), _n(e["responses"]), _n(e["explore_samples"]), pairs, per_pair,
                     f"{_n(e['learnable'])} ({_rate(e['learnable_share'])})", _rate(e["mean_pass_rate"])])
    bins = next(iter(explored.values()))["pass_rate_histogram"]["bins"]
    histogram = [[family, *(_n(c) for c in e["pass_rate_histogram"]["counts"])] for family, e in explored.items()]
    low, high = stats["generation"].get("grpo_pass_rate_band", [0.0, 1.0])  # older stats.json: the fixed band
    band_rows = [[family, _n(e["grpo_band"]["below"]), _n(e["grpo_band"]["inside"]), _n(e["grpo_band"]["above"])]
                 for family, e in explored.items() if e.get("grpo_band")]
    return {
        "band": f"{low:g} < pass rate < {high:g}",
        "band_table": (_table(["family", f"below (pass rate ≤ {low:g})", "inside: `_grpo` rows",
                               f"above (pass rate ≥ {high:g})"], band_rows) if band_rows else None),
        "table": _table(["family", "questions", "responses drawn", "explore samples", "on-policy pairs",
                         "samples per pair", "learnable (0 < pass rate < 1)", "mean pass rate"], rows),
        "histogram": _table(["family", *(f"`{b}`" for b in bins)], histogram),
        "plot_name": PASS_RATE_PLOT_NAME,
    }


def training_figures(stats: dict[str, Any]) -> dict[str, str]:
    """Where the snippet loads from, and a family that has both views, so the snippet runs as written."""
    families = stats["families"]
    both = [f for f, fam in families.items()
            if all((fam["splits"].get(view) or {}).get("rows") for view in ("sft", "dpo"))]
    return {"repo": stats["card"].get("hub_dataset_id") or "path/to/dataset",
            "family": both[0] if both else next(iter(families), "Family")}


def _by_reason(counts: dict[str, int], group: str) -> list[tuple[str, int]]:
    """The nonzero counts of `group.REASON` keys, as (REASON, count)."""
    return [(k[len(group) + 1:], v) for k, v in counts.items() if k.startswith(group + ".") and v]


def _report_line(counts: dict[str, int]) -> str:
    """One family's (or the pool's) prepare counts: QA pairs read, kept, dropped and merged, by reason."""
    reasons = {group: _by_reason(counts, group) for group in ("dropped", "merged", "converted", "images.dropped")}
    return card_parts().report_line(counts=counts, reasons=reasons)


def cleaning_figures(stats: dict[str, Any]) -> dict[str, Any]:
    """The cleaning steps recorded on the rows (rows per family) and what prepare's report says it removed."""
    policy = stats.get("cleaning_policy") or {}
    policy_steps = policy.get("steps") or {}
    steps: dict[str, dict[str, int]] = {}
    for family, fam in stats["families"].items():
        for step, rows in fam["cleaning"]["steps"].items():
            steps.setdefault(step, {})[family] = rows
    pool = next(iter(stats["families"].values()), {}).get("cleaning", {}).get("report", {}).get("pool", {})
    return {
        "policy_version": policy.get("policy_version"),
        "steps": [{"label": label, "name": label.split("@")[0],
                   "does": (policy_steps.get(label.split("@")[0]) or {}).get("does"),
                   "rows_per_family": ", ".join(f"{family} {_n(n)}" for family, n in per_family.items())}
                  for label, per_family in sorted(steps.items())],
        "report": [(family, _report_line(fam["cleaning"]["report"]["family"]))
                   for family, fam in stats["families"].items() if fam["cleaning"]["report"]["family"]],
        "pool": _report_line(pool) if pool else None,
        "decontamination": decontamination_text(stats.get("decontamination")),
    }


def blind_figures(stats: dict[str, Any]) -> dict[str, Any] | None:
    """Per family: accepted pairs asked blind, the blind-solvable share, the chance rate of the multiple-choice
    ones beside it, how many were dropped; and a few examples (None without a blind check)."""
    blind = {family: fam["blind"] for family, fam in stats["families"].items() if fam.get("blind")}
    if not blind:
        return None
    rows = ["| family | accepted pairs asked blind | blind-solvable | share | multiple choice asked | MC chance rate "
            "| dropped |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for family, b in blind.items():
        chance = _rate(b["mc_chance_rate"]) if b["mc_chance_rate"] is not None else "--"
        rows.append(f"| {family} | {_n(b['checked'])} | {_n(b['solvable'])} | **{_rate(b['share'])}** | "
                    f"{_n(b['mc_checked'])} | {chance} | {_n(b['dropped'])} |")
    return {"table": "\n".join(rows),
            "examples": [(family, b["examples"][:3]) for family, b in blind.items() if b["examples"]]}


def license_section(stats: dict[str, Any]) -> str:
    """The license text of `license: other` (the card shows it, and LICENSE.md holds it for `license_link`)."""
    name = stats["card"].get("license_name") or DERIVED_LICENSE_NAME
    return card_parts().license_other(stats=stats, license_name=name)


def decontamination_text(decon: dict[str, Any] | None) -> str:
    """Which evaluation sets the pool was checked against, and how many QA pairs (and images) each removed."""
    return card_parts().decontamination(decon=decon)


def fine_tuned_on(round_: dict[str, Any]) -> str:
    """What a round's model was trained on: its SFT pairs, then its on-policy DPO pairs (with iterate_dpo)."""
    training = round_.get("training") or {}
    rows = f"{_n(training['rows'])} pairs" if "rows" in training else "–"
    if (round_.get("dpo") or {}).get("rows"):
        rows += f", then DPO on {_n(round_['dpo']['rows'])} on-policy pairs"
    return rows


def _truth_change(now: dict[str, Any], before: dict[str, Any]) -> str:
    """A held-out truth rate's change in points with its standard error (rounds taken as independent samples:
    conservative, as `rsgen.iterate.report.rate_change` says)."""
    p1, p0, n1, n0 = now.get("truth_rate"), before.get("truth_rate"), now.get("qa") or 0, before.get("qa") or 0
    if p1 is None or p0 is None or not n1 or not n0:
        return "–"
    return f"{100 * (p1 - p0):+.1f} ± {100 * ((p1 * (1 - p1) / n1 + p0 * (1 - p0) / n0) ** 0.5):.1f}"


def iterate_figures(stats: dict[str, Any]) -> dict[str, Any] | None:
    """`rsgen iterate`: the rounds table, the held-out curve per family and, on the demo pool, each round graded
    against the scene (None without iterate)."""
    it = stats.get("iterate")
    if not it:
        return None
    rounds = it["rounds"]
    graded = any("truth_rate" in r["held_out"] for r in rounds)
    rows = []
    for i, r in enumerate(rounds):
        training = r.get("training") or {}
        losses = training.get("losses") or []
        truth = [_pct(r["held_out"].get("truth_rate")),
                 _truth_change(r["held_out"], rounds[i - 1]["held_out"]) if i else "–",
                 f"{_n(r['truth']['accepted_wrong'])} of {_n(r['truth']['accepted'])}" if "truth" in r else "–"]
        rows.append([str(r["round"]), f"`{r['model']}`", _pct(r["held_out"]["verifier_rate"]),
                     _pct(r["held_out"]["accept_rate"]), *(truth if graded else []), _pct(r["train"]["accept_rate"]),
                     _n(r.get("contributed_accepted", 0)),
                     fine_tuned_on(r),
                     f"{losses[0][1]:.3f} → {losses[-1][1]:.3f}" if losses else "–"])
    truth_headers = ["held-out right by the scene", "change (points ± se)", "accepted pairs that contradict the scene"]
    families = sorted({f for r in rounds for f in r["held_out"]["families"]})
    return {
        "rounds": len(rounds),
        "base_model": it["base_model"],
        "judge_model": it.get("judge_model") or it["base_model"],
        "from_base": it["iterate_from"] == "base",
        "dpo": any("dpo" in r for r in rounds),
        "graded": graded,
        "held_out_images": _n(it["held_out"]["images"]),
        "held_out_fraction": f"{it['held_out']['fraction']:.0%}",
        "rounds_table": _table(["round", "model", "held-out accept (verifier)", "held-out accept (verifier + judge)",
                                *(truth_headers if graded else []), "training-slice accept",
                                "accepted pairs kept here", "fine-tuned on", "SFT loss (first → last step)"], rows),
        "family_table": _table(["family", *(f"round {r['round']}" for r in rounds)],
                               [[family, *(_pct(r["held_out"]["families"].get(family, {}).get("verifier_rate"))
                                           for r in rounds)] for family in families]),
        "plot_name": ITERATE_PLOT_NAME,
        "stopped": it.get("stopped"),
    }


TRAINING_VALUE_KEYS = ("lines", "held_out", "command", "commit", "date", "wall_seconds", "load_average", "notes")
TRAINING_VALUE_LINE_KEYS = ("line", "fine_tuned_on", "steps", "verifier_rate", "truth_rate", "truth_change_points",
                            "truth_change_se", "truth_change_paired_se")


def training_value_figures(stats: dict[str, Any], where: str = "stats.json's training_value") -> dict[str, Any] | None:
    """bench/bench_training_value.py's table ("What the data is worth"): every line's held-out verifier rate, rate
    right by the scene and change against the base, the held-out size, and the command, commit, date, wall time and
    load it was measured with (None without it). A table missing any of these is an EmitError: the card shows a
    measured table whole or not at all."""
    value = stats.get("training_value")
    if value is None:
        return None
    missing = [key for key in TRAINING_VALUE_KEYS if not isinstance(value, dict) or key not in value]
    lines = value.get("lines") if isinstance(value, dict) else None
    if not missing and (not isinstance(lines, list) or not lines):
        missing = ["lines (at least one)"]
    for i, line in enumerate(lines if not missing else []):
        missing += [f"lines[{i}].{key}" for key in TRAINING_VALUE_LINE_KEYS if not isinstance(line, dict) or key not in line]
    if not missing and not {"qa", "images"} <= set(value["held_out"] or {}):
        missing = ["held_out.qa / held_out.images"]
    if missing:
        raise EmitError(f"{where}: the table of what the data is worth lacks {', '.join(missing)}; it is written by "
                        "bench/bench_training_value.py (rerun it, or remove the file)")

    def change(line: dict[str, Any]) -> str:
        if line["truth_change_points"] is None:
            return "–"
        return f"{line['truth_change_points']:+.1f} ± {line['truth_change_se']:.1f}"

    def paired(line: dict[str, Any]) -> str:
        return "–" if line["truth_change_paired_se"] is None else f"{line['truth_change_paired_se']:.1f}"

    rows = [[line["line"], line["fine_tuned_on"], _n(line["steps"]), _pct(line["verifier_rate"]),
             _pct(line["truth_rate"]), change(line), paired(line)] for line in value["lines"]]
    return {
        "table": _table(["line", "fine-tuned on", "optimizer steps", "held-out accept (verifier)",
                         "held-out right by the scene", "right by the scene vs base (points ± se)", "paired se"],
                        rows),
        "held_out_qa": _n(value["held_out"]["qa"]),
        "held_out_images": _n(value["held_out"]["images"]),
        "command": value["command"],
        "commit": value["commit"],
        "date": value["date"],
        "wall_minutes": f"{value['wall_seconds'] / 60:.1f}",
        "load": " / ".join(f"{x:.1f}" for x in value["load_average"]),
        "notes": value["notes"],
    }
