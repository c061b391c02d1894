"""The emit stage: prepared pool + generate/judge work -> OUTPUT_DIR/dataset/, stats.json, the card, a push.

Two passes over the prepared pool. The first routes every QA pair and counts what each config will hold (rows,
QA pairs, bytes). The second routes each family's pairs again and writes its configs (the three splits and the
recipe's `views`), one family at a time (one open writer per config kind, whatever the number of families).
The work is read from an on-disk index a batch of prepared rows at a time (`rsgen.emit.work_index`), and nothing is
kept per QA pair between the passes (only each family's row positions), so memory does not grow with the pool.
Images pass through as stored (their bytes and sha256 are checked, never re-encoded). The dataset is built in
`dataset.partial/` and swapped in at the end, so `dataset/` is always a complete emit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shutil
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import yaml

from rsgen.config import RecipeConfig
from rsgen.decisions import decided_records
from rsgen.emit.card import check_template, write_card
from rsgen.emit.card_header import default_config
from rsgen.emit.card_tables import training_value_figures
from rsgen.emit.splits import (
    EmitError,
    FamilyRouting,
    PairOutcome,
    WorkRecords,
    emitted_clean_meta,
    split_qa,
    tally_row,
    with_blind,
    with_explore,
)
from rsgen.emit.stats import (
    CALIBRATION_ZERO,
    MB,
    RS_KINDS,
    SPLIT,
    SplitPlan,
    build_stats,
    config_features,
    config_name,
    family_stats,
    stats_table,
    write_stats,
    written_kinds,
)
from rsgen.emit.trl_views import VIEWS
from rsgen.emit.work_index import IndexedWork
from rsgen.layout import OutputLayout
from rsgen.records import BlindRecord, records_by_key
from rsgen.routing import gate_lines
from rsgen.schema import PreparedPool, open_prepared
from rsgen.shards import ParquetShardWriter, swap_dir_into_place, written_sizes
from rsgen.store import CheckpointStore

BATCH_ROWS = 64  # prepared rows read per batch (bounded by image bytes, not by the pool)
_CONFIG_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


logger = logging.getLogger(__name__)


def _log(message: str) -> None:
    logger.info(message)


def config_prefix(family: str) -> str:
    """The family's name as used in config names and paths (anything but letters, digits, `_.-` becomes `_`)."""
    prefix = _CONFIG_SAFE.sub("_", family).strip("_")
    if not prefix:
        raise EmitError(f"family {family!r} has no usable characters for a config name")
    return prefix


def rows_for_image(image: dict[str, Any], sha: str, qas: list[dict[str, Any]], outcomes: list[PairOutcome],
                   meta: dict[str, Any], recipe: RecipeConfig, kinds: tuple[str, ...],
                   ) -> tuple[dict[str, list[dict]], dict[str, dict[str, int]]]:
    """Every row one prepared image contributes to each config kind in `kinds`; plus, per view, the pairs it
    left out, by why."""
    out: dict[str, list[dict]] = {kind: [] for kind in kinds}
    for kind, split in RS_KINDS.items():
        qa = split_qa(split, qas, outcomes)
        if qa:  # an image with no QA pair in a split is not written to it
            out[kind].append({"image": image, "image_sha256": sha, "qa": qa,
                              "clean_meta": _with_blind(_with_rounds(meta, split, outcomes), split, outcomes)})
    skipped: dict[str, dict[str, int]] = {}
    for kind in kinds:
        view = VIEWS.get(kind)
        if view is None:
            continue
        source = out[view.reads][0]["qa"] if out.get(view.reads) else split_qa(view.reads, qas, outcomes)
        if source:
            out[kind], skipped[kind] = view.rows(image, source, recipe)
    return out, skipped


def _with_blind(meta: dict[str, Any], split: str, outcomes: list[PairOutcome]) -> dict[str, Any]:
    """clean_meta of an accepted split with, per pair of its `qa`, whether the pair is blind-solvable (blind_check
    on: flagged pairs stay, and say so in the data)."""
    if split == "rejected" or all(o.blind_solvable is None for o in outcomes):
        return meta
    return {**meta, "qa_blind_solvable": [bool(o.blind_solvable) for o in outcomes if o.accepted]}


def _with_rounds(meta: dict[str, Any], split: str, outcomes: list[PairOutcome]) -> dict[str, Any]:
    """clean_meta with the round of each pair in the row's `qa` when the outcomes come from `rsgen iterate`."""
    if all(o.round is None for o in outcomes):
        return meta
    kept = [o for o in outcomes if o.accepted == (split != "rejected")]
    return {**meta, "qa_rounds": [o.round for o in kept]}


