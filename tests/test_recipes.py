"""Every recipe in recipes/ parses and validates offline, and its column names match its dataset's real schema.

The schemas below are copied from the datasets' cards on the Hub (`dataset_info.features`), so this test runs
without network; update them when a dataset changes its layout.
"""

from pathlib import Path

import pytest

from rsgen.config import load_recipe

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))

# dataset -> (columns, conversation turn keys). the_cauldron: every config has `images` (list of images) and
# `texts` (list of {user, assistant, source}). ChartQA: image, query, label (list of strings), human_or_machine.
HUB_SCHEMAS = {
    "HuggingFaceM4/the_cauldron": ({"images", "texts"}, {"user", "assistant", "source"}),
    "HuggingFaceM4/ChartQA": ({"image", "query", "label", "human_or_machine"}, set()),
}
CAULDRON_CONFIGS = {"clevr_math", "chartqa", "ai2d", "geomverse", "vqav2", "tqa", "scienceqa", "iconqa"}


def test_there_are_the_recipes_the_readme_promises():
    names = {p.stem for p in RECIPES}
    assert {"demo", "clevr_math", "chartqa", "pool", "local_files"} <= names


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.stem)
def test_recipe_parses_and_matches_real_schema(path, monkeypatch):
    recipe = load_recipe(path)
    assert recipe.sources, "a recipe needs at least one source"
    for index, source in enumerate(recipe.sources):
        family = source.family
        if family:
            recipe.verifier_for(family)  # every family has a verifier
        if not source.dataset_name:  # local files shipped in recipes/: they exist and have the named columns
            from rsgen.prepare.sources import check_source

            monkeypatch.chdir(ROOT)  # local recipes name their files from the repository root
            check_source(source, index)
            continue
        if source.dataset_name == "rsgen-demo":
            for family in ("CLEVRMath", "DemoChart", "DemoMC"):
                recipe.verifier_for(family)
            continue
        assert source.dataset_name in HUB_SCHEMAS, f"add {source.dataset_name}'s schema from its card to this test"
        columns, turn_keys = HUB_SCHEMAS[source.dataset_name]
        if source.format == "cauldron":
            assert source.dataset_config in CAULDRON_CONFIGS
            assert (source.conversation_column or "texts") in columns
            assert {"user", "assistant"} <= turn_keys
            image = "images" if source.image_column == "image" else source.image_column
            assert image in columns
        else:
            for col in (source.image_column, source.question_column, source.answer_column,
                        source.options_column, source.source_id_column, source.family_column):
                if col is not None:
                    assert col in columns, f"{path.name}: column {col!r} is not in {source.dataset_name}"
