"""The loop's rules without a model: the recipe checks, the pins of iterate.json, the stop rule, the SFTConfig."""

from __future__ import annotations

import pytest

from rsgen.config import RecipeError, recipe_from_dict
from rsgen.iterate.loop import check_iterate_pins, check_iterate_recipe, round_recipe, stop_reason
from rsgen.iterate.train import DPO, SFT, train_arguments, train_config


def recipe(tmp_path, **overrides):
    return recipe_from_dict({"output_dir": str(tmp_path / "it"), **overrides})


def measured(k: int, verifier_rate: float | None) -> dict:
    return {"round": k, "held_out": {"verifier_rate": verifier_rate, "accept_rate": verifier_rate}}


def test_stop_when_the_held_out_verifier_rate_falls_and_only_then():
    assert stop_reason([measured(0, 0.30)], True) is None
    assert stop_reason([measured(0, 0.30), measured(1, 0.30)], True) is None
    assert stop_reason([measured(0, 0.30), measured(1, 0.35)], True) is None
    reason = stop_reason([measured(0, 0.30), measured(1, 0.35), measured(2, 0.31)], True)
    assert reason.startswith("round 2's held-out verifier accept rate 31.0% fell below round 1's 35.0%")
    assert stop_reason([measured(0, 0.30), measured(1, 0.20)], False) is None


def test_round_k_answers_with_model_k_into_its_own_folder_and_never_pushes(tmp_path):
    r = recipe(tmp_path, push_to_hub=True, hub_dataset_id="me/data", model_revision="abc")
    zero, two = round_recipe(r, 0), round_recipe(r, 2)
    assert (zero.model_name_or_path, zero.model_revision, zero.push_to_hub) == ("rsgen-demo", "abc", False)
    assert zero.output_dir == str(tmp_path / "it" / "rounds" / "0")
    assert two.model_name_or_path == str(tmp_path / "it" / "models" / "2") and two.model_revision is None


def test_the_judge_of_every_round_is_the_round_0_model_or_the_recipes_judge(tmp_path):
    from rsgen.engine import judge_model_name

    r = recipe(tmp_path)
    assert [judge_model_name(round_recipe(r, k)) for k in range(3)] == ["rsgen-demo"] * 3
    r = recipe(tmp_path, judge_model_name_or_path="org/judge")
    assert [judge_model_name(round_recipe(r, k)) for k in range(3)] == ["org/judge"] * 3


def test_iterate_needs_greedy_answers_and_the_sft_view(tmp_path):
    with pytest.raises(RecipeError, match="temperature: 0 and num_samples: 1"):
        check_iterate_recipe(recipe(tmp_path, temperature=0.7, num_samples=2))
    with pytest.raises(RecipeError, match="add sft to views"):
        check_iterate_recipe(recipe(tmp_path, views=["dpo"]))
    check_iterate_recipe(recipe(tmp_path, views=["sft", "dpo"]))


def test_iterate_train_is_checked_against_sftconfig_before_any_work(tmp_path):
    with pytest.raises(RecipeError, match=r"'learning_rat' is not an argument of trl.SFTConfig. Did you mean "
                                          r"'learning_rate'"):
        check_iterate_recipe(recipe(tmp_path, iterate_train={"learning_rat": 1e-4}))
    with pytest.raises(RecipeError, match="output_dir is set by rsgen"):
        train_config(recipe(tmp_path, iterate_train={"output_dir": "x"}), SFT, tmp_path)
    with pytest.raises(RecipeError, match="trl.SFTConfig refused it"):
        train_config(recipe(tmp_path, iterate_train={"lr_scheduler_type": "sideways"}), SFT, tmp_path)


def test_rsgen_defaults_yield_to_iterate_train(tmp_path):
    args = train_arguments(recipe(tmp_path, seed=7, iterate_train={"save_total_limit": 5}), SFT, tmp_path / "t")
    assert args["save_total_limit"] == 5 and args["seed"] == 7 and args["max_length"] is None
    assert args["output_dir"] == str(tmp_path / "t")
    config = train_config(recipe(tmp_path, iterate_train={"learning_rate": 3e-4}), SFT, tmp_path / "t")
    assert config.learning_rate == 3e-4