@dataclass
class FamilyPlan:
    family: str
    prefix: str
    tally: FamilyRouting = field(default_factory=FamilyRouting)
    plans: dict[str, SplitPlan] = field(default_factory=dict)
    row_indices: array = field(default_factory=lambda: array("q"))  # positions in the prepared pool (8 bytes each)
    rounds: bool = False  # some outcome has a round (`rsgen iterate`): the splits' clean_meta has qa_rounds
    blind: bool = False  # some outcome has a blind check: the accepted splits' clean_meta has qa_blind_solvable


def _prepared_tables(tables: Iterable[pa.Table]) -> Iterator[tuple[range, pa.Array, list, list[dict]]]:
    """Per table of prepared rows: (the rows' positions in the tables read, image bytes (or None) per row, image
    byte length per row, row dicts without the image)."""
    position = 0
    for table in tables:
        image_bytes = table.column("image").combine_chunks().field("bytes")
        lengths = pc.binary_length(image_bytes).to_pylist()
        rest = table.drop_columns(["image"]).to_pylist()
        yield range(position, position + len(rest)), image_bytes, lengths, rest
        position += len(rest)


def _outcomes(row: dict[str, Any], view: WorkRecords) -> list[PairOutcome]:
    """Where each QA pair of a prepared row goes; `view`: the work of its batch of rows (`WorkRecords.batch`)."""
    return [with_blind(with_explore(view.outcome(qa), qa, view), view) for qa in row["qa"]]


def _batch_ids(rows: list[dict[str, Any]]) -> list[str]:
    return [qa["id"] for row in rows for qa in row["qa"]]


def plan_families(prepared: PreparedPool, work: WorkRecords, recipe: RecipeConfig) -> dict[str, FamilyPlan]:
    """Pass 1: route every QA pair and size every config."""
    families: dict[str, FamilyPlan] = {}
    kinds = written_kinds(recipe.views, explore=recipe.explore_samples > 0)
    for positions, _images, lengths, rows in _prepared_tables(prepared.batches(batch_size=BATCH_ROWS)):
        ids = _batch_ids(rows)
        work.note_prepared(ids)
        view = work.batch(ids)  # the work of these rows, read once for all of them
        for position, nbytes, row in zip(positions, lengths, rows):
            if nbytes is None:
                raise EmitError(f"prepared row {position} (family {row['family']!r}) has no embedded image bytes; "
                                "re-run `rsgen prepare`")
            _plan_row(families, kinds, position, row, _outcomes(row, view), view, recipe)
    prefixes: dict[str, str] = {}
    for plan in families.values():
        if plan.prefix in prefixes:
            raise EmitError(f"families {prefixes[plan.prefix]!r} and {plan.family!r} map to the same config name "
                            f"prefix {plan.prefix!r}; rename one of them in the recipe")
        prefixes[plan.prefix] = plan.family
    return families


def _plan_row(families: dict[str, FamilyPlan], kinds: tuple[str, ...], position: int, row: dict[str, Any],
              outcomes: list[PairOutcome], work: WorkRecords, recipe: RecipeConfig) -> None:
    """Tally one prepared row's routing and count the rows it adds to each config."""
    family = row["family"]
    plan = families.get(family)
    if plan is None:
        plan = families[family] = FamilyPlan(family, config_prefix(family))
        plan.plans = {kind: SplitPlan(config_name(plan.prefix, kind)) for kind in kinds}
    qas = row["qa"]
    tally_row(plan.tally, qas, outcomes, row["clean_meta"]["steps"] or [], work)
    plan.row_indices.append(position)
    plan.rounds = plan.rounds or any(o.round is not None for o in outcomes)
    plan.blind = plan.blind or any(o.blind_solvable is not None for o in outcomes)
    meta = emitted_clean_meta(row["clean_meta"], recipe.model_name_or_path, recipe.verifier_for(family))
    placeholder = {"bytes": b"", "path": None}
    rows, skipped = rows_for_image(placeholder, row["image_sha256"], qas, outcomes, meta, recipe, kinds)
    for kind, kind_rows in rows.items():
        split = plan.plans[kind]
        split.rows += len(kind_rows)
        split.qa_pairs += sum(len(r["qa"]) for r in kind_rows) if kind in RS_KINDS else len(kind_rows)
    for kind, counts in skipped.items():
        for why, n in counts.items():
            plan.plans[kind].skipped[why] = plan.plans[kind].skipped.get(why, 0) + n


