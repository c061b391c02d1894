"""run.json pins per stage: a rerun may change a key whose stage has no work on disk (recorded in run.json) and is
refused, naming the field and the stage, when the key's stage has work. Real stages on the demo pool."""

from __future__ import annotations

import json

import pytest
import yaml

from rsgen.cli import main
from rsgen.config import RecipeError, recipe_from_dict
from rsgen.layout import OutputLayout
from rsgen.pipeline import changed_fields, check_and_write_run_json, run_stage, stage_pins
from rsgen.store import distributed_state

VERIFIERS = {"CLEVRMath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"}


def recipe_raw(output_dir, **overrides) -> dict:
    raw = {
        "model_name_or_path": "rsgen-demo",
        "output_dir": str(output_dir),
        "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 4, "demo_seed": 5, "family_column": "family",
                     "options_column": "options", "source_id_column": "source_id"}],
        "verifier": VERIFIERS,
        "max_new_tokens": 2048,
        "judge": False,
        "prepare_num_proc": 1,
    }
    raw.update(overrides)
    return raw


def recipe(output_dir, **overrides):
    return recipe_from_dict(recipe_raw(output_dir, **overrides))


def run_json(output_dir) -> dict:
    return json.loads(OutputLayout(output_dir).run_json.read_text())


def test_every_pinned_key_is_a_recipe_key_of_one_stage():
    from dataclasses import fields

    from rsgen.config import RecipeConfig

    keys = [k for ks in stage_pins().values() for k in ks]
    assert len(keys) == len(set(keys))
    assert set(keys) <= {f.name for f in fields(RecipeConfig)}


def test_changed_fields_look_inside_sources():
    old = [{"data_files": ["a.csv"], "answer_column": "answer"}, {"family": "B"}]
    new = [{"data_files": ["a.csv"], "answer_column": "label"}, {"family": "B"}, {"family": "C"}]
    assert changed_fields("sources", old, new) == [
        ("sources (number of entries)", 2, 3), ("sources[0].answer_column", "answer", "label")]
    assert changed_fields("max_new_tokens", 2048, 128) == [("max_new_tokens", 2048, 128)]
    assert changed_fields("verifier", {"A": "mc"}, {"A": "mc"}) == []


def test_after_prepare_model_decoding_and_verifier_may_change(tmp_path):
    out = tmp_path / "out"
    state = distributed_state()
    run_stage("prepare", recipe(out, verifier={"clevrmath": "relaxed", "DemoChart": "relaxed", "DemoMC": "mc"}))
    # The generate stage's keys: no generate work yet, so every change is allowed and recorded.
    fixed = recipe(out, model_name_or_path="some/real-model", max_new_tokens=128, verifier=VERIFIERS)
    check_and_write_run_json(fixed, state)
    run = run_json(out)
    assert run["pinned"]["max_new_tokens"] == 128 and run["pinned"]["verifier"] == VERIFIERS
    assert [c["key"] for c in run["recipe_changes"]] == ["model_name_or_path", "max_new_tokens", "verifier"]
    assert run["recipe_changes"][1]["from"] == 2048 and run["recipe_changes"][1]["to"] == 128


def test_after_prepare_a_source_change_is_refused_naming_the_field_and_stage(tmp_path):
    out = tmp_path / "out"
    run_stage("prepare", recipe(out))
    changed = recipe_raw(out)
    changed["sources"][0]["demo_seed"] = 6
    with pytest.raises(RecipeError) as err:
        check_and_write_run_json(recipe_from_dict(changed), distributed_state())
    message = str(err.value)
    assert "sources[0].demo_seed: 5 -> 6 (the prepare work in" in message
    assert "data_files" not in message  # the field that changed, not both whole source lists
    with pytest.raises(RecipeError, match=r"instruction: .* \(the prepare work"):
        check_and_write_run_json(recipe(out, instruction="Answer with a number."), distributed_state())
    assert run_json(out)["recipe_changes"] == []


def test_an_empty_pool_pins_nothing(tmp_path, tools_pool):
    """A prepare that kept nothing left no prepared/: fixing the source is allowed."""
    out = tmp_path / "out"
    source = tools_pool(tmp_path / "pool")
    with pytest.raises(RecipeError, match="none of the 1 QA pairs"):
        run_stage("prepare", recipe(out, sources=[{**source, "answer_column": "label"}]))
    run_stage("prepare", recipe(out, sources=[source]))
    assert run_json(out)["recipe_changes"][0]["key"] == "sources[0].answer_column"


@pytest.fixture
def tools_pool():
    def write(folder):
        import io

        from PIL import Image

        folder.mkdir()
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), "red").save(buffer, format="PNG")
        (folder / "a.png").write_bytes(buffer.getvalue())
        (folder / "pool.jsonl").write_text(json.dumps({"image": "a.png", "question": "q?", "answer": "a",
                                                       "label": ""}) + "\n")
        return {"data_files": [str(folder / "pool.jsonl")], "family": "F"}

    return write


@pytest.mark.slow
def test_run_after_prepare_takes_a_new_model_and_max_new_tokens_then_generate_pins_them(
    tmp_path, zoo_model_path, capsys
):
    model = zoo_model_path("qwen2_vl")
    out = tmp_path / "out"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_raw(out)))
    main(["prepare", "--config", str(path)])
    # The real model and a short token limit after prepare: nothing was generated, so the run proceeds.
    main(["run", "--config", str(path), "--model_name_or_path", model, "--max_new_tokens", "8"])
    assert OutputLayout(out).dataset.is_dir()
    assert {c["key"] for c in run_json(out)["recipe_changes"]} == {"model_name_or_path", "max_new_tokens"}
    capsys.readouterr()
    # Now generate has work: another max_new_tokens is refused, naming the field and the stage.
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--config", str(path), "--model_name_or_path", model, "--max_new_tokens", "16"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "max_new_tokens: 8 -> 16 (the generate work in" in err
    # A judge key, whose stage has no work (judge: false), may still change.
    main(["generate", "--config", str(path), "--model_name_or_path", model, "--max_new_tokens", "8",
          "--judge_max_new_tokens", "4"])
    assert run_json(out)["recipe_changes"][-1]["key"] == "judge_max_new_tokens"


def test_the_verifier_keys_may_change_under_generate_work_but_not_under_explore_work(tmp_path):
    """Issue #28.4: the verify stage decides the stored responses again, so generate work does not pin the verifier
    keys; explore work does (its stop rule used the old decisions)."""
    out = tmp_path / "out"
    state = distributed_state()
    check_and_write_run_json(recipe(out), state)
    layout = OutputLayout(out)
    for stage in ("generate", "verify", "judge"):
        (layout.work / stage).mkdir(parents=True)
        (layout.work / stage / "part.jsonl").write_text('{"key": "q"}\n')
    check_and_write_run_json(recipe(out, numeric_tolerance=0.5, verifier="numeric"), state)
    assert [c["key"] for c in run_json(out)["recipe_changes"]] == ["verifier", "numeric_tolerance"]
    layout.explore_work.mkdir()
    (layout.explore_work / "part.jsonl").write_text('{"key": "q#1"}\n')
    with pytest.raises(RecipeError, match=r"numeric_tolerance: 0\.5 -> 0\.25 \(the explore work in"):
        check_and_write_run_json(recipe(out, numeric_tolerance=0.25, verifier="numeric"), state)
