"""The card as a Jinja template (rsgen/emit/card_template.md) rendered by huggingface_hub's
`DatasetCard.from_template`: figures equal stats.json, the words come from the template file, and a recipe can
bring its own template (`card_template`), which `rsgen card` re-renders with."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import huggingface_hub
import pytest
from card_figures import assert_card_figures_match_stats
from emit_helpers import scripted_recipe, write_scripted_run
from huggingface_hub import DatasetCard

from rsgen.cli import main
from rsgen.emit import EmitError, run_emit
from rsgen.emit.card import TEMPLATE_PATH
from rsgen.layout import OutputLayout

SECTIONS = ["## Statistics", "## How the data was produced", "## How a match is decided",
            "## Second pass: model-as-judge", "## Schema", "## Training with TRL", "## Examples",
            "## Cleaning applied before rejection sampling", "## License", "## Reproducing"]


def test_every_figure_on_the_card_equals_stats_json(emitted_run):
    root, _recipe, _images = emitted_run
    layout = OutputLayout(root)
    stats = json.loads(layout.stats_json.read_text())
    card = (layout.dataset / "README.md").read_text()
    assert assert_card_figures_match_stats(card, stats) > 100
    assert re.findall(r"^## .*", card, flags=re.M) == SECTIONS
    assert "\n\n\n" not in card and "{{" not in card and "{%" not in card


def test_the_words_come_from_the_template_file(tmp_path):
    """A sentence changed in a copy of the shipped template is what the card says (no prose left in Python)."""
    write_scripted_run(tmp_path)
    own = tmp_path / "card.md"
    text = TEMPLATE_PATH.read_text()
    sentence = "The judge is instructed to compare against the reference"
    assert sentence in text
    own.write_text(text.replace(sentence, "Our grader compares with the reference"))
    run_emit(scripted_recipe(tmp_path, card_template=str(own)))
    card = (OutputLayout(tmp_path).dataset / "README.md").read_text()
    assert "Our grader compares with the reference" in card and sentence not in card
    assert assert_card_figures_match_stats(card, json.loads(OutputLayout(tmp_path).stats_json.read_text())) > 100


def test_own_template_gets_the_figures_and_rsgen_card_keeps_it(tmp_path, monkeypatch):
    write_scripted_run(tmp_path)
    own = tmp_path / "templates" / "my_card.md"
    own.parent.mkdir()
    own.write_text("---\n{{ card_data }}\n---\n\n# {{ pretty_name }}\n\n"
                   "{{ n(stats.totals.accepted_qa) }} accepted of {{ n(stats.totals.prepared_qa) }} "
                   "({{ rate(stats.totals.accept_rate) }}).\n\n{{ overview_table }}\n")
    # A relative path, as a recipe gives it: stats.json records it absolute, so `rsgen card` finds it from anywhere.
    monkeypatch.chdir(own.parent)
    run_emit(scripted_recipe(tmp_path, card_template="my_card.md"))
    layout = OutputLayout(tmp_path)
    stats = json.loads(layout.stats_json.read_text())
    assert stats["card"]["template"] == str(own)
    readme = layout.dataset / "README.md"
    card = DatasetCard.load(readme)
    t = stats["totals"]
    assert card.text.startswith(f"\n# {card.data.pretty_name}\n\n"
                                f"{t['accepted_qa']} accepted of {t['prepared_qa']} ({t['accept_rate']:.1%}).")
    assert "| **all** |" in card.text and "## Schema" not in card.text
    assert [c["config_name"] for c in card.data.to_dict()["configs"]]  # the YAML header is rsgen's

    monkeypatch.chdir(tmp_path.parent)
    first = readme.read_text()
    readme.unlink()
    main(["card", str(tmp_path)])
    assert readme.read_text() == first


def test_huggingface_hubs_own_template_renders(tmp_path):
    """The stock template of huggingface_hub takes rsgen's figures as they are (its variables left empty)."""
    write_scripted_run(tmp_path)
    stock = Path(huggingface_hub.__file__).parent / "templates" / "datasetcard_template.md"
    own = tmp_path / "stock.md"
    shutil.copyfile(stock, own)
    run_emit(scripted_recipe(tmp_path, card_template=str(own), hub_dataset_id="someone/clevr-rs"))
    card = DatasetCard.load(OutputLayout(tmp_path).dataset / "README.md")
    assert "# Dataset Card for clevr-rs" in card.text
    assert card.data.pretty_name == "clevr-rs" and card.data.to_dict()["configs"]


@pytest.mark.parametrize("content, message", [
    (None, "cannot be read (No such file or directory)"),
    ("# {{ title }\n", "line 1: unexpected '}'"),
    ("{% for x in stats.families %}\n{{ x }}\n", "line 2: Unexpected end of template"),
])
def test_a_bad_template_is_one_line_before_anything_is_written(tmp_path, content, message):
    write_scripted_run(tmp_path)
    own = tmp_path / "bad.md"
    if content is not None:
        own.write_text(content)
    with pytest.raises(EmitError) as err:
        run_emit(scripted_recipe(tmp_path, card_template=str(own)))
    text = str(err.value)
    assert "\n" not in text and f"card_template {str(own)!r}" in text and message in text, text
    assert not OutputLayout(tmp_path).dataset.exists() and not OutputLayout(tmp_path).dataset_partial.exists()


def test_a_template_that_fails_while_rendering_is_one_line(tmp_path):
    write_scripted_run(tmp_path)
    own = tmp_path / "bad.md"
    own.write_text("---\n{{ card_data }}\n---\n{{ no_such_thing.field }}\n")
    with pytest.raises(EmitError, match=r"card_template .*'no_such_thing' is undefined; fix the template"):
        run_emit(scripted_recipe(tmp_path, card_template=str(own)))
