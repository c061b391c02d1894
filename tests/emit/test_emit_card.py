"""The dataset card: YAML header that `datasets` and huggingface_hub read, numbers from stats.json only,
examples from the rejected split, re-rendering from disk (`rsgen card`)."""

from __future__ import annotations

import json
import re

import datasets
import yaml
from emit_helpers import scripted_recipe, write_scripted_run
from huggingface_hub import DatasetCard

from rsgen.cli import main
from rsgen.emit import render_card, run_emit
from rsgen.emit.card_header import configs_of
from rsgen.emit.card_tables import _cell
from rsgen.layout import OutputLayout


def _n(v):
    return f"{v:,}"


def test_card_header_parses_and_maps_every_config(emitted_run):
    root, _recipe, _images = emitted_run
    layout = OutputLayout(root)
    stats = json.loads(layout.stats_json.read_text())
    card = DatasetCard.load(layout.dataset / "README.md")  # parses the YAML header (raises on a broken one)
    data = card.data.to_dict()
    assert data["license"] == "other"
    assert data["task_categories"] == ["visual-question-answering"]
    assert data["language"] == ["en"]
    configs = {c["config_name"]: c["data_files"] for c in data["configs"]}
    assert list(configs) == configs_of(stats)
    for name, files in configs.items():
        assert files == [{"split": "train", "path": f"data/{name}/train-*"}]
        assert list((layout.dataset / "data" / name).glob("train-*.parquet"))
    infos = {i["config_name"]: i for i in data["dataset_info"]}
    assert set(infos) == set(configs)
    assert infos["CLEVRMath_rejected"]["splits"] == [
        {"name": "train", "num_bytes": stats["families"]["CLEVRMath"]["splits"]["rejected"]["num_bytes"],
         "num_examples": 4}]
    # The metadata parser `load_dataset` uses agrees.
    from datasets.utils.metadata import MetadataConfigs

    assert set(MetadataConfigs.from_dataset_card_data(card.data)) == set(configs)


def test_card_numbers_come_from_stats(emitted_run):
    root, _recipe, _images = emitted_run
    layout = OutputLayout(root)
    stats = json.loads(layout.stats_json.read_text())
    text = (layout.dataset / "README.md").read_text()
    for family, fam in stats["families"].items():
        rate = f"**{fam['accept_rate']:.1%}**"
        assert f"| {family} | `{fam['verifier']}` | {_n(fam['prepared_qa'])} | {_n(fam['accepted_qa'])} | " \
               f"{_n(fam['rejected_qa'])} | {rate} |" in text
        section = text.split(f"### {family}\n", 1)[1].split("\n### ", 1)[0]
        for row, key in (("rows", "rows"), ("QA pairs", "qa_pairs"), ("shards", "shards")):
            cells = " | ".join(_n(fam["splits"][k][key]) for k in ("RS_think", "RS_nothink", "rejected", "sft", "dpo"))
            assert f"| {row} | {cells} |" in section
        assert f"| accepted / rejected (whole family) | {_n(fam['accepted_qa'])} / {_n(fam['rejected_qa'])} |" in section
        assert f"| accept rate | {rate} |" in section
        tok = fam["tokens"]
        assert f"| {family} | {_n(tok['samples'])} | {_n(tok['prompt'])} | {_n(tok['generated'])} |" in text
        j, c = fam["judge"], fam["calibration"]
        agreed = f"{c['agreed']}/{c['total']}" if c else "–"
        rejected = f"{c['known_wrong_rejected']}/{c['known_wrong_total']}" if c else "–"
        recovered = f"{c['known_right_promoted']}/{c['known_right_total']}" if c and c["known_right_total"] else "–"
        assert (f"| {family} | {j['decisive']} | {j['judged']} | {j['promoted']} | {j['withheld']} | {j['wrong']} | "
                f"{j['unsure']} | {agreed} | {rejected} | {recovered} |") in text
    calib = stats["calibration"]
    assert f"it agreed on {calib['agreed']}/{calib['total']} answers the verifier accepted" in text
    assert f"it said `WRONG` to {calib['known_wrong_rejected']}/{calib['known_wrong_total']} questions" in text
    assert "false-promotion rate of 0.0%" in text
    assert "`judge_scope: all`" in text and "Warning —" not in text
    # Every promotion is listed to spot-check, with its question, reference and candidate.
    for fam in stats["families"].values():
        for p in fam["judge"]["promotions"]:
            assert f"| {_cell(p['question'])} | {p['reference']} | {p['candidate']} |" in text
    assert "- **CLEVRMath**: 15 QA pairs read, 11 kept; 3 dropped (`provenance_mismatch` 3)" in text
    assert "prepare 10 s, generate 600 s, judge 60 s (total 670 s)" in text
    # Every example comes from the rejected split and shows its image.
    for image in re.findall(r"!\[\]\((assets/[^)]+)\)", text):
        assert (layout.dataset / image).is_file()
    assert (layout.dataset / "assets" / "stats.png").read_bytes().startswith(b"\x89PNG")
    assert "This is a demo dataset" not in text
    # One paragraph per verifier actually used, naming its families.
    for name, families in (("relaxed", "CLEVRMath"), ("mc", "DemoMC"), ("exact", "AllRight")):
        assert f"### `{name}` — " in text and f"Used for: {families}." in text
    assert "### `numeric`" not in text and "### `math`" not in text