@pytest.mark.parametrize(("key", "value"), [("iterate_from", "sideways"), ("iterate_rounds", -1)])
def test_bad_iterate_keys_are_recipe_errors(tmp_path, key, value):
    with pytest.raises(RecipeError, match=key):
        recipe(tmp_path, **{key: value})


def test_a_changed_eval_fraction_or_training_setup_is_refused_once_used(tmp_path):
    r = recipe(tmp_path, iterate_train={"learning_rate": 1e-4})
    before_training = {"held_out": {"fraction": 0.2}, "rounds": [{"round": 0, "pipeline_finished_at": "t"}]}
    check_iterate_pins(r, before_training)  # no training yet: iterate_train may still change
    with pytest.raises(RecipeError, match=r"iterate_eval_fraction: 0.1 -> 0.2 \(the held-out slice"):
        check_iterate_pins(r, {"held_out": {"fraction": 0.1}})
    trained = {"held_out": {"fraction": 0.2}, "rounds": [
        {"round": 0, "training": {"started_at": "t", "pins": {"iterate_train": {"learning_rate": 2e-4},
                                                               "iterate_from": "previous"}}}]}
    with pytest.raises(RecipeError, match=r"iterate_train: \{'learning_rate': 0.0002\} -> \{'learning_rate': "
                                          r"0.0001\} \(round 0's training was started with the old value\)"):
        check_iterate_pins(r, trained)
    with pytest.raises(RecipeError, match="iterate_from: 'previous' -> 'base'"):
        check_iterate_pins(recipe(tmp_path, iterate_train={"learning_rate": 2e-4}, iterate_from="base"), trained)
    check_iterate_pins(recipe(tmp_path, iterate_train={"learning_rate": 2e-4}), trained)
    # A record written before iterate_dpo existed holds no value for it: its default, null.
    with pytest.raises(RecipeError, match=r"iterate_dpo: None -> \{'beta': 0.1\}"):
        check_iterate_pins(recipe(tmp_path, iterate_train={"learning_rate": 2e-4}, iterate_dpo={"beta": 0.1},
                                  explore_samples=2), trained)


def test_the_iterate_pins_are_the_keys_the_loop_refuses_to_change():
    from rsgen.config import pinned_keys
    from rsgen.iterate.loop import TRAIN_PINS

    assert set(pinned_keys("iterate")) == {*TRAIN_PINS, "iterate_eval_fraction"}


def test_training_resumes_from_the_newest_complete_checkpoint(tmp_path):
    from rsgen.iterate.train import last_checkpoint

    assert last_checkpoint(tmp_path / "none") is None
    for step, state in ((2, '{"global_step": 2}'), (3, '{"global_st'), (4, None), (10, '{"global_step": 10}')):
        folder = tmp_path / f"checkpoint-{step}"
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
        if state is not None:
            (folder / "trainer_state.json").write_text(state)
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")  # by step number, not by name
    (tmp_path / "checkpoint-10" / "trainer_state.json").unlink()  # killed inside the save of step 10
    assert last_checkpoint(tmp_path) == str(tmp_path / "checkpoint-2")  # 4 has no state, 3's is cut short


def test_iterate_dpo_needs_the_explore_pass_and_is_checked_against_dpoconfig(tmp_path):
    with pytest.raises(RecipeError, match="needs an explore pass: set explore_samples"):
        check_iterate_recipe(recipe(tmp_path, iterate_dpo={"beta": 0.1}))
    with pytest.raises(RecipeError, match="add dpo_onpolicy to views"):
        check_iterate_recipe(recipe(tmp_path, iterate_dpo={}, explore_samples=2, views=["sft"]))
    with pytest.raises(RecipeError, match=r"'bta' is not an argument of trl.DPOConfig. Did you mean 'beta'"):
        check_iterate_recipe(recipe(tmp_path, iterate_dpo={"bta": 0.1}, explore_samples=2))
    check_iterate_recipe(recipe(tmp_path, iterate_dpo={"beta": 0.2}, explore_samples=2, views=["sft", "dpo_onpolicy"]))
    config = train_config(recipe(tmp_path, iterate_dpo={"beta": 0.2}, explore_samples=2), DPO, tmp_path / "d")
    assert config.beta == 0.2 and config.max_length is None and config.output_dir == str(tmp_path / "d")
