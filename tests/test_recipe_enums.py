"""Keys that take one of a few words take every documented word from a recipe and from the command line, the
words YAML 1.1 reads as booleans included (`blind_check: off` arrives as False)."""

from __future__ import annotations

import dataclasses

import pytest

from rsgen.config import (
    ENUM_KEYS,
    RecipeConfig,
    RecipeError,
    SourceConfig,
    load_recipe,
    recipe_from_dict,
    source_from_dict,
)

SOURCE = {"dataset_name": "rsgen-demo", "family_column": "family"}
NEEDS = {"engine_server": {"engine": "openai"}}  # engine_server starts a server for engine: openai
CASES = [(key, word) for key, words in ENUM_KEYS.items() for word in words]


def _write(tmp_path, key: str, word: str):
    """A recipe file with `key: word` written as a user would, unquoted."""
    if key == "format":  # a source key
        text = f"sources:\n  - dataset_name: rsgen-demo\n    family_column: family\n    {key}: {word}\n"
    else:
        text = f"{key}: {word}\n" + "".join(f"{k}: {v}\n" for k, v in NEEDS.get(key, {}).items())
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    return path


def _value(recipe: RecipeConfig, key: str):
    return recipe.sources[0].format if key == "format" else getattr(recipe, key)


@pytest.mark.parametrize("key, word", CASES, ids=[f"{k}={w}" for k, w in CASES])
def test_every_documented_word_loads_from_a_recipe(tmp_path, key, word):
    assert _value(load_recipe(_write(tmp_path, key, word)), key) == word


@pytest.mark.parametrize("key, word", CASES, ids=[f"{k}={w}" for k, w in CASES])
def test_every_documented_word_loads_from_the_command_line(key, word):
    if key == "format":
        args = ["--sources", f"[{{dataset_name: rsgen-demo, family_column: family, format: {word}}}]"]
    else:
        args = [f"--{key}", word] + [a for k, v in NEEDS.get(key, {}).items() for a in (f"--{k}", v)]
    assert _value(load_recipe(None, args), key) == word


def test_the_yaml_boolean_words_are_read_as_the_keys_words():
    assert load_recipe(None, ["--blind_check", "off"]).blind_check == "off"
    assert load_recipe(None, ["--blind_check", "no"]).blind_check == "off"
    assert recipe_from_dict({"blind_check": False}).blind_check == "off"


@pytest.mark.parametrize("key", [k for k in ENUM_KEYS if not {"on", "yes", "true"} & set(ENUM_KEYS[k])])
def test_a_switch_where_a_word_belongs_is_refused_naming_the_words(key):
    words = ENUM_KEYS[key]
    raw = {"sources": [{**SOURCE, key: True}]} if key == "format" else {key: True}
    with pytest.raises(RecipeError, match=f"key '{key}' must be .*{words[-1]}, got true"):
        recipe_from_dict(raw)


def test_every_key_that_refuses_a_plain_word_is_an_enum_key():
    """Completeness: a text key that refuses an arbitrary word takes only some words, so it must be in ENUM_KEYS
    (the tests above then cover it); `verifier` takes the registry's names, none a YAML boolean."""
    refused = set()
    for cls, load in ((RecipeConfig, lambda k: recipe_from_dict({k: "zzbogus"})),
                      (SourceConfig, lambda k: source_from_dict({**SOURCE, k: "zzbogus"}))):
        for f in dataclasses.fields(cls):
            if str(f.type) not in ("str", "str | None", "str | dict[str, str]"):
                continue
            try:
                load(f.name)
            except RecipeError:
                refused.add(f.name)
    assert refused == set(ENUM_KEYS) | {"verifier"}
