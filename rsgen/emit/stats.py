"""stats.json: every number the dataset card shows, per family, plus the run-level facts the card states.

The card is rendered from this file only (with the dataset files for the examples), so `rsgen card` can rebuild
it from disk. Nothing here reads a clock: times come from run.json, so emitting twice writes the same bytes.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from datasets import Features

from rsgen.config import DEMO_BASE_MODEL, DEMO_DATASET, DEMO_MODEL, RecipeConfig, RecipeError, SourceConfig
from rsgen.emit import STAGE
from rsgen.emit.explored import PASS_RATE_BINS
from rsgen.emit.splits import FamilyRouting
from rsgen.emit.trl_views import VIEWS
from rsgen.layout import OutputLayout
from rsgen.records import CORRECT, UNSURE, WRONG
from rsgen.routing import judge_trusted, recall, specificity
from rsgen.schema import split_features

RS_KINDS = {"RS_think": "think", "RS_nothink": "nothink", "rejected": "rejected"}  # config kind -> schema split
SPLIT_KINDS = (*RS_KINDS, *VIEWS)  # every config kind a family can have, in card order
SPLIT = "train"  # every config has one split; shards are data/{config}/train-0000i-of-0000N.parquet
MB = 2**20  # bytes in the recipe's `shard_size_mb`
HISTOGRAM_BINS = 20
STATS_VERSION = 1


@dataclass
class SplitPlan:
    """What one config holds: counted before it is written, sizes and shards filled in after."""

    config: str
    rows: int = 0
    qa_pairs: int = 0  # QA pairs (RS splits: a row per image); views have one QA pair per row
    shards: int = 0
    num_bytes: int = 0  # written: uncompressed bytes of the rows (parquet metadata), as `datasets` reports
    download_size: int = 0  # written: bytes of the parquet files
    skipped: dict[str, int] = field(default_factory=dict)  # dpo: rejected pairs without a usable pair, by why


def written_kinds(views: list[str] | None, explore: bool = False) -> tuple[str, ...]:
    """The config kinds an emit writes: the three RS splits always, then the recipe's `views` (null = all; the
    views of the explore pass only when there is one)."""
    chosen = [v for v in VIEWS if explore or VIEWS[v].reads != "explored"] if views is None else views
    unknown = [v for v in chosen if v not in VIEWS]
    if unknown:
        raise RecipeError(f"views: unknown view(s) {', '.join(map(repr, unknown))}; choose from {', '.join(VIEWS)} "
                          "(or null for all)")
    without = [v for v in chosen if VIEWS[v].reads == "explored" and not explore]
    if without:
        raise RecipeError(f"views: {', '.join(without)} need(s) an explore pass; set explore_samples > 0 "
                          "(e.g. 4) or drop them from views")
    return (*RS_KINDS, *(v for v in VIEWS if v in chosen))


def config_features(kind: str, rounds: bool = False, blind: bool = False) -> Features:
    """Features of a config kind (RS_think | RS_nothink | rejected | sft | dpo); `rounds`: the splits carry
    `clean_meta.qa_rounds` (`rsgen iterate`'s final dataset)."""
    if kind in RS_KINDS:
        return split_features(RS_KINDS[kind], rounds, blind)
    if kind in VIEWS:
        return VIEWS[kind].features
    raise ValueError(f"unknown config kind {kind!r}")


def config_name(family: str, kind: str) -> str:
    return f"{family}_{kind}"


def config_glob(config: str) -> str:
    """The `data_files` pattern of a config in the card's YAML header."""
    return f"data/{config}/{SPLIT}-*"


def response_length_histogram(lengths: Counter, max_new_tokens: int) -> dict[str, Any]:
    """Counts of generated tokens per response in HISTOGRAM_BINS equal integer bins over [0, top]. `lengths`:
    generated tokens -> responses of that length."""
    top = max([max_new_tokens, *lengths]) if lengths else max_new_tokens
    width = max(1, -(-top // HISTOGRAM_BINS))
    edges = [i * width for i in range(HISTOGRAM_BINS + 1)]
    counts = [0] * HISTOGRAM_BINS
    for n, responses in lengths.items():
        counts[min(HISTOGRAM_BINS - 1, n // width)] += responses
    return {"unit": "generated tokens", "bin_edges": edges, "counts": counts}


def _flatten_counts(node: Any, prefix: str = "") -> dict[str, int]:
    out: dict[str, int] = {}
    if isinstance(node, dict):
        for key in sorted(node):
            out.update(_flatten_counts(node[key], f"{prefix}{key}."))
    elif isinstance(node, int) and not isinstance(node, bool):
        out[prefix[:-1]] = node
    return out


NOT_COUNTS = ("families", "sources", "steps", "shards", "decontamination")  # report entries that are not pool-wide counts


def cleaning_counts(report: dict[str, Any] | None, family: str) -> dict[str, dict[str, int]]:
    """Counts of prepare_report.json, flattened to dotted keys: this family's own section (QA pairs read, kept,
    dropped and merged, by reason) and the pool-wide counts (the same totals, plus images checked/dropped)."""
    if not report:
        return {"family": {}, "pool": {}}
    own = (report.get("families") or {}).get(family)
    pool = _flatten_counts({k: v for k, v in report.items() if k not in NOT_COUNTS})
    return {"family": _flatten_counts(own) if isinstance(own, dict) else {}, "pool": pool}


def cleaning_policy(report: dict[str, Any] | None) -> dict[str, Any]:
    """The policy version and the named, versioned steps (with what each does) as prepare recorded them."""
    report = report or {}
    steps = report.get("steps") if isinstance(report.get("steps"), dict) else {}
    return {"policy_version": report.get("policy_version"), "steps": steps}


def _parse_time(text: str | None) -> _dt.datetime | None:
    if not text:
        return None
    try:
        return _dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def stage_wall_times(run: dict[str, Any] | None) -> dict[str, Any]:
    """Seconds per finished stage before this emit, as run.json records them (the last invocation of each stage),
    in the pipeline's order: each entry's `position` in `rsgen.pipeline.STAGES` (entries written by an older rsgen
    have none: they follow, by start time)."""
    recorded = (run or {}).get("stages") or {}
    names = sorted((name for name in recorded if name != STAGE.name),  # this emit has not finished yet
                   key=lambda name: (recorded[name].get("position", len(recorded)),
                                     recorded[name].get("started_at") or "", name))
    stages = {}
    for name in names:
        entry = recorded[name] or {}
        start, end = _parse_time(entry.get("started_at")), _parse_time(entry.get("finished_at"))
        if start and end:
            stages[name] = round((end - start).total_seconds(), 1)
    return {
        "stages_seconds": stages,
        "total_seconds": round(sum(stages.values()), 1) if stages else None,
        "started_at": (run or {}).get("started_at"),
    }


CALIBRATION_COUNTS = ("agreed", "total", "known_wrong_rejected", "known_wrong_total", "known_right_promoted",
                      "known_right_total")
CALIBRATION_ZERO = dict.fromkeys(CALIBRATION_COUNTS, 0)


def calibration_stats(tally: FamilyRouting) -> dict[str, Any]:
    """The three sides of the judge's calibration: verifier-accepted pairs it agreed with (CORRECT), known-wrong
    pairs it rejected (WRONG), known-right pairs (verifier false negatives built from the pool) it promoted
    (CORRECT); the built pairs per form ({form: {"as_expected", "total"}}) and up to 10 examples per side."""
    def forms(counts: dict[str, list[int]]) -> dict[str, dict[str, int]]:
        return {form: {"as_expected": hit, "total": total} for form, (hit, total) in sorted(counts.items())}

    return {"agreed": tally.calibration_agreed, "total": tally.calibration_total,
            "known_wrong_rejected": tally.known_wrong_rejected, "known_wrong_total": tally.known_wrong_total,
            "known_right_promoted": tally.known_right_promoted, "known_right_total": tally.known_right_total,
            "known_wrong_forms": forms(tally.known_wrong_forms), "known_right_forms": forms(tally.known_right_forms),
            "examples": {side: list(shown) for side, shown in sorted(tally.calibration_examples.items())}}


def gate_stats(calibration: dict[str, Any] | None, min_specificity: float, consulted: bool = True,
               min_recall: float = 0.5) -> dict[str, Any]:
    """The leniency gate of one family: its known-wrong rejection rate against `judge_min_specificity`; whether the
    judge was consulted at all (a judged rejection); its known-right recall against `judge_min_recall` (reported)."""
    c = {**CALIBRATION_ZERO, **(calibration or {})}
    rejected, total = c["known_wrong_rejected"], c["known_wrong_total"]
    right = recall(c["known_right_promoted"], c["known_right_total"])
    return {"min_specificity": min_specificity, "specificity": round(specificity(rejected, total), 6) if total else None,
            "withheld": consulted and not judge_trusted(rejected, total, min_specificity), "consulted": consulted,
            "min_recall": min_recall, "recall": round(right, 6) if right is not None else None,
            "adds_little": right is not None and right < min_recall}


def stats_table(stats: dict[str, Any]) -> str:
    """The final table of a run, per family: accepted, rejected (and of those bad_input, a column shown when any
    family has some), accept rate, judge promotions and withheld ones, and the three calibration sides:
    verifier-accepted pairs the judge agreed with, known-wrong pairs it rejected, known-right pairs it promoted."""
    families = stats["families"]
    bad_input = {name: fam["rejected_reasons"].get("bad_input", 0) for name, fam in families.items()}
    show_bad = any(bad_input.values())
    header = (f"{'family':<12} {'accepted':>9} {'rejected':>9}" + (f" {'bad input':>10}" if show_bad else "")
              + f" {'accept rate':>12} {'judge +':>8} {'withheld':>9} {'agreed':>8} {'known-wrong rejected':>21}"
              f" {'known-right promoted':>21}")
    lines = [header, "-" * len(header)]
    for name, fam in sorted(families.items()):
        calib = fam.get("calibration") or {}
        judge = fam.get("judge", {})
        agreed = f"{calib['agreed']}/{calib['total']}" if calib.get("total") else "-"
        rejected = (f"{calib['known_wrong_rejected']}/{calib['known_wrong_total']}" if calib.get("known_wrong_total")
                    else "-")
        recovered = (f"{calib['known_right_promoted']}/{calib['known_right_total']}" if calib.get("known_right_total")
                     else "-")
        lines.append(f"{name:<12} {fam['accepted_qa']:>9} {fam['rejected_qa']:>9}"
                     + (f" {bad_input[name]:>10}" if show_bad else "")
                     + f" {fam['accept_rate']:>11.1%} {judge.get('promoted', 0):>8} {judge.get('withheld', 0):>9} "
                     f"{agreed:>8} {rejected:>21} {recovered:>21}")
    return "\n".join(lines)


def explore_stats(tally: FamilyRouting, plans: dict[str, SplitPlan]) -> dict[str, Any] | None:
    """What the explore pass found in a family (None without one): the pass-rate histogram over questions,
    on-policy pairs found, responses drawn (greedy included) and the share of questions in the learnable zone."""
    if not tally.explore_questions:
        return None
    questions = tally.explore_questions
    learnable = questions - tally.explore_pass_rates[PASS_RATE_BINS[0]] - tally.explore_pass_rates[PASS_RATE_BINS[-1]]
    pairs = plans["dpo_onpolicy"].rows if "dpo_onpolicy" in plans else None
    explore_samples = tally.explore_responses - questions  # responses beyond the one greedy answer per question
    return {
        "questions": questions,
        "responses": tally.explore_responses,
        "explore_samples": explore_samples,
        "explore_generated_tokens": tally.explore_tokens,
        "explore_prompt_tokens": tally.explore_prompt_tokens,
        "mean_pass_rate": round(tally.explore_correct / tally.explore_responses, 6),
        "pass_rate_histogram": {"bins": list(PASS_RATE_BINS),
                                "counts": [tally.explore_pass_rates[b] for b in PASS_RATE_BINS]},
        "learnable": learnable,
        "learnable_share": round(learnable / questions, 6),
        "pairs": pairs,
        "samples_per_pair": round(explore_samples / pairs, 3) if pairs else None,
        # Questions below, inside and above grpo_pass_rate_band (inside = the _grpo rows); None: view not written.
        "grpo_band": ({"below": plans["grpo"].skipped.get("below_band", 0), "inside": plans["grpo"].rows,
                       "above": plans["grpo"].skipped.get("above_band", 0)} if "grpo" in plans else None),
    }


def family_stats(family: str, tally: FamilyRouting, plans: dict[str, SplitPlan], verifier: str,
                 judge_enabled: bool, report: dict[str, Any] | None, max_new_tokens: int,
                 min_specificity: float = 0.95, min_recall: float = 0.5) -> dict[str, Any]:
    has_calibration = judge_enabled and (tally.calibration_total or tally.known_wrong_total or tally.known_right_total)
    calibration = calibration_stats(tally) if has_calibration else None
    return {
        "verifier": verifier,
        "prepared_rows": tally.prepared_rows,
        "prepared_qa": tally.prepared_qa,
        "accepted_qa": tally.accepted_qa,
        "rejected_qa": tally.rejected_qa,
        "blind_dropped_qa": tally.blind_dropped_qa,
        "accept_rate": round(tally.accepted_qa / tally.prepared_qa, 6) if tally.prepared_qa else 0.0,
        "verifier_accepted_qa": tally.verifier_accepted_qa,
        "rejected_reasons": dict(sorted(tally.rejected_reasons.items())),
        "splits": {
            kind: {
                "config": plan.config,
                "rows": plan.rows,
                "qa_pairs": plan.qa_pairs,
                "shards": plan.shards,
                "num_bytes": plan.num_bytes,
                "download_size": plan.download_size,
                **({"skipped": dict(sorted(plan.skipped.items()))} if plan.skipped else {}),
            }
            for kind, plan in plans.items()
        },
        "judge": {
            "enabled": judge_enabled,
            # samples by path: settled by the verifier's match, by the decisive rule, or graded by the judge
            "verifier": tally.judge_paths.get("verifier", 0),
            "decisive": tally.judge_paths.get("decisive", 0),
            "judged": sum(tally.judge_verdicts.values()),
            "promoted": tally.judge_promoted_qa,
            "withheld": tally.judge_withheld,
            "correct": tally.judge_verdicts.get(CORRECT, 0),
            "wrong": tally.judge_verdicts.get(WRONG, 0),
            "unsure": tally.judge_verdicts.get(UNSURE, 0),
            "gate": gate_stats(calibration, min_specificity, consulted=sum(tally.judge_verdicts.values()) > 0,
                               min_recall=min_recall),
            "promotions": list(tally.promotions),  # up to 10 promoted pairs, to spot-check
            "withheld_promotions": list(tally.withheld_promotions),  # up to 10 the gate withheld
        },
        "calibration": calibration,
        "cleaning": {
            "steps": dict(sorted(tally.cleaning_steps.items())),
            "report": cleaning_counts(report, family),
        },
        "tokens": {
            "samples": tally.samples,
            "prompt": tally.prompt_tokens,
            "generated": tally.generated_tokens,
            "judge_generated": tally.judge_generated_tokens,
            "judge_prompt": tally.judge_prompt_tokens,
            "hit_limit": tally.hit_limit,
            "with_reasoning": tally.with_reasoning,  # responses with a closed reasoning block
        },
        "response_lengths": response_length_histogram(tally.response_tokens, max_new_tokens),
        "explore": explore_stats(tally, plans),
        "blind": blind_stats(tally),
    }


def blind_stats(tally: FamilyRouting) -> dict[str, Any] | None:
    """Accepted pairs the model also answers right without the image (None: no blind check), with the chance rate
    of its multiple-choice pairs (mean 1 / options) beside the share."""
    if not tally.blind_checked:
        return None
    return {
        "checked": tally.blind_checked,
        "solvable": tally.blind_solvable,
        "share": round(tally.blind_solvable / tally.blind_checked, 6),
        "mc_checked": tally.blind_mc_checked,
        "mc_chance_rate": round(tally.blind_chance / tally.blind_mc_checked, 6) if tally.blind_mc_checked else None,
        "dropped": tally.blind_dropped_qa,
        "examples": list(tally.blind_examples),
    }


def tokens_by_stage(families: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    def total(get) -> int:
        return sum(get(f) for f in families.values())

    out = {
        "generate": {"prompt": total(lambda f: f["tokens"]["prompt"]),
                     "completion": total(lambda f: f["tokens"]["generated"])},
        "judge": {"prompt": total(lambda f: f["tokens"].get("judge_prompt", 0)),
                  "completion": total(lambda f: f["tokens"]["judge_generated"])},
    }
    if any(f.get("explore") for f in families.values()):
        out["explore"] = {"prompt": total(lambda f: (f.get("explore") or {}).get("explore_prompt_tokens", 0)),
                          "completion": total(lambda f: (f.get("explore") or {}).get("explore_generated_tokens", 0))}
    return out


def cost_by_stage(tokens: dict[str, dict[str, int]], prompt_price: float | None,
                  completion_price: float | None) -> dict[str, Any] | None:
    """What the tokens of each stage cost at the recipe's prices per million prompt / completion tokens (None: no
    price given). A price not given counts as 0."""
    if prompt_price is None and completion_price is None:
        return None
    per_stage = {stage: round((t["prompt"] * (prompt_price or 0) + t["completion"] * (completion_price or 0)) / 1e6, 6)
                 for stage, t in tokens.items()}
    return {"price_per_million": {"prompt": prompt_price, "completion": completion_price},
            "stages": per_stage, "total": round(sum(per_stage.values()), 6)}


def server_requests(output_dir: str) -> dict[str, dict[str, Any]] | None:
    """Per stage that asked a server (the openai engine): requests, retries by cause, and the drops (failed,
    refused, content null), summed over every run and rank (rsgen.store.read_server_counts). None: no server."""
    from rsgen.store import read_server_counts

    layout = OutputLayout(output_dir)
    out = {}
    for stage, directory in (("generate", layout.generate_work), ("explore", layout.explore_work),
                             ("judge", layout.judge_work), ("blind", layout.blind_work)):
        counts = read_server_counts(directory) if directory.is_dir() else None
        if counts is not None:
            out[stage] = counts
    return out or None


def build_stats(recipe: RecipeConfig, families: dict[str, dict[str, Any]], run: dict[str, Any] | None,
                report: dict[str, Any] | None, work_records_outside_pool: int) -> dict[str, Any]:
    accepted = sum(f["accepted_qa"] for f in families.values())
    rejected = sum(f["rejected_qa"] for f in families.values())
    blind_dropped = sum(f.get("blind_dropped_qa", 0) for f in families.values())
    calib = [f["calibration"] for f in families.values() if f["calibration"]]
    judges = [f["judge"] for f in families.values()]
    revision = (run or {}).get("model_revision") or recipe.model_revision
    return {
        "stats_version": STATS_VERSION,
        "model": recipe.model_name_or_path,
        "model_revision": revision,
        "judge_model": recipe.judge_model_name_or_path or recipe.model_name_or_path,
        "generation": {
            "temperature": recipe.temperature,
            "top_p": recipe.top_p,
            "enable_thinking": recipe.enable_thinking,
            "chat_template_kwargs": recipe.generation_chat_template_kwargs(),
            "max_new_tokens": recipe.max_new_tokens,
            "num_samples": recipe.num_samples,
            "explore_samples": recipe.explore_samples,
            "explore_temperature": recipe.explore_temperature,
            "explore_top_p": recipe.explore_top_p,
            "explore_stop": recipe.explore_stop,
            "grpo_pass_rate_band": list(recipe.grpo_pass_rate_band),
            "instruction": recipe.instruction,
        },
        "verify": {
            "numeric_tolerance": recipe.numeric_tolerance,
            "math_timeout_seconds": recipe.math_timeout_seconds,
        },
        "judge_enabled": recipe.judge,
        "judge_scope": recipe.judge_scope,
        "judge_min_specificity": recipe.judge_min_specificity,
        "judge_counts": {key: sum(j[key] for j in judges) for key in ("judged", "decisive", "promoted", "withheld")},
        "judge_min_recall": recipe.judge_min_recall,
        "calibration": {key: sum(c.get(key, 0) for c in calib) for key in CALIBRATION_COUNTS} if calib else None,
        "totals": {
            "prepared_qa": accepted + rejected + blind_dropped,
            "blind_dropped_qa": blind_dropped,
            "accepted_qa": accepted,
            "rejected_qa": rejected,
            "accept_rate": round(accepted / (accepted + rejected), 6) if accepted + rejected else 0.0,
            "generated_tokens": sum(f["tokens"]["generated"] for f in families.values()),
            "judge_generated_tokens": sum(f["tokens"]["judge_generated"] for f in families.values()),
        },
        "engine": recipe.engine,
        # Prompt and completion tokens summed per stage (as the engine reported them: `usage` for a server).
        "tokens_by_stage": tokens_by_stage(families),
        "cost": cost_by_stage(tokens_by_stage(families), recipe.engine_price_prompt_per_million,
                              recipe.engine_price_completion_per_million),
        # The openai engine: requests per stage, retries by cause, failed / refused / content-null drops.
        "server_requests": server_requests(recipe.output_dir),
        "work_records_outside_pool": work_records_outside_pool,
        "blind_check": recipe.blind_check,
        "cleaning_policy": cleaning_policy(report),
        "decontamination": (report or {}).get("decontamination"),  # the evaluation sets checked, what each removed
        "wall_time": stage_wall_times(run),
        "sources": [
            {"dataset": s.dataset_name or ", ".join(s.data_files or []) or s.data_dir, "config": s.dataset_config,
             "split": s.split, "family": s.family or f"column {s.family_column}", "kind": source_kind(s)}
            for s in recipe.sources
        ],
        "card": {
            "license": recipe.license,
            "license_name": recipe.license_name,
            "task_categories": list(recipe.task_categories),
            "language": list(recipe.language),
            # The demo model's output is a demo whatever the recipe says: its numbers say nothing of a real model.
            "demo": recipe.demo or bool({DEMO_MODEL, DEMO_BASE_MODEL} & {recipe.model_name_or_path,
                                                                       recipe.judge_model_name_or_path}),
            "hub_dataset_id": recipe.hub_dataset_id,
            "num_card_examples": recipe.num_card_examples,
            "sft_keep_reasoning": recipe.sft_keep_reasoning,
            # Absolute, so `rsgen card OUTPUT_DIR` finds it from any working directory.
            "template": str(Path(recipe.card_template).resolve()) if recipe.card_template else None,
        },
        "families": {name: families[name] for name in sorted(families)},
    }


def source_kind(source: SourceConfig) -> str:
    """hub | local | demo: what the card can cite as a source dataset."""
    if source.dataset_name == DEMO_DATASET:
        return "demo"
    return "hub" if source.dataset_name else "local"


def write_stats(path, stats: dict[str, Any]) -> None:
    path.write_text(json.dumps(stats, indent=2, sort_keys=False, ensure_ascii=False) + "\n", encoding="utf-8")
