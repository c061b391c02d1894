"""The dataset card `dataset/README.md`, modelled on the public card of `elliot-mllm/CLEVRMath_rejected` on the Hub.

Every number comes from stats.json; the examples come straight from the written rejected shards (their images
saved, as stored, under `assets/`). Rendering reads nothing else, so `rsgen card OUTPUT_DIR` rebuilds the card
from disk and two renders of the same files are byte-identical.
"""

from __future__ import annotations

import html
import io
import json
import re
from pathlib import Path
from string import Template
from typing import Any

import pyarrow.parquet as pq
from huggingface_hub import DatasetCard, DatasetCardData

from rsgen.emit.plots import (
    ITERATE_PLOT_NAME,
    PASS_RATE_PLOT_NAME,
    PLOT_NAME,
    draw_iterate_plot,
    draw_pass_rate_plot,
    draw_stats_plot,
)
from rsgen.emit.stats import config_features, config_glob

TEMPLATE_PATH = Path(__file__).with_name("card_template.md")
LONG_FIELD_CHARS = 300  # table cells longer than this go into a <details> block instead

VERIFIER_TEXT = {
    "relaxed": (
        "ChartQA relaxed accuracy",
        "The official ChartQA metric. If both the prediction and the reference parse as numbers, the answer is "
        "correct when it lands within **5% relative tolerance** of the reference — chart values are read off axes, "
        "so exact digit agreement is not a fair requirement. Otherwise the two strings must match exactly after "
        "lowercasing, trimming, and dropping a trailing period. Cases the official code leaves open are decided: "
        "thousands separators and a leading `+` are read as numbers (`1,000` = 1000); a reference of 0 needs "
        "exactly 0; `45%` matches both `45` and `0.45`; a unit on one side only (`12 kg` vs `12`) is ignored. "
        "When a question has several acceptable references, matching any one of them counts.",
    ),
    "exact": (
        "exact match",
        "The prediction must equal a reference after the same light normalisation as `relaxed` (lowercasing, "
        "trimming, dropping a trailing period), with no numeric reading: `1,000` does not match `1000` and `5.0` "
        "does not match `5`. Any of several references counts.",
    ),
    "numeric": (
        "numeric equality",
        "Prediction and reference are read as numbers (thousands separators, `+`, currency, units and percent "
        "read as in `relaxed`) and must agree within **{numeric_tolerance}** — absolute for references up to 1 in "
        "magnitude, relative above: |prediction − reference| ≤ {numeric_tolerance} · max(1, |reference|). A "
        "prediction that is not a number is wrong; a reference that is not a number is compared as `exact` "
        "compares strings.",
    ),
    "mc": (
        "multiple choice",
        "The reference is a bare option letter. The model's answer must name exactly one option — as a letter "
        "(`B`, `(B)`, `B.`, `**B**`, `B) sphere`, `The answer is B`) or, failing that, as the text of exactly one "
        "option — and that letter must equal the reference. Two different letters is a non-match with reason "
        "`mc_ambiguous`; no recognisable letter is a non-match with reason `mc_no_letter`.",
    ),
    "math": (
        "mathematical equivalence",
        "Prediction and reference are parsed and compared for mathematical equivalence with "
        "[math-verify](https://github.com/huggingface/Math-Verify) (so `\\frac{{1}}{{2}}` matches `0.5`); answers "
        "equal as strings or as plain numbers match directly. Each item has a hard time limit of "
        "**{math_timeout_seconds} s**; a timeout is a non-match with reason `math_timeout`, never a hang and "
        "never a pass.",
    ),
}

# The seed card's wording for the steps it describes (keyed by rsgen.prepare's step names); any other step is
# described by the "does" text prepare recorded in its report.
STEP_TEXT = {
    "provenance": "**Provenance check.** Each QA item records where it came from; items whose recorded source does "
                  "not resolve to the image they are attached to are dropped.",
    "task_purity": "**Task purity.** Per-source rules (question patterns, source allowlists) keep only the genuine "
                   "benchmark QA of a family; off-task questions attached to its images are dropped.",
    "mc_normalise": "**Multiple-choice normalisation.** Where options had been flattened into prose, they are "
                    "re-rendered as a lettered block and the reference is rewritten to the bare letter, so the task "
                    "is well posed and the answer is unambiguous.",
    "dedup_merge": "**Duplicates merged.** The same question asked twice about the same image is kept once; copies "
                   "with conflicting answers are dropped.",
}


# ------------------------------------------------------------------------------------------------ helpers


def _n(value: int) -> str:
    return f"{value:,}"


def _rate(value: float) -> str:
    return f"{value:.1%}"


def _cell(text: str | None) -> str:
    if text is None:
        return "*(none)*"
    return html.escape(text, quote=False).replace("|", "\\|").replace("\r\n", "\n").replace("\n", "<br>")


def _fence(text: str) -> str:
    runs = [len(m) for m in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)


def _details(name: str, text: str | None) -> str:
    if text is None:
        return f"<details>\n<summary><code>{name}</code> (none: nothing could be extracted)</summary>\n\n</details>"
    fence = _fence(text)
    return (f"<details>\n<summary><code>{name}</code> ({len(text):,} chars)</summary>\n\n"
            f"{fence}\n{text}\n{fence}\n\n</details>")


def _verifier_names(stats: dict[str, Any]) -> dict[str, list[str]]:
    used: dict[str, list[str]] = {}
    for family, fam in stats["families"].items():
        used.setdefault(fam["verifier"], []).append(family)
    return dict(sorted(used.items()))


def configs_of(stats: dict[str, Any]) -> list[str]:
    """Every config with rows (an empty one is not written: `datasets` cannot load a split without rows)."""
    return [split["config"] for fam in stats["families"].values() for split in fam["splits"].values()
            if split["rows"]]


