"""The dataset card's YAML header (`card_data`): the fields the Hub and `datasets` read — configs and their data
files, the default config, license, size category, source datasets, and `dataset_info` (features and sizes per
config, as `push_to_hub` writes them). Every value comes from stats.json."""

from __future__ import annotations

from typing import Any

from huggingface_hub import DatasetCardData

from rsgen.emit.stats import config_features, config_glob


def configs_of(stats: dict[str, Any]) -> list[str]:
    """Every config with rows (an empty one is not written: `datasets` cannot load a split without rows)."""
    return [split["config"] for fam in stats["families"].values() for split in fam["splits"].values()
            if split["rows"]]


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
