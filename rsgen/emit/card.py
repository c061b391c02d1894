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
from rsgen.emit.splits import EmitError
from rsgen.emit.stats import config_features, config_glob

TEMPLATE_PATH = Path(__file__).with_name("card_template.md")
LONG_FIELD_CHARS = 300  # table cells longer than this go into a <details> block instead

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
                features=config_features(kind, rounds="iterate" in stats,
                                         blind=stats.get("blind_check", "off") != "off"), splits=splits, download_size=split["download_size"],
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


# ------------------------------------------------------------------------------------------------ tables


def _table(head: list[str], rows: list[list[str]]) -> str:
    def line(cells: list[str]) -> str:
        return "|" + "|".join(f" {cell} " if cell else " " for cell in cells) + "|"

    return "\n".join([line(head), "|---" * len(head) + "|", *(line(row) for row in rows)])


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
    rows = []
    for family, fam in stats["families"].items():
        tok = fam["tokens"]
        rows.append([family, _n(tok["samples"]), _n(tok["prompt"]), _n(tok["generated"]), _n(tok["hit_limit"]),
                     _n(tok["judge_generated"])])
    text = [_table(["family", "responses", "prompt tokens", "generated tokens", "stopped at the token limit",
                    "judge tokens"], rows)]
    by_stage = stats.get("tokens_by_stage")  # stats.json written before the openai engine lacks it
    if by_stage:
        parts = ", ".join(f"{stage} {_n(t['prompt'])} / {_n(t['completion'])}" for stage, t in by_stage.items())
        text += ["", f"Tokens by stage, prompt / completion (engine `{stats.get('engine', 'transformers')}`): {parts}."]
    cost = stats.get("cost")
    if cost:
        price = cost["price_per_million"]
        text += ["", f"Cost by stage at {price['prompt'] or 0:g} per million prompt tokens and "
                 f"{price['completion'] or 0:g} per million completion tokens (the recipe's prices, the engine's "
                 "token counts): " + ", ".join(f"{stage} {value:,.4f}" for stage, value in cost["stages"].items())
                 + f"; total {cost['total']:,.4f}."]
    requests = stats.get("server_requests")
    if requests:
        text += ["", "Requests to the server by stage: " + "; ".join(
            f"{stage} {_n(c['requests'])} (retries {_n(sum(c['retries'].values()))}"
            + (" — " + ", ".join(f"{cause} {_n(n)}" for cause, n in c["retries"].items()) if c["retries"] else "")
            + f"; failed {_n(c['failed'])}, refused {_n(c['refused'])}, content null {_n(c['no_content'])})"
            for stage, c in requests.items()) + "."]
    samples = sum(f["tokens"]["samples"] for f in stats["families"].values())
    with_reasoning = sum(f["tokens"].get("with_reasoning", samples) for f in stats["families"].values())
    if stats["generation"]["enable_thinking"] and samples and not with_reasoning:
        text += ["", "No response carries reasoning: the model (or the server that ran it, as hosted APIs that hide "
                 "reasoning do) returned the answer alone, so `response` in `{Family}_RS_think` holds no reasoning."]
    return "\n".join(text)


def _fraction(num: int, den: int) -> str:
    return f"{_n(num)}/{_n(den)}"


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


def _image_extension(data: bytes) -> str:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        fmt = (img.format or "png").lower()
    return {"jpeg": "jpg"}.get(fmt, fmt)


def read_example_rows(dataset_dir: Path, config: str, count: int) -> list[dict[str, Any]]:
    """The first `count` rows of a config, read from its shards in order: batch by batch, never a whole shard (a
    shard of a large run is hundreds of MB of images)."""
    rows: list[dict[str, Any]] = []
    for path in sorted((dataset_dir / "data" / config).glob("train-*.parquet")):
        with pq.ParquetFile(path) as shard:
            for batch in shard.iter_batches(batch_size=max(1, count - len(rows)), columns=["image", "qa"]):
                rows.extend(batch.slice(0, count - len(rows)).to_pylist())
                if len(rows) >= count:
                    return rows
    return rows