def test_render_card_rebuilds_from_stats_on_disk(tmp_path):
    write_scripted_run(tmp_path)
    run_emit(scripted_recipe(tmp_path, demo=True, hub_dataset_id="someone/clevr-rs"))
    layout = OutputLayout(tmp_path)
    readme = layout.dataset / "README.md"
    first = readme.read_bytes()
    plot = (layout.dataset / "assets" / "stats.png").read_bytes()
    text = first.decode()
    assert "> **This is a demo dataset.**" in text
    assert text.split("\n---\n", 1)[1].lstrip().startswith("# clevr-rs")
    assert 'load_dataset("someone/clevr-rs", "CLEVRMath_sft", split="train")' in text

    readme.unlink()
    assert render_card(tmp_path) == readme
    assert readme.read_bytes() == first  # same inputs, same bytes
    assert (layout.dataset / "assets" / "stats.png").read_bytes() == plot

    # The card follows stats.json: change a number there and re-render from the command line.
    stats = json.loads(layout.stats_json.read_text())
    stats["families"]["CLEVRMath"]["accepted_qa"] = 123456
    layout.stats_json.write_text(json.dumps(stats))
    main(["card", str(tmp_path)])
    assert "| accepted / rejected (whole family) | 123,456 / 6 |" in readme.read_text()


def test_card_without_judge_or_rejections(tmp_path):
    write_scripted_run(tmp_path, judge=False)
    run_emit(scripted_recipe(tmp_path, judge=False))
    text = (OutputLayout(tmp_path).dataset / "README.md").read_text()
    assert "agreed on" not in text and "(`judge: false`)" in text
    assert "The model answered every question of this family correctly: the rejected split is empty." in text
    assert "`AllRight_rejected`, `AllRight_dpo`: no rows, so not written" in text


def test_card_metadata_default_config_and_run_files(tmp_path):
    write_scripted_run(tmp_path)
    sources = [{"dataset_name": "HuggingFaceM4/ChartQA", "family": "CLEVRMath"},
               {"data_files": ["local.parquet"], "family": "DemoMC"}, {"dataset_name": "rsgen-demo", "family": "X"}]
    run_emit(scripted_recipe(tmp_path, sources=sources, hub_dataset_id="someone/clevr-rs"))
    layout = OutputLayout(tmp_path)
    card = DatasetCard.load(layout.dataset / "README.md")
    data = card.data.to_dict()
    assert data["pretty_name"] == "clevr-rs"
    assert data["size_categories"] == ["n<1K"]  # 23 QA pairs
    assert data["source_datasets"] == ["HuggingFaceM4/ChartQA", "original"]  # local files are not a Hub source
    assert (data["license"], data["license_name"], data["license_link"]) == ("other", "derived-from-sources",
                                                                             "LICENSE.md")
    assert "`other` (`derived-from-sources`)" in (layout.dataset / "LICENSE.md").read_text()
    defaults = [c["config_name"] for c in data["configs"] if c.get("default")]
    assert defaults == ["AllRight_sft"]  # the first family's SFT view
    # `load_dataset(dir, split="train")` needs no config name.
    ds = datasets.load_dataset(str(layout.dataset), split="train", download_mode="force_redownload")
    assert ds.column_names == ["prompt", "completion", "images"]
    # What the card cites lies next to it (and is uploaded with the folder).
    assert json.loads((layout.dataset / "stats.json").read_text()) == json.loads(layout.stats_json.read_text())
    assert (layout.dataset / "run.json").read_bytes() == layout.run_json.read_bytes()
    assert yaml.safe_load((layout.dataset / "recipe.yaml").read_text())["hub_dataset_id"] == "someone/clevr-rs"
    # The card states the size on disk, in total and per config.
    text = card.text
    stats = json.loads(layout.stats_json.read_text())
    total = sum(s["download_size"] for fam in stats["families"].values() for s in fam["splits"].values())
    assert f"On disk the data takes **{total / 1e3:,.1f} kB** of parquet" in text
    assert "| size on disk | " in text
    assert "`other` (`derived-from-sources`)" in text

    run_emit(scripted_recipe(tmp_path, license="cc-by-4.0"))
    data = DatasetCard.load(layout.dataset / "README.md").data.to_dict()
    assert data["license"] == "cc-by-4.0" and "license_name" not in data and "source_datasets" not in data
    assert not (layout.dataset / "LICENSE.md").exists()


