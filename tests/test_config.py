"""Recipe parsing: YAML + overrides into dataclasses, unknown keys and bad values named in the error."""

import dataclasses

import pytest

from rsgen.config import (
    KEY_GROUPS,
    RecipeConfig,
    RecipeError,
    SourceConfig,
    load_recipe,
    parse_overrides,
    recipe_from_dict,
)

SOURCE = {"dataset_name": "HuggingFaceM4/ChartQA", "question_column": "query", "answer_column": "label", "family": "ChartQA"}


def write(tmp_path, text):
    p = tmp_path / "r.yaml"
    p.write_text(text)
    return p


def test_yaml_and_overrides(tmp_path):
    p = write(tmp_path, "output_dir: runs/a\nmodel_name_or_path: org/vlm\nmax_new_tokens: 64\n"
                        "sources:\n  - dataset_name: x\n    family: X\n")
    r = load_recipe(p, ["--max_new_tokens", "128", "--judge=false", "--verifier", "{X: exact}"])
    assert r.output_dir == "runs/a"
    assert r.max_new_tokens == 128
    assert r.judge is False
    assert r.verifier_for("X") == "exact"
    assert r.sources[0].dataset_name == "x"


@pytest.mark.parametrize(
    "raw, needle",
    [
        ({"max_new_token": 5}, "'max_new_token'"),  # typo: named, with a suggestion
        ({"sources": [{**SOURCE, "question_colum": "q"}]}, "question_colum"),
        ({"sources": [{"family": "X"}]}, "dataset_name"),
        ({"sources": [{"dataset_name": "x"}]}, "family"),
        ({"sources": [{**SOURCE, "format": "sharegpt"}]}, "sharegpt"),
        ({"max_new_tokens": "many"}, "max_new_tokens"),
        ({"judge": "yes"}, "judge"),
        ({"verifier": "fuzzy"}, "fuzzy"),
        ({"num_samples": 4}, "temperature"),
        ({"push_to_hub": True}, "hub_dataset_id"),
    ],
)
def test_bad_recipes_name_the_problem(raw, needle):
    with pytest.raises(RecipeError, match=needle.replace("(", r"\(")):
        recipe_from_dict(raw)


def test_unknown_key_suggests_close_match():
    with pytest.raises(RecipeError, match="Did you mean 'max_new_tokens'"):
        recipe_from_dict({"max_new_token": 5})


def test_verifier_mapping_without_family_is_an_error():
    r = recipe_from_dict({"verifier": {"ChartQA": "relaxed"}})
    assert r.verifier_for("ChartQA") == "relaxed"
    with pytest.raises(RecipeError, match="CLEVRMath"):
        r.verifier_for("CLEVRMath")
    assert recipe_from_dict({"verifier": {"default": "exact"}}).verifier_for("Any") == "exact"


def test_override_parsing():
    assert parse_overrides(["--a", "1", "--b=x y", "--c-d", "[1, 2]"]) == {"a": 1, "b": "x y", "c_d": [1, 2]}
    with pytest.raises(RecipeError, match="no value"):
        parse_overrides(["--a"])
    with pytest.raises(RecipeError, match="unexpected argument"):
        parse_overrides(["a"])


def test_missing_recipe_file(tmp_path):
    with pytest.raises(RecipeError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_every_key_has_a_stage_and_a_help():
    for f in dataclasses.fields(RecipeConfig):
        assert f.metadata.get("stage") in KEY_GROUPS, f"{f.name}: metadata stage must be one of {list(KEY_GROUPS)}"
        assert f.metadata.get("help"), f"{f.name}: metadata needs a one-line help"
    for f in dataclasses.fields(SourceConfig):
        assert f.metadata.get("help"), f"sources: {f.name}: metadata needs a one-line help"


@pytest.mark.parametrize(
    "key,value",
    [("numeric_tolerance", -1.0), ("numeric_tolerance", float("nan")), ("math_timeout_seconds", 0), ("math_timeout_seconds", -5)],
)
def test_verifier_settings_are_checked_at_load(key, value):
    # The verifiers would raise on the first verified response, after the model loaded; the recipe fails first.
    with pytest.raises(RecipeError, match=f"{key.removeprefix('math_')} must be a finite number"):
        recipe_from_dict({key: value})


def test_real_sources_without_a_model_are_an_error_naming_the_choices():
    with pytest.raises(RecipeError) as err:
        recipe_from_dict({"sources": [SOURCE]})
    message = str(err.value)
    assert "model_name_or_path is not set" in message and "Qwen/Qwen2.5-VL-7B-Instruct" in message
    assert "`rsgen-demo`" in message  # how to choose the demo model on purpose
    assert recipe_from_dict({"sources": [SOURCE], "model_name_or_path": "rsgen-demo"}).model_name_or_path == "rsgen-demo"


def test_the_demo_pool_defaults_to_the_demo_model():
    demo = {"dataset_name": "rsgen-demo", "family_column": "family"}
    assert recipe_from_dict({"sources": [demo]}).model_name_or_path == "rsgen-demo"
    with pytest.raises(RecipeError, match="model_name_or_path is not set"):
        recipe_from_dict({"sources": [demo, SOURCE]})


@pytest.mark.parametrize("overrides, message", [
    ({"explore_samples": -1}, "explore_samples must be >= 0"),
    ({"explore_samples": 4, "num_samples": 2, "temperature": 1.0}, "set num_samples: 1"),
    ({"explore_samples": 4, "explore_temperature": 0.0}, "explore_temperature must be > 0"),
    ({"explore_top_p": 0.0}, r"explore_top_p must be in \(0, 1\]"),
    ({"explore_stop": "first"}, "explore_stop must be paired or never, got 'first'"),
])
def test_explore_keys_are_checked(overrides, message):
    with pytest.raises(RecipeError, match=message):
        recipe_from_dict(overrides)
