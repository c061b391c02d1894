"""The dataset card `dataset/README.md`, modelled on the public card of `elliot-mllm/CLEVRMath_rejected` on the Hub.

Every number comes from stats.json; the examples come straight from the written rejected shards (their images
saved, as stored, under `assets/`). Rendering reads nothing else, so `rsgen card OUTPUT_DIR` rebuilds the card
from disk and two renders of the same files are byte-identical.

The card is its template, `card_template.md` (the words; a recipe's `card_template` replaces it), rendered by
huggingface_hub's `DatasetCard.from_template` with `card_context`: the YAML header from `card_header.py`, the
figures and tables from `card_tables.py` (whose sentences are the macros of `card_parts.jinja`), and the examples
read here.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from huggingface_hub import DatasetCard

from rsgen.emit.card_header import LICENSE_FILE, card_data, title
from rsgen.emit.card_tables import (
    _cell,
    _n,
    _rate,
    _size,
    _table,
    _verifier_names,
    blind_figures,
    calibration_examples,
    calibration_figures,
    cleaning_figures,
    disk_bytes,
    explore_figures,
    family_tables,
    gate_figures,
    iterate_figures,
    judge_table,
    license_section,
    overview_table,
    spot_checks,
    tokens_table,
    training_figures,
    training_value_figures,
)
from rsgen.emit.plots import (
    ITERATE_PLOT_NAME,
    PASS_RATE_PLOT_NAME,
    PLOT_NAME,
    draw_iterate_plot,
    draw_pass_rate_plot,
    draw_stats_plot,
)
from rsgen.emit.splits import EmitError

TEMPLATE_PATH = Path(__file__).with_name("card_template.md")
LONG_FIELD_CHARS = 300  # table cells longer than this go into a <details> block instead

# ------------------------------------------------------------------------------------------------ examples


def _fence(text: str) -> str:
    runs = [len(m) for m in re.findall(r"`+", text)]
    return "`" * max(3, max(runs, default=0) + 1)


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


# ------------------------------------------------------------------------------------------------ render


def card_context(stats: dict[str, Any], dataset_dir: Path) -> dict[str, Any]:
    """What a card template is rendered with: stats.json whole (`stats`), the figures and tables computed from it,
    and the formatting helpers `n` (1,234) and `rate` (12.3%).

    title, demo, sources, family_names, overview_table, disk {total, per_kind}, family_tables [{family, split_table,
    summary_table, empty_configs}], plot_name, gen (stats.generation), chat_template_kwargs, tokens_table,
    wall_times [(stage, seconds)], wall_total, verifiers [{name, families}], judge_counts, calibration, gate,
    judge_table, spot_checks, explore {table, histogram, plot_name} or None, iterate {rounds, base_model,
    from_base, dpo, held_out_images, held_out_fraction, rounds_table, family_table, plot_name, stopped} or None,
    training_value {table, held_out_qa, held_out_images, command, commit, date, wall_minutes, load, notes} or None,
    training {repo, family}, examples
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
        "training_value": training_value_figures(stats),
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