def _long_field(name: str, text: str | None) -> dict[str, Any]:
    """A field shown in full below the example's table (the template's `details` block)."""
    return {"name": name, "text": text, "chars": len(text or ""), "fence": _fence(text or "")}


def examples(stats: dict[str, Any], dataset_dir: Path) -> list[dict[str, Any]]:
    """Per family, the first rows of its rejected split: each example's image is saved under `assets/` as stored,
    short fields go into a table, long ones (and the model's answer) into blocks below it."""
    count = stats["card"]["num_card_examples"]
    if count <= 0:
        return []
    out = []
    for family, fam in stats["families"].items():
        config = fam["splits"]["rejected"]["config"]
        rows = read_example_rows(dataset_dir, config, count) if fam["splits"]["rejected"]["rows"] else []
        shown = []
        for i, row in enumerate(rows, start=1):
            data = row["image"]["bytes"]
            name = f"{config}_example_{i}.{_image_extension(data)}"
            (dataset_dir / "assets" / name).write_bytes(data)
            qa = row["qa"][0]
            table, details = [], []
            for key in ("question", "answer", "reason"):
                value = qa[key]
                if value is not None and len(value) > LONG_FIELD_CHARS:
                    table.append([f"`{key}`", f"*({len(value):,} chars, below)*"])
                    details.append(_long_field(key, value))
                else:
                    table.append([f"`{key}`", _cell(value)])
            if len(row["qa"]) > 1:
                table.append(["other QA pairs of this image in the split", str(len(row["qa"]) - 1)])
            shown.append({"image": name, "table": _table(["field", "value"], table),
                          "details": [*details, _long_field("wrong_vlm", qa["wrong_vlm"])]})
        out.append({"family": family, "config": config, "rows": shown})
    return out


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
    card = stats["card"]
    name = card.get("license_name") or DERIVED_LICENSE_NAME
    sources = ", ".join(f"`{s['dataset']}`" for s in stats["sources"]) or "its sources"
    return (f"`other` (`{name}`): the rows inherit the licenses of the source data ({sources}) and the terms of "
            f"use of the model that wrote the responses (`{stats['model']}`). Set `license` (a Hub license id) or "
            "`license_name` in the recipe when they are known.")


def decontamination_text(decon: dict[str, Any] | None) -> str:
    """Which evaluation sets the pool was checked against, and how many QA pairs (and images) each removed."""
    if not decon:
        return "Decontamination: no evaluation sets were given (`decontaminate:`), so none was checked."
    q = decon["questions"]
    lines = [f"Decontamination against {len(decon['sets'])} evaluation set(s): images by perceptual hash "
             f"confirmed pixel by pixel, questions by normalised word {q['ngram']}-grams (dropped when at least "
             f"{q['match_share']:.0%} of a question's grams belong to one evaluation question):", ""]
    for s in decon["sets"]:
        where = " ".join(str(s[k]) for k in ("source_dataset", "source_config", "source_split") if s.get(k))
        removed = s["removed_qa_pairs"]
        templated = (" (questions come from templates: only its images were checked)"
                     if s["questions_templated"] else "")
        lines.append(
            f"- `{where}`: {_n(s['images_indexed'])} images and {_n(s['questions_indexed'])} identifying questions "
            f"checked{templated}; removed {_n(removed.get('contaminated_image', 0))} QA pairs on "
            f"{_n(s['removed_pool_images'])} copied images (`contaminated_image`) and "
            f"{_n(removed.get('contaminated_question', 0))} by question (`contaminated_question`)")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ render