def write_family(prepared: PreparedPool, plan: FamilyPlan, work: WorkRecords, recipe: RecipeConfig,
                 dataset_dir: Path) -> None:
    """Pass 2: route the family's QA pairs again (as pass 1 did: the same work, the same rules) and write its
    configs."""
    # An empty config is not written: `datasets` cannot load a split without rows.
    writers = {
        kind: ParquetShardWriter(dataset_dir / "data" / split.config,
                                 config_features(kind, plan.rounds, plan.blind), SPLIT,
                                 max_shard_bytes=recipe.shard_size_mb * MB)
        for kind, split in plan.plans.items()
        if split.rows
    }
    verifier = recipe.verifier_for(plan.family)
    subset = prepared.take(plan.row_indices)
    for n, images, _lengths, rows in _prepared_tables(subset):
        view = work.batch(_batch_ids(rows))
        for i, row in enumerate(rows):
            data = images[i].as_py()
            sha = row["image_sha256"]
            if hashlib.sha256(data).hexdigest() != sha:
                raise EmitError(f"prepared image of family {plan.family!r} (row {plan.row_indices[n[i]]}) does not "
                                f"match its image_sha256 {sha}; the prepared pool is damaged, re-run `rsgen prepare`")
            image = {"bytes": data, "path": None}
            meta = emitted_clean_meta(row["clean_meta"], recipe.model_name_or_path, verifier)
            out, _ = rows_for_image(image, sha, row["qa"], _outcomes(row, view), meta, recipe, tuple(plan.plans))
            for kind, kind_rows in out.items():
                for r in kind_rows:
                    writers[kind].add(r)
    for kind, writer in writers.items():
        paths = writer.close()
        split = plan.plans[kind]
        split.shards = len(paths)
        split.num_bytes, split.download_size = written_sizes(paths)