# ------------------------------------------------------------------------------------------------ sections


# The Hub's size buckets (`size_categories`), by number of QA pairs.
SIZE_CATEGORIES = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
                   (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B")]
DERIVED_LICENSE_NAME = "derived-from-sources"
LICENSE_FILE = "LICENSE.md"  # with license: other, the card's license section, linked by `license_link`


def size_category(count: int) -> str:
    return next((name for top, name in SIZE_CATEGORIES if count < top), "n>1B")


def default_config(stats: dict[str, Any]) -> str | None:
    """The config `load_dataset(dir, split="train")` reads: the `_sft` view (what a TRL user trains on) of the first
    family that has one with rows; None when no family has (then no config is the default, and `load_dataset`
    without a config name lists the configs instead of handing out rejected rows as training data)."""
    for fam in stats["families"].values():
        sft = fam["splits"].get("sft") or {}
        if sft.get("rows"):
            return sft["config"]
    return None


def source_datasets(stats: dict[str, Any]) -> list[str]:
    """Hub ids of the sources; `original` for a procedurally drawn pool. Local files are not listed."""
    out = []
    for src in stats["sources"]:
        name = {"hub": src["dataset"], "demo": "original"}.get(src.get("kind", "hub"))
        if name and name not in out:
            out.append(name)
    return out


def card_data(stats: dict[str, Any]) -> DatasetCardData:
    """The card's YAML header, through huggingface_hub (the fields the Hub and `datasets` read)."""
    card = stats["card"]
    license_name = card.get("license_name") or (DERIVED_LICENSE_NAME if card["license"] == "other" else None)
    default = default_config(stats)
    configs = []
    for config in configs_of(stats):
        entry: dict[str, Any] = {"config_name": config}
        if config == default:
            entry["default"] = True
        entry["data_files"] = [{"split": "train", "path": config_glob(config)}]
        configs.append(entry)
    extra = {"license_name": license_name, "license_link": LICENSE_FILE} if card["license"] == "other" else {}
    return DatasetCardData(
        pretty_name=title(stats),
        license=card["license"],
        **extra,
        task_categories=card["task_categories"],
        language=card["language"],
        size_categories=[size_category(stats["totals"]["prepared_qa"])],
        source_datasets=source_datasets(stats) or None,
        tags=["rsgen", "rejection-sampling", "vision-language", "synthetic"],
        configs=configs,
        dataset_info=dataset_infos(stats),
    )


def dataset_infos(stats: dict[str, Any]) -> list[dict[str, Any]]:
    """`dataset_info` entries as `push_to_hub` writes them (through `DatasetInfosDict.to_dataset_card_data`):
    features and sizes per config, so the Hub viewer and `datasets` know the schema without reading a shard.
    (The sizes also make the cache key of a local `load_dataset(dir, config)` change when the content does:
    `datasets` keys it on the card's YAML only.)"""
    from datasets import DatasetInfo, SplitDict, SplitInfo
    from datasets.info import DatasetInfosDict

    infos = DatasetInfosDict()
    for fam in stats["families"].values():
        for kind, split in fam["splits"].items():
            if not split["rows"]:
                continue
            splits = SplitDict()
            splits.add(SplitInfo(name="train", num_bytes=split["num_bytes"], num_examples=split["rows"]))
            infos[split["config"]] = DatasetInfo(
                features=config_features(kind, rounds="iterate" in stats), splits=splits, download_size=split["download_size"],
                dataset_size=split["num_bytes"], config_name=split["config"])
    holder = DatasetCardData()
    infos.to_dataset_card_data(holder)
    entries = holder.to_dict().get("dataset_info", [])
    return entries if isinstance(entries, list) else [entries]


def title(stats: dict[str, Any]) -> str:
    hub_id = stats["card"].get("hub_dataset_id")
    if hub_id:
        return hub_id.split("/")[-1]
    return " · ".join(stats["families"]) + " — rejection-sampled"


def demo_banner(stats: dict[str, Any]) -> str:
    if not stats["card"].get("demo"):
        return ""
    return (
        "\n> **This is a demo dataset.** It was made to show the rsgen pipeline at work (with the tiny demo model that "
        "ships with rsgen, or `demo: true` in its recipe), typically from the procedurally drawn demo pool. Its numbers say "
        "nothing about the quality of a real model; do not train on it.\n"
    )


def pool_description(stats: dict[str, Any]) -> str:
    parts = []
    for src in stats["sources"]:
        where = f"`{src['dataset']}`" + (f" (config `{src['config']}`)" if src.get("config") else "")
        parts.append(f"{where} ({src['split']} split)")
    return "; ".join(parts) or "the pool"


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


def _size(nbytes: int) -> str:
    """Decimal units, as the Hub shows sizes."""
    for unit, scale in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


def disk_bytes(stats: dict[str, Any]) -> dict[str, int]:
    """Bytes of parquet on disk per config kind, over all families."""
    out: dict[str, int] = {}
    for fam in stats["families"].values():
        for kind, split in fam["splits"].items():
            out[kind] = out.get(kind, 0) + split["download_size"]
    return out


def size_on_disk(stats: dict[str, Any]) -> str:
    per_kind = disk_bytes(stats)
    parts = ", ".join(f"`{kind}` {_size(n)}" for kind, n in per_kind.items())
    return (f"On disk the data takes **{_size(sum(per_kind.values()))}** of parquet ({parts}). Every config stores "
            "its images again; the recipe key `views` chooses which TRL views are written.")


def family_table(family: str, fam: dict[str, Any]) -> str:
    splits = fam["splits"]
    head = "| | " + " | ".join(f"`{split['config']}`" for split in splits.values()) + " |"
    sep = "|---" * (len(splits) + 1) + "|"
    lines = [f"### {family}", "", head, sep]
    for label, key, fmt in (("rows", "rows", _n), ("QA pairs", "qa_pairs", _n), ("shards", "shards", _n),
                            ("size on disk", "download_size", _size)):
        lines.append(f"| {label} | " + " | ".join(fmt(split[key]) for split in splits.values()) + " |")
    lines += [
        "",
        "| | |",
        "|---|---|",
        f"| accepted / rejected (whole family) | {_n(fam['accepted_qa'])} / {_n(fam['rejected_qa'])} |",
        f"| accept rate | **{_rate(fam['accept_rate'])}** |",
        f"| verifier | `{fam['verifier']}` |",
    ]
    reasons = fam["rejected_reasons"]
    if reasons:
        lines.append("| rejected by reason | " + ", ".join(f"`{r}` {_n(c)}" for r, c in reasons.items()) + " |")
    skipped = (splits.get("dpo") or {}).get("skipped") or {}
    if any(skipped.values()):
        lines.append("| rejected pairs without a DPO pair | "
                     + ", ".join(f"{why} {_n(c)}" for why, c in skipped.items() if c) + " |")
    empty = [f"`{split['config']}`" for split in splits.values() if not split["rows"]]
    if empty:
        lines += ["", f"{', '.join(empty)}: no rows, so not written (and not listed in the configs)."]
    lines.append("")
    lines.append("In the three splits a row is one image with its QA pairs; in a TRL view a row is one QA pair.")
    return "\n".join(lines)


def license_section(stats: dict[str, Any]) -> str:
    card = stats["card"]
    if card["license"] != "other":
        return f"`{card['license']}`, as set in the recipe (`license`)."
    name = card.get("license_name") or DERIVED_LICENSE_NAME
    sources = ", ".join(f"`{s['dataset']}`" for s in stats["sources"]) or "its sources"
    return (f"`other` (`{name}`): the rows inherit the licenses of the source data ({sources}) and the terms of "
            f"use of the model that wrote the responses (`{stats['model']}`). Set `license` (a Hub license id) or "
            "`license_name` in the recipe when they are known.")


def production(stats: dict[str, Any]) -> str:
    gen = stats["generation"]
    reasoning = "enabled" if gen["enable_thinking"] else "disabled"
    temperature = "temperature 0 (greedy)" if gen["temperature"] == 0 else f"temperature {gen['temperature']}"
    model = f"`{stats['model']}`" + (f" (revision `{stats['model_revision']}`)" if stats.get("model_revision") else "")
    kwargs = json.dumps(gen["chat_template_kwargs"], sort_keys=True)
    samples = ""
    if gen["num_samples"] > 1:
        samples = (f" Each question was sampled {gen['num_samples']} times (top-p {gen['top_p']}); a QA pair is "
                   "accepted when any sample is, and keeps the first accepted response; a rejected pair shows "
                   "sample 0.")
    text = [
        f"The VLM {model} answers every question at {temperature} with reasoning {reasoning} (chat template "
        f"arguments `{kwargs}`), generating at most {_n(gen['max_new_tokens'])} new tokens.{samples} Its answer is "
        "compared with the official ground truth by the verifier described below; matches go to "
        "`{Family}_RS_think` and `{Family}_RS_nothink`, non-matches go to `{Family}_rejected` with the ground "
        "truth preserved.",
        "",
        "The `question` field is **byte-identical to the prompt the model actually received**, including the "
        f"appended instruction (`{gen['instruction']}`), so the stored training text and the inference-time input "
        "cannot drift apart.",
        "",
        "| family | responses | prompt tokens | generated tokens | stopped at the token limit | judge tokens |",
        "|---|---|---|---|---|---|",
    ]
    for family, fam in stats["families"].items():
        tok = fam["tokens"]
        text.append(f"| {family} | {_n(tok['samples'])} | {_n(tok['prompt'])} | {_n(tok['generated'])} | "
                    f"{_n(tok['hit_limit'])} | {_n(tok['judge_generated'])} |")
    wall = stats["wall_time"]
    if wall.get("stages_seconds"):
        stages = ", ".join(f"{name} {secs:,.0f} s" for name, secs in wall["stages_seconds"].items())
        text += ["", f"Wall time as recorded in `run.json`: {stages} (total {wall['total_seconds']:,.0f} s)."]
    return "\n".join(text)


def matching(stats: dict[str, Any]) -> str:
    text = [
        "Before any comparison the final answer is extracted from the raw response: reasoning is removed (only "
        "what follows the last `</think>` counts, and reasoning that never closes means there is no answer); "
        "then the answer is the content of the last `<answer>…</answer>`, else the last `\\boxed{…}`, else what "
        "follows the last explicit final-answer phrase (\"The answer is …\", \"Answer: …\", \"Final answer: …\"), "
        "else the whole remaining text, trimmed. A response with nothing extractable — typically reasoning cut "
        "off at the token limit — is rejected with reason `no_answer`.",
    ]
    params = stats["verify"]
    for name, families in _verifier_names(stats).items():
        label, body = VERIFIER_TEXT.get(name, (name, "A custom verifier registered under this name."))
        text += ["", f"### `{name}` — {label}", "", f"Used for: {', '.join(families)}.", "", body.format(**params)]
    return "\n".join(text)


def _fraction(num: int, den: int) -> str:
    return f"{_n(num)}/{_n(den)}"


FORM_WORDS = {  # how each form of a built calibration pair reads (rsgen.judge.calibration)
    "near_number": "the reference's number moved just beyond the verifier's tolerance",
    "neighbour_letter": "the neighbouring option letter",
    "number_word": "a number written as a word",
    "other_word": "another question's reference",
    "option_text": "an option's text in a sentence",
    "sentence": "a sentence around the value",
    "unrelated": "an unrelated answer",
    "count_noun": "a count with its noun",
    "article": "the reference with an article",
    "plural": "the reference in the plural",
}


def _forms(forms: dict[str, dict[str, int]] | None) -> str:
    return ", ".join(f"{FORM_WORDS.get(form, form)} (`{form}`) {_fraction(c['as_expected'], c['total'])}"
                     for form, c in (forms or {}).items())


def calibration_sentence(calib: dict[str, Any] | None, scope: str = "undecided") -> str:
    """The three sides of the calibration, in words a reader can check: agreement on verifier-accepted pairs,
    `WRONG` on known-wrong pairs (and the false-promotion rate that implies), `CORRECT` on known-right pairs."""
    if not calib:
        return "Calibration: no pairs were available to calibrate the judge on."
    calib = {"known_wrong_rejected": 0, "known_wrong_total": 0, "known_right_promoted": 0, "known_right_total": 0,
             **calib}  # stats.json written before #13 / #23 lacks them
    shown = ("in forms the judge is actually shown (under `judge_scope: undecided` never a decisive mismatch, which "
             "never reaches it)" if scope != "all" else "in every form (`judge_scope: all`)")
    lines = ["Calibration, three sides:", ""]
    lines.append(f"- **Accepted pairs** (it should say `CORRECT`): it agreed on "
                 f"{_fraction(calib['agreed'], calib['total'])} answers the verifier accepted." if calib["total"]
                 else "- **Accepted pairs**: none to agree with.")
    if calib["known_wrong_total"]:
        promoted = calib["known_wrong_total"] - calib["known_wrong_rejected"]
        forms = _forms(calib.get("known_wrong_forms"))
        lines.append(
            f"- **Known-wrong pairs** (it should say `WRONG`): it said `WRONG` to "
            f"{_fraction(calib['known_wrong_rejected'], calib['known_wrong_total'])} questions of this run paired "
            f"with answers built to be wrong, each rejected by its verifier, {shown}"
            + (f" — by form: {forms}" if forms else "") + ". That implies a **false-promotion rate of "
            f"{_rate(promoted / calib['known_wrong_total'])}**: the share of wrong answers of these forms the "
            "judge would promote.")
    else:
        lines.append("- **Known-wrong pairs**: none could be built to measure how often it says CORRECT to a wrong "
                     "answer.")
    if calib["known_right_total"]:
        forms = _forms(calib.get("known_right_forms"))
        lines.append(
            f"- **Known-right pairs** (it should say `CORRECT`): it said `CORRECT` to "
            f"{_fraction(calib['known_right_promoted'], calib['known_right_total'])} right answers rewritten so "
            "that the verifier rejects them and the decisive rule leaves them to the judge — the false negatives "
            "it exists to recover" + (f"; by form: {forms}" if forms else "") + ". That is a **recall of "
            f"{_rate(calib['known_right_promoted'] / calib['known_right_total'])}**.")
    else:
        lines.append("- **Known-right pairs**: no meaning-preserving rewrite of a reference was rejected by its "
                     "verifier, so the judge's recall could not be measured.")
    return "\n".join(lines)


def calibration_examples(stats: dict[str, Any]) -> str:
    """Per family, a few pairs of each calibration side with the judge's verdict, for a reader to check."""
    sides = (("accepted", "verifier-accepted (should be `CORRECT`)"),
             ("known_wrong", "known-wrong (should be `WRONG`)"), ("known_right", "known-right (should be `CORRECT`)"))
    lines = []
    for family, fam in stats["families"].items():
        examples = (fam.get("calibration") or {}).get("examples") or {}
        for side, title in sides:
            shown = examples.get(side, [])[:3]
            if shown:
                lines += ["", f"**{family}** — {title}:", "", "| question | reference | candidate | form | verdict |",
                          "|---|---|---|---|---|",
                          *(f"| {_cell(e['question'])} | {_cell(e['reference'])} | {_cell(e['candidate'])} | "
                            f"{e.get('form') or '–'} | `{e['verdict']}` |" for e in shown)]
    if not lines:
        return ""
    return "Calibration pairs to spot-check (the first of each side):\n" + "\n".join(lines)


def _paths_sentence(stats: dict[str, Any]) -> str:
    counts = stats.get("judge_counts") or {}
    scope = stats.get("judge_scope", "undecided")
    if scope == "all":
        rule = ("`judge_scope: all`: every verifier rejection with an extractable answer went to the judge, "
                "decisive mismatches included")
    else:
        rule = (f"`judge_scope: undecided`: {_n(counts.get('decisive', 0))} decisive mismatches — the answer and "
                "every reference are numbers none within the verifier's tolerance, or two different option "
                "letters — stayed rejected (`wrong_answer`) without asking the judge")
    return (f"Paths: {rule}; {_n(counts.get('judged', 0))} answers were graded by the judge, "
            f"{_n(counts.get('promoted', 0))} QA pairs promoted and {_n(counts.get('withheld', 0))} promotions "
            "withheld by the leniency gate.")


def gate_paragraph(stats: dict[str, Any]) -> str:
    minimum = stats.get("judge_min_specificity", 0.95)
    withheld = [(family, fam) for family, fam in stats["families"].items()
                if fam["judge"].get("gate", {}).get("withheld")]
    rule = (f"Leniency gate: in a family where the judge says `WRONG` to fewer than {_rate(minimum)} of its "
            "known-wrong pairs (`judge_min_specificity`), its `CORRECT` verdicts are not trusted: those pairs stay "
            "in the rejected split with reason `judge_withheld`.")
    if minimum <= 0:
        rule = "Leniency gate: **off** for this run (`judge_min_specificity: 0`): every `CORRECT` promotes."
    lines = [rule]
    for family, fam in stats["families"].items():
        if fam["judge"].get("enabled", True) and fam["judge"].get("gate", {}).get("consulted") is False:
            lines += ["", f"> **{family}:** the judge was never consulted — every verifier rejection was decisive "
                          "(or there was none) — so the gate had nothing to decide there."]
    for family, fam in withheld:
        c = fam["calibration"] or {"known_wrong_rejected": 0, "known_wrong_total": 0}
        measured = (f"said `WRONG` to only {_fraction(c['known_wrong_rejected'], c['known_wrong_total'])} "
                    f"known-wrong pairs ({_rate(fam['judge']['gate']['specificity'])})" if c["known_wrong_total"]
                    else "could not be measured on known-wrong pairs")
        lines += ["", f"> **Warning — {family}:** the judge {measured}, below {_rate(minimum)}; "
                      f"{_n(fam['judge']['withheld'])} promotion(s) were withheld."]
    min_recall = stats.get("judge_min_recall", 0.5)
    for family, fam in stats["families"].items():
        gate, c = fam["judge"].get("gate", {}), fam["calibration"] or {}
        if gate.get("adds_little"):
            lines += ["", f"> **Note — {family}:** the judge said `CORRECT` to only "
                          f"{_fraction(c['known_right_promoted'], c['known_right_total'])} known-right pairs "
                          f"({_rate(gate['recall'])}, below `judge_min_recall` {_rate(min_recall)}): it adds little "
                          "in this family; most right answers its verifier rejects stay rejected."]
    return "\n".join(lines)


def _pair_table(pairs: list[dict[str, str]]) -> list[str]:
    return ["", "| question | reference | the judge's `CORRECT` answer |", "|---|---|---|",
            *(f"| {_cell(p['question'])} | {_cell(p['reference'])} | {_cell(p['candidate'])} |" for p in pairs)]


def spot_checks(stats: dict[str, Any]) -> str:
    """Per family, up to 10 promoted pairs (and up to 10 the gate withheld), for a reader to check."""
    lines = []
    for family, fam in stats["families"].items():
        judge = fam["judge"]
        shown = judge.get("promotions") or []
        if shown:
            more = f", the first {len(shown)}" if judge["promoted"] > len(shown) else ""
            lines += ["", f"**{family}** — {_n(judge['promoted'])} promoted{more}:", *_pair_table(shown)]
        withheld = judge.get("withheld_promotions") or []
        if withheld:
            more = f", the first {len(withheld)}" if judge.get("withheld", 0) > len(withheld) else ""
            lines += ["", f"**{family}** — {_n(judge['withheld'])} withheld by the leniency gate{more}:",
                      *_pair_table(withheld)]
    if not lines:
        return "No pair was promoted by the judge."
    return "Promotions to spot-check (question, official answer, the answer the judge called correct):\n" + \
        "\n".join(lines)


def judge_section(stats: dict[str, Any]) -> str:
    if not stats["judge_enabled"]:
        return ("The model-as-judge pass was **disabled** for this run (`judge: false`): the verifier's decision is "
                "final, and every rejected pair keeps the verifier's reason.")
    lines = [
        "String verifiers cannot judge free-form answers at all, and they under-credit answers that are correct "
        f"but differently phrased. Every item the verifier rejected that has an extractable answer is therefore "
        f"re-examined by `{stats['judge_model']}` in a text-only pass that sees the question, the reference and "
        "the candidate — no image, no re-generation, it only grades text that was already produced.",
        "",
        "The judge is instructed to compare against the reference and **never to solve the question itself**, so "
        "an answer is not promoted merely because the model believes it is true. It answers `CORRECT`, `WRONG`, "
        "or `UNSURE`. Numbers must agree, and that is enforced in code: a decisive mismatch never reaches the "
        "judge. A reply that is not exactly one verdict word counts as `UNSURE`. **`UNSURE` is never counted "
        "as correct** — only a `CORRECT` verdict moves a pair into the accepted splits. `WRONG` and `UNSURE` both "
        "remain in the rejected split (reasons `wrong_answer` and `judge_unsure`), so an unresolved case is never "
        "silently promoted to a pass.",
        "",
        _paths_sentence(stats),
        "",
        calibration_sentence(stats.get("calibration"), stats.get("judge_scope", "undecided")),
        "",
        gate_paragraph(stats),
        "",
        "| family | decisive (not judged) | judged | promoted (`CORRECT`) | withheld | `WRONG` | `UNSURE` | "
        "accepted pairs `CORRECT` | known-wrong pairs `WRONG` | known-right pairs `CORRECT` |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for family, fam in stats["families"].items():
        j, c = fam["judge"], fam["calibration"]
        agreed = _fraction(c["agreed"], c["total"]) if c else "–"
        rejected = _fraction(c["known_wrong_rejected"], c["known_wrong_total"]) if c and "known_wrong_total" in c else "–"
        recovered = (_fraction(c["known_right_promoted"], c["known_right_total"]) if c and c.get("known_right_total")
                     else "–")
        lines.append(f"| {family} | {_n(j.get('decisive', 0))} | {_n(j['judged'])} | {_n(j['promoted'])} | "
                     f"{_n(j.get('withheld', 0))} | {_n(j['wrong'])} | {_n(j['unsure'])} | {agreed} | {rejected} | "
                     f"{recovered} |")
    lines += ["", spot_checks(stats)]
    examples = calibration_examples(stats)
    if examples:
        lines += ["", examples]
    return "\n".join(lines)


def schema_section(stats: dict[str, Any]) -> str:
    keep = stats["card"]["sft_keep_reasoning"]
    return "\n".join([
        "The three rejection-sampling configs hold one row per image:",
        "",
        "- `image` — HF `Image()` — renders directly in the dataset viewer (bytes embedded)",
        "- `image_sha256` — content hash of the image bytes as stored",
        "- `qa` — the QA pairs of this image that belong to the config:",
        "  - `{Family}_rejected`: list of {`question`, `answer`, `wrong_vlm`, `reason`}",
        "  - `{Family}_RS_think`: list of {`question`, `answer`, `response`}",
        "  - `{Family}_RS_nothink`: list of {`question`, `answer`}",
        "- `clean_meta` — per-row provenance (`source_dataset`, `source_config`, `source_split`, `source_row_ids`, "
        "`family`), the cleaning policy and steps that admitted it (`policy_version`, `steps`), the `model` and "
        "the `verifier`",
        "",
        "`answer` is always the official ground truth. `response` is the model's full output, reasoning included. "
        "`wrong_vlm` is the final answer extracted from the model's response (null when nothing could be "
        "extracted). `reason` is `wrong_answer` (the verifier and the judge said wrong, or a decisive mismatch), "
        "`judge_unsure`, `judge_withheld` (the judge said correct, but the leniency gate did not trust it), "
        "`no_answer` (nothing extractable, e.g. reasoning cut off at the token limit), or — when the judge is off — "
        "the verifier's own reason (`mc_ambiguous`, `mc_no_letter`, `math_timeout`, …).",
        "",
        "The TRL views:",
        "",
        "- `{Family}_sft` — one accepted QA pair per row, in TRL's conversational prompt-completion form: "
        "`prompt`: the user turn `[{\"type\": \"image\"}, {\"type\": \"text\", \"text\": question}]`; "
        "`completion`: the assistant turn, whose text is "
        + ("the model's full response, reasoning included, byte for byte" if keep else "the official answer")
        + "; `images`: a list holding the image. TRL trains on the completion only.",
        "- `{Family}_dpo` — `prompt`: the user turn (image + question); `chosen`: the official answer; "
        "`rejected`: the model's extracted answer (`wrong_vlm`); `images`: a list holding the image. One row per "
        "rejected QA pair with an extractable answer that differs from the official one.",
    ])


def training_section(stats: dict[str, Any]) -> str:
    repo = stats["card"].get("hub_dataset_id") or "path/to/dataset"
    # A family that has both views, so the snippet runs as written.
    families = stats["families"]
    both = [f for f, fam in families.items()
            if all((fam["splits"].get(view) or {}).get("rows") for view in ("sft", "dpo"))]
    family = both[0] if both else next(iter(families), "Family")
    return f"""The `_sft` and `_dpo` configs are in the formats TRL's trainers take as they are:

```python
import torch
from datasets import load_dataset
from transformers import AutoModelForImageTextToText, AutoProcessor
from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

model_id = "Qwen/Qwen2.5-VL-3B-Instruct"  # any image-text-to-text model with a chat template
processor = AutoProcessor.from_pretrained(model_id)
cpu = not torch.cuda.is_available()

sft = SFTTrainer(
    model=AutoModelForImageTextToText.from_pretrained(model_id),
    args=SFTConfig(output_dir="sft", max_length=None, use_cpu=cpu, bf16=not cpu),
    train_dataset=load_dataset("{repo}", "{family}_sft", split="train"),
    processing_class=processor,
)
sft.train()

dpo = DPOTrainer(
    model=AutoModelForImageTextToText.from_pretrained(model_id),
    args=DPOConfig(output_dir="dpo", max_length=None, use_cpu=cpu, bf16=not cpu),
    train_dataset=load_dataset("{repo}", "{family}_dpo", split="train"),
    processing_class=processor,
)
dpo.train()
```

`max_length=None` keeps every image token (truncating inside an image breaks the batch)."""


def _image_extension(data: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        fmt = (img.format or "png").lower()
    return {"jpeg": "jpg"}.get(fmt, fmt)


def read_example_rows(dataset_dir: Path, config: str, count: int) -> list[dict[str, Any]]:
    """The first `count` rows of a config, read from its shards in order."""
    rows: list[dict[str, Any]] = []
    for path in sorted((dataset_dir / "data" / config).glob("train-*.parquet")):
        if len(rows) >= count:
            break
        table = pq.read_table(path, columns=["image", "qa"])
        rows.extend(table.slice(0, count - len(rows)).to_pylist())
    return rows


def examples_section(stats: dict[str, Any], dataset_dir: Path) -> str:
    count = stats["card"]["num_card_examples"]
    if count <= 0:
        return "No examples are shown (`num_card_examples: 0` in the recipe)."
    assets = dataset_dir / "assets"
    out = []
    for family, fam in stats["families"].items():
        config = fam["splits"]["rejected"]["config"]
        out.append(f"### {family} (`{config}`)")
        if not fam["splits"]["rejected"]["rows"]:
            out += ["", "The model answered every question of this family correctly: the rejected split is empty.", ""]
            continue
        rows = read_example_rows(dataset_dir, config, count)
        for i, row in enumerate(rows, start=1):
            data = row["image"]["bytes"]
            name = f"{config}_example_{i}.{_image_extension(data)}"
            (assets / name).write_bytes(data)
            qa = row["qa"][0]
            out += ["", f"#### Example {i}", "", f"![](assets/{name})", "", "| field | value |", "|---|---|"]
            details = []
            for key in ("question", "answer", "reason"):
                value = qa[key]
                if value is not None and len(value) > LONG_FIELD_CHARS:
                    out.append(f"| `{key}` | *({len(value):,} chars, below)* |")
                    details.append(_details(key, value))
                else:
                    out.append(f"| `{key}` | {_cell(value)} |")
            if len(row["qa"]) > 1:
                out.append(f"| other QA pairs of this image in the split | {len(row['qa']) - 1} |")
            out += ["", *details, _details("wrong_vlm", qa["wrong_vlm"]), ""]
    return "\n".join(out).rstrip()


def _step_text(label: str, policy_steps: dict[str, Any]) -> str:
    name = label.split("@")[0]
    if name in STEP_TEXT:
        return STEP_TEXT[name]
    does = (policy_steps.get(name) or {}).get("does")
    return f"**{name}.** {does[0].upper() + does[1:]}." if does else f"**{name}.**"


def _by_reason(counts: dict[str, int], group: str) -> str:
    items = [(k[len(group) + 1:], v) for k, v in counts.items() if k.startswith(group + ".") and v]
    return ", ".join(f"`{reason}` {_n(n)}" for reason, n in items)


def _report_line(counts: dict[str, int]) -> str:
    """One family's (or the pool's) prepare counts: QA pairs read, kept, dropped and merged, by reason."""
    if "input_qa_pairs" not in counts:  # a report in another shape: list what it counts
        return ", ".join(f"`{k}` {_n(v)}" for k, v in counts.items())
    parts = [f"{_n(counts['input_qa_pairs'])} QA pairs read, {_n(counts.get('kept_qa_pairs', 0))} kept"]
    for group in ("dropped", "merged"):
        total = counts.get(f"{group}_qa_pairs", 0)
        detail = _by_reason(counts, group)
        parts.append(f"{_n(total)} {group}" + (f" ({detail})" if detail else ""))
    converted = _by_reason(counts, "converted")
    if converted:
        parts.append(f"converted: {converted}")
    images = _by_reason(counts, "images.dropped")
    if images:
        parts.append(f"images dropped: {images}")
    return "; ".join(parts)


def cleaning_section(stats: dict[str, Any]) -> str:
    policy = stats.get("cleaning_policy") or {}
    policy_steps = policy.get("steps") or {}
    version = f" (policy `{policy['policy_version']}`)" if policy.get("policy_version") else ""
    lines = [
        f"Each cleaning step is named and versioned{version}; `clean_meta.steps` records the steps that admitted "
        "or changed a row. Steps recorded on the rows of this dataset, with the number of rows (images) per family:",
        "",
    ]
    steps: dict[str, dict[str, int]] = {}
    for family, fam in stats["families"].items():
        for step, rows in fam["cleaning"]["steps"].items():
            steps.setdefault(step, {})[family] = rows
    if steps:
        for step, per_family in sorted(steps.items()):
            counts = ", ".join(f"{family} {_n(n)}" for family, n in per_family.items())
            lines.append(f"- {_step_text(step, policy_steps)} (`{step}`: {counts})")
    else:
        lines.append("- none: every row was admitted as it came.")
    per_family = {f: fam["cleaning"]["report"]["family"] for f, fam in stats["families"].items()}
    pool = next(iter(stats["families"].values()), {}).get("cleaning", {}).get("report", {}).get("pool", {})
    lines += ["", "What cleaning removed, from `prepared/prepare_report.json`:", ""]
    for family, counts in per_family.items():
        if counts:
            lines.append(f"- **{family}**: {_report_line(counts)}")
    if pool:
        lines.append(f"- **whole pool**: {_report_line(pool)}")
    if not pool and not any(per_family.values()):
        lines.append("- no prepare report was found.")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ render


def explore_section(stats: dict[str, Any]) -> str:
    """Pair hunting: what the explore pass drew and found (nothing without one)."""
    explored = {f: fam["explore"] for f, fam in stats["families"].items() if fam.get("explore")}
    if not explored:
        return ""
    gen = stats["generation"]
    stop = ("until it had a verified-correct and a verified-wrong response (`explore_stop: paired`) or "
            f"{gen['explore_samples']} samples" if gen["explore_stop"] == "paired"
            else f"{gen['explore_samples']} samples each (`explore_stop: never`: exact pass rates)")
    lines = [
        "## Pair hunting: sampling beyond the greedy answer",
        "",
        f"After the greedy pass every question was sampled again at temperature {gen['explore_temperature']} "
        f"(top-p {gen['explore_top_p']}), in rounds of 1, 2, 4, … samples over the questions still open, {stop}. "
        "Each sample was verified as it landed. A response counts as correct when it is accepted by the rules "
        "above (verifier, or a trusted judge `CORRECT`); as wrong when it has an extractable answer the verifier "
        "rejected and the mismatch was decisive or the judge said `WRONG`. The pass rate of a question is its "
        "correct responses over all responses drawn, the greedy one included (with `paired` stopping it rests on the few responses drawn before the pair was found; "
        "`explore_stop: never` draws all samples for exact rates). Every sample's random stream is "
        "fixed by the run's seed and the sample's key, so the samples do not depend on batching, process count "
        "or restarts.",
        "",
        "`{Family}_dpo_onpolicy` pairs a response the verifier accepted with one that was verified wrong, for the "
        "same image and question; `{Family}_grpo` holds the questions with 0 < pass rate < 1 — the ones whose "
        "sampled rewards still differ, so a GRPO group has something to learn from.",
        "",
        "| family | questions | responses drawn | explore samples | on-policy pairs | samples per pair | "
        "learnable (0 < pass rate < 1) | mean pass rate |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for family, e in explored.items():
        pairs = _n(e["pairs"]) if e["pairs"] is not None else "view not written"
        per_pair = f"{e['samples_per_pair']:.1f}" if e["samples_per_pair"] is not None else "–"
        lines.append(f"| {family} | {_n(e['questions'])} | {_n(e['responses'])} | {_n(e['explore_samples'])} | "
                     f"{pairs} | {per_pair} | {_n(e['learnable'])} ({_rate(e['learnable_share'])}) | "
                     f"{_rate(e['mean_pass_rate'])} |")
    bins = next(iter(explored.values()))["pass_rate_histogram"]["bins"]
    lines += ["", "Questions per pass rate:", "",
              "| family | " + " | ".join(f"`{b}`" for b in bins) + " |", "|---" * (len(bins) + 1) + "|"]
    for family, e in explored.items():
        lines.append(f"| {family} | " + " | ".join(_n(c) for c in e["pass_rate_histogram"]["counts"]) + " |")
    lines += ["", f"![Pass rates per family](assets/{PASS_RATE_PLOT_NAME})", "",
              "GRPO rewards by dotted path: `GRPOTrainer(reward_funcs=[rsgen.verify.rewards.relaxed], ...)` (or "
              "`--reward_funcs rsgen.verify.rewards.relaxed` in TRL's scripts; `exact`, `numeric`, `mc`, `math` "
              "likewise) reads the `solution` column of `{Family}_grpo` as it is.", ""]
    return "\n".join(lines)


def _pct(value: float | None) -> str:
    return "–" if value is None else _rate(value)


def iterate_section(stats: dict[str, Any]) -> str:
    """`rsgen iterate`: the rounds, their models, the held-out curve and the training (nothing otherwise)."""
    it = stats.get("iterate")
    if not it:
        return ""
    rounds = it["rounds"]
    held = it["held_out"]
    start = ("every round fine-tuned the base model afresh (`iterate_from: base`, ReST-EM)" if it["iterate_from"] == "base"
             else "each round fine-tuned the model of the round before (`iterate_from: previous`)")
    lines = [
        "## Self-improvement rounds (`rsgen iterate`)",
        "",
        f"This dataset comes from {len(rounds)} round(s) of rejection sampling. Round 0 answered with "
        f"`{it['base_model']}`; after each round the accepted pairs of the training slice (its `_sft` rows) "
        f"fine-tuned the next model with TRL's `SFTTrainer`; {start}. A fixed held-out slice — "
        f"{_n(held['images'])} images, {held['fraction']:.0%} of each family's, chosen by image so no image was both "
        "trained on and measured — was answered greedily by every round's model: its accept rate is the curve below. "
        "Every QA pair appears once: an accepted pair comes from the first round that got it right, a rejected one "
        "from the last round; `clean_meta.qa_rounds` gives the round of each pair of a row's `qa`.",
        "",
        "| round | model | held-out accept (verifier) | held-out accept (verifier + judge) | training-slice accept | "
        "accepted pairs kept here | fine-tuned on | SFT loss (first → last step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rounds:
        training = r.get("training") or {}
        losses = training.get("losses") or []
        loss = f"{losses[0][1]:.3f} → {losses[-1][1]:.3f}" if losses else "–"
        rows = f"{_n(training['rows'])} pairs" if "rows" in training else "–"
        lines.append(f"| {r['round']} | `{r['model']}` | {_pct(r['held_out']['verifier_rate'])} | "
                     f"{_pct(r['held_out']['accept_rate'])} | {_pct(r['train']['accept_rate'])} | "
                     f"{_n(r.get('contributed_accepted', 0))} | {rows} | {loss} |")
    families = sorted({f for r in rounds for f in r["held_out"]["families"]})
    lines += ["", "Held-out accept rate (verifier) per family:", "",
              "| family | " + " | ".join(f"round {r['round']}" for r in rounds) + " |",
              "|---" * (len(rounds) + 1) + "|"]
    for family in families:
        cells = [_pct(r["held_out"]["families"].get(family, {}).get("verifier_rate")) for r in rounds]
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines += ["", f"![Held-out accept rate per round and training loss](assets/{ITERATE_PLOT_NAME})", ""]
    if it.get("stopped"):
        lines += [f"The loop stopped early: {it['stopped']}.", ""]
    lines += ["From round 1 on the judge is the fine-tuned model itself, so the verifier's rate is the one the loop "
              "trusts (`iterate_stop_when_worse` reads it); `iterate.json` holds every figure, the per-step losses "
              "included.", ""]
    return "\n".join(lines)


def render_card_text(stats: dict[str, Any], dataset_dir: Path) -> str:
    """The card's text; writes the example images and the plot into `dataset_dir/assets/` as it goes."""
    assets = dataset_dir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    draw_stats_plot(stats, assets / PLOT_NAME)
    if any(fam.get("explore") for fam in stats["families"].values()):
        draw_pass_rate_plot(stats, assets / PASS_RATE_PLOT_NAME)
    if stats.get("iterate"):
        draw_iterate_plot(stats, assets / ITERATE_PLOT_NAME)
    template = Template(TEMPLATE_PATH.read_text(encoding="utf-8"))
    body = template.substitute(
        title=title(stats),
        demo_banner=demo_banner(stats),
        pool_description=pool_description(stats),
        family_list=", ".join(f"**{f}**" for f in stats["families"]),
        overview_table=overview_table(stats),
        family_tables="\n\n".join(family_table(f, fam) for f, fam in stats["families"].items()),
        plot_name=PLOT_NAME,
        production=production(stats),
        matching=matching(stats),
        judge=judge_section(stats),
        explore=explore_section(stats),
        iterate=iterate_section(stats),
        schema=schema_section(stats),
        training=training_section(stats),
        examples=examples_section(stats, dataset_dir),
        cleaning=cleaning_section(stats),
        size_on_disk=size_on_disk(stats),
        license=license_section(stats),
    )
    return str(DatasetCard(f"---\n{card_data(stats).to_yaml()}\n---\n\n{body}"))


def write_card(stats: dict[str, Any], dataset_dir: Path) -> Path:
    import shutil

    shutil.rmtree(dataset_dir / "assets", ignore_errors=True)  # no stale example images from an earlier render
    path = dataset_dir / "README.md"
    path.write_text(render_card_text(stats, dataset_dir), encoding="utf-8")
    license_file = dataset_dir / LICENSE_FILE
    if stats["card"]["license"] == "other":
        license_file.write_text(f"# License\n\n{license_section(stats)}\n", encoding="utf-8")
    else:
        license_file.unlink(missing_ok=True)
    return path