def card_context(stats: dict[str, Any], dataset_dir: Path) -> dict[str, Any]:
    """What a card template is rendered with: stats.json whole (`stats`), the figures and tables computed from it,
    and the formatting helpers `n` (1,234) and `rate` (12.3%).

    title, demo, sources, family_names, overview_table, disk {total, per_kind}, family_tables [{family, split_table,
    summary_table, empty_configs}], plot_name, gen (stats.generation), chat_template_kwargs, tokens_table,
    wall_times [(stage, seconds)], wall_total, verifiers [{name, families}], judge_counts, calibration, gate,
    judge_table, spot_checks, explore {table, histogram, plot_name} or None, iterate {rounds, base_model,
    from_base, dpo, held_out_images, held_out_fraction, rounds_table, family_table, plot_name, stopped} or None, training {repo, family}, examples
    [{family, config, rows}], cleaning {policy_version, steps, report, pool}, license_other.

    Building it writes the example images into `dataset_dir/assets/`."""
    wall = stats["wall_time"]
    per_kind = disk_bytes(stats)
    return {
        "stats": stats,
        "n": _n,
        "rate": _rate,
        "title": title(stats),
        "demo": bool(stats["card"].get("demo")),
        "sources": stats["sources"],
        "family_names": list(stats["families"]),
        "overview_table": overview_table(stats),
        "disk": {"total": _size(sum(per_kind.values())), "per_kind": [(k, _size(v)) for k, v in per_kind.items()]},
        "family_tables": family_tables(stats),
        "plot_name": PLOT_NAME,
        "gen": stats["generation"],
        "chat_template_kwargs": json.dumps(stats["generation"]["chat_template_kwargs"], sort_keys=True),
        "tokens_table": tokens_table(stats),
        "wall_times": [(stage, f"{secs:,.0f}") for stage, secs in (wall.get("stages_seconds") or {}).items()],
        "wall_total": f"{wall.get('total_seconds') or 0:,.0f}",
        "verifiers": [{"name": name, "families": families} for name, families in _verifier_names(stats).items()],
        "judge_counts": {"decisive": 0, "judged": 0, "promoted": 0, "withheld": 0, **(stats.get("judge_counts") or {})},
        "calibration": calibration_figures(stats.get("calibration")),
        "calibration_examples": calibration_examples(stats),
        "gate": gate_figures(stats),
        "judge_table": judge_table(stats),
        "spot_checks": spot_checks(stats),
        "explore": explore_figures(stats),
        "iterate": iterate_figures(stats),
        "training": training_figures(stats),
        "examples": examples(stats, dataset_dir),
        "cleaning": cleaning_figures(stats),
        "blind": blind_figures(stats),
        "license_other": license_section(stats),
    }


def template_path(stats: dict[str, Any]) -> Path:
    """The recipe's `card_template` (recorded in stats.json, so `rsgen card` re-renders with it), else ours."""
    own = stats["card"].get("template")
    return Path(own) if own else TEMPLATE_PATH


def _template_error(path: Path, err: Exception) -> EmitError:
    import jinja2

    if isinstance(err, OSError):
        return EmitError(f"card_template {str(path)!r} cannot be read ({err.strerror or err}); give the path of a "
                         "Jinja card template, or null for rsgen's own")
    where = f" line {err.lineno}" if isinstance(err, jinja2.TemplateSyntaxError) else ""
    return EmitError(f"card_template {str(path)!r}{where}: {err.message or type(err).__name__}; fix the template "
                     "(Jinja2, with the variables listed in rsgen.emit.card.card_context)")


def check_template(path: str | Path | None) -> None:
    """A card template that cannot be read or parsed fails here, before emit writes anything."""
    import jinja2

    if path is None:
        return
    try:
        jinja2.Environment().parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, jinja2.TemplateError) as err:
        raise _template_error(Path(path), err) from None


def _pct(value: float | None) -> str:
    return "–" if value is None else _rate(value)


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


def render_card_text(stats: dict[str, Any], dataset_dir: Path) -> str:
    """The card's text; writes the example images and the plots into `dataset_dir/assets/` as it goes."""
    import jinja2

    assets = dataset_dir / "assets"
    assets.mkdir(parents=True, exist_ok=True)
    draw_stats_plot(stats, assets / PLOT_NAME)
    if any(fam.get("explore") for fam in stats["families"].values()):
        draw_pass_rate_plot(stats, assets / PASS_RATE_PLOT_NAME)
    if stats.get("iterate"):
        draw_iterate_plot(stats, assets / ITERATE_PLOT_NAME)
    path = template_path(stats)
    try:
        card = DatasetCard.from_template(card_data(stats), template_path=str(path), **card_context(stats, dataset_dir))
    except (OSError, jinja2.TemplateError) as err:
        raise _template_error(path, err) from None
    text = str(card)
    return text if text.endswith("\n") else text + "\n"  # Jinja drops the template's final newline


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