def test_the_demo_model_always_gets_the_demo_banner(tmp_path):
    """A dataset made by the 1.1M-parameter demo model is a demo, `demo: true` or not."""
    write_scripted_run(tmp_path)
    run_emit(scripted_recipe(tmp_path, model_name_or_path="rsgen-demo"))
    assert "> **This is a demo dataset.**" in (OutputLayout(tmp_path).dataset / "README.md").read_text()


def test_tokens_are_summed_per_stage_in_stats_and_on_the_card(emitted_run):
    root, _recipe, _images = emitted_run
    layout = OutputLayout(root)
    stats = json.loads(layout.stats_json.read_text())
    generate = [json.loads(line) for part in sorted(layout.generate_work.glob("*.jsonl"))
                for line in part.read_text().splitlines()]
    judged = [json.loads(line) for part in sorted(layout.judge_work.glob("*.jsonl"))
              for line in part.read_text().splitlines()]
    by_stage = stats["tokens_by_stage"]
    assert by_stage["generate"] == {"prompt": sum(r["prompt_tokens"] for r in generate),
                                    "completion": sum(r["generated_tokens"] for r in generate)}
    assert by_stage["judge"] == {"prompt": sum(r["prompt_tokens"] for r in judged),
                                 "completion": sum(r["generated_tokens"] for r in judged)}
    text = (layout.dataset / "README.md").read_text()
    assert (f"Tokens by stage, prompt / completion (engine `transformers`): generate "
            f"{_n(by_stage['generate']['prompt'])} / {_n(by_stage['generate']['completion'])}") in text
    assert "No response carries reasoning" not in text  # the scripted responses reason


def test_the_card_says_so_when_no_response_carries_reasoning(emitted_run):
    from rsgen.emit.card_tables import tokens_table

    root, _recipe, _images = emitted_run
    stats = json.loads(OutputLayout(root).stats_json.read_text())
    for fam in stats["families"].values():
        fam["tokens"]["with_reasoning"] = 0  # as from a hosted model that hides its reasoning
    assert "No response carries reasoning" in tokens_table(stats)


def test_prices_in_the_recipe_give_the_cost_per_stage_in_stats_and_on_the_card(tmp_path):
    write_scripted_run(tmp_path)
    run_emit(scripted_recipe(tmp_path, engine_price_prompt_per_million=0.5, engine_price_completion_per_million=2.0))
    layout = OutputLayout(tmp_path)
    stats = json.loads(layout.stats_json.read_text())
    tokens, cost = stats["tokens_by_stage"], stats["cost"]
    for stage, t in tokens.items():
        assert cost["stages"][stage] == round((t["prompt"] * 0.5 + t["completion"] * 2.0) / 1e6, 6)
    assert cost["total"] == round(sum(cost["stages"].values()), 6) and cost["total"] > 0
    text = (layout.dataset / "README.md").read_text()
    assert (f"Cost by stage at 0.5 per million prompt tokens and 2 per million completion tokens (the recipe's "
            f"prices, the engine's token counts): generate {cost['stages']['generate']:,.4f}") in text
    run_emit(scripted_recipe(tmp_path))  # no prices: no cost
    assert json.loads(layout.stats_json.read_text())["cost"] is None
    assert "Cost by stage" not in (layout.dataset / "README.md").read_text()