def _read_json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def read_training_value(path: Path) -> dict[str, Any]:
    """OUTPUT_DIR/training_value.json (bench/bench_training_value.py's table), checked whole before any card is
    written: a file that is not its JSON is an EmitError naming what is wrong."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise EmitError(f"{str(path)!r} is not readable JSON ({err}); rerun bench/bench_training_value.py or remove "
                        "it") from None
    training_value_figures({"training_value": value}, where=str(path))
    return value


def load_work(recipe: RecipeConfig) -> WorkRecords:
    """The generate (with verify's decisions), judge (and explore) work of the recipe's output directory, as emit
    routes it."""
    layout = OutputLayout(recipe.output_dir)
    work = WorkRecords.load(decided_records(recipe).values(), layout.judge_work, judge_enabled=recipe.judge,
                            num_samples=recipe.num_samples, judge_scope=recipe.judge_scope,
                            numeric_tolerance=recipe.numeric_tolerance,
                            min_specificity=recipe.judge_min_specificity,
                            explore_dir=layout.explore_work if recipe.explore_samples else None)
    if recipe.blind_check != "off":
        work.blind = records_by_key(CheckpointStore(layout.blind_work), BlindRecord)
        work.blind_drop = recipe.blind_check == "drop"
    return work


def check_emit(recipe: RecipeConfig) -> None:
    """Pre-flight: the recipe's views exist (and have the explore pass they need); a push can reach the Hub."""
    written_kinds(recipe.views, explore=recipe.explore_samples > 0)
    if recipe.push_to_hub:
        from rsgen.emit.push import check_hub_access

        check_hub_access(recipe)


def run_emit(recipe: RecipeConfig, state=None, *, work: WorkRecords | None = None,
             extra_stats: dict[str, Any] | None = None) -> Path:
    """Write OUTPUT_DIR/dataset/ (splits, TRL views, card, assets) and OUTPUT_DIR/stats.json; push if asked.
    One writer: the pipeline calls it on the main process only (`state` is unused).

    `work`: the records to route (default: the output directory's own work; `rsgen iterate` passes its rounds
    merged); `extra_stats`: more top-level stats.json entries the card renders (`iterate`)."""
    if recipe.push_to_hub:  # fail before writing anything when the push cannot happen
        from rsgen.emit.push import check_hub_access

        check_hub_access(recipe)
    check_template(recipe.card_template)
    layout = OutputLayout(recipe.output_dir)
    # Checked before anything is written: the card shows a measured table whole or not at all.
    training_value = read_training_value(layout.training_value) if layout.training_value.is_file() else None
    prepared = open_prepared(recipe.output_dir)
    if work is not None:
        families, outside = _write_dataset(recipe, prepared, work)
    else:
        with IndexedWork.build(recipe) as indexed:
            families, outside = _write_dataset(recipe, prepared, indexed)
    report = _read_json(layout.prepare_report)
    stats_families = {
        plan.family: family_stats(plan.family, plan.tally, plan.plans, recipe.verifier_for(plan.family), recipe.judge,
                                  report, recipe.max_new_tokens, recipe.judge_min_specificity, recipe.judge_min_recall)
        for plan in families.values()
    }
    gate = {family: {**(fam["calibration"] or CALIBRATION_ZERO), "judged": fam["judge"]["judged"],
                     "withheld": fam["judge"]["withheld"]}
            for family, fam in stats_families.items() if fam["judge"]["enabled"]}
    for level, line in gate_lines(gate, recipe.judge_min_specificity, recipe.judge_min_recall):
        logger.log(level, line)
    stats = {**build_stats(recipe, stats_families, _read_json(layout.run_json), report, outside), **(extra_stats or {})}
    # work without blind records (`rsgen iterate` merges them only when the rounds have them; IndexedWork: none
    # exactly when the recipe has blind_check: off)
    if (work.blind is None) if work is not None else recipe.blind_check == "off":
        stats["blind_check"] = "off"
    if training_value is not None:
        stats["training_value"] = training_value

    partial = layout.dataset_partial
    write_card(stats, partial)
    write_run_files(recipe, stats, partial)
    swap_dir_into_place(partial, layout.dataset)
    write_stats(layout.stats_json, stats)
    written = sum(1 for plan in families.values() for split in plan.plans.values() if split.rows)
    _log(f"dataset written to {layout.dataset} ({written} configs); stats in {layout.stats_json}")
    print("\n" + stats_table(stats), flush=True)  # the run's final table, on stdout like generate's table
    if default_config(stats) is None:
        logger.warning(f"no default config: no family has accepted QA pairs in an `_sft` view, so "
                       f"`load_dataset({str(layout.dataset)!r})` needs a config name (the rejected splits are never "
                       "the default)")

    if recipe.push_to_hub:
        from rsgen.emit.push import push_dataset

        url = push_dataset(recipe)
        _log(f"pushed to {url}")
    return layout.dataset


def _write_dataset(recipe: RecipeConfig, prepared: PreparedPool, work: WorkRecords) -> tuple[dict[str, FamilyPlan], int]:
    """Route and write every family's configs into dataset.partial/; returns the families' plans and how many QA ids
    of the work are not in the prepared pool."""
    layout = OutputLayout(recipe.output_dir)
    if recipe.judge and not work.has_judge_records() and work.judge_needed():
        raise EmitError("judge: true but there are no judge records in "
                        f"{str(layout.judge_work)!r}; run `rsgen judge` (or `rsgen run`) first, or set judge: false")
    families = plan_families(prepared, work, recipe)
    outside = work.outside_pool()
    if outside:
        _log(f"{outside} QA ids in the generate work are not in the prepared pool; they are not emitted")

    partial = layout.dataset_partial
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for family in sorted(families):
        plan = families[family]
        write_family(prepared, plan, work, recipe, partial)
        _log(f"{family}: {plan.tally.accepted_qa} accepted / {plan.tally.rejected_qa} rejected QA pairs written")
    return families, outside


def write_run_files(recipe: RecipeConfig, stats: dict[str, Any], dataset_dir: Path) -> None:
    """What the card cites, next to it (and so uploaded with it): the resolved recipe, run.json, stats.json."""
    (dataset_dir / "recipe.yaml").write_text(
        yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, width=1000), encoding="utf-8")
    run_json = OutputLayout(recipe.output_dir).run_json
    if run_json.is_file():
        shutil.copyfile(run_json, dataset_dir / "run.json")
    write_stats(dataset_dir / "stats.json", stats)


def render_card(output_dir) -> Path:
    """Re-render OUTPUT_DIR/dataset/README.md (and its assets) from stats.json and the written shards."""
    layout = OutputLayout(output_dir)
    stats = _read_json(layout.stats_json)
    if stats is None:
        raise EmitError(f"{str(layout.stats_json)!r} does not exist; run `rsgen emit` first")
    if not layout.dataset.is_dir():
        raise EmitError(f"{str(layout.dataset)!r} does not exist; run `rsgen emit` first")
    write_stats(layout.dataset / "stats.json", stats)  # the copy beside the card follows the one it was built from
    return write_card(stats, layout.dataset)
