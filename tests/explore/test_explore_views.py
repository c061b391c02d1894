"""The explore views as emitted from a real demo run: every on-policy pair's chosen response matches the official
answer and its rejected one does not (all rows checked), every GRPO row is in the learnable zone, stats and card
report what was found, and TRL trains on both views as written (DPOTrainer 2 steps, GRPOTrainer 1 step with
`rsgen.verifiers.rewards.relaxed` and the demo model)."""

from __future__ import annotations

import importlib
import json
import math

import datasets
import pytest
import torch

from rsgen.layout import OutputLayout
from rsgen.schema import load_prepared
from rsgen.verifiers import verify_response


def load_view(out, config):
    return datasets.load_dataset(str(OutputLayout(out).dataset), config, split="train",
                                 download_mode="force_redownload")


def options_by_question(out) -> dict[str, list[str]]:
    return {qa["question"]: qa["options"] for row in load_prepared(out) for qa in row["qa"]}


def text(turns) -> str:
    return turns[0]["content"][0]["text"]


@pytest.mark.slow
def test_every_onpolicy_pair_is_verified_right_against_verified_wrong(explored_run):
    out, recipe = explored_run
    stats = json.loads(OutputLayout(out).stats_json.read_text())
    options = options_by_question(out)
    checked = 0
    for family, fam in stats["families"].items():
        rows = load_view(out, f"{family}_dpo_onpolicy").to_list() if fam["splits"].get("dpo_onpolicy", {}).get("rows") else []
        assert len(rows) == fam["explore"]["pairs"]
        verifier = recipe.verifier_for(family)
        for row in rows:
            question = row["prompt"][0]["content"][1]["text"]
            opts = options[question] or None
            assert verify_response(verifier, text(row["chosen"]), row["answer"], options=opts).match, row
            wrong = verify_response(verifier, text(row["rejected"]), row["answer"], options=opts)
            assert not wrong.match and wrong.extracted is not None, row
            assert 0 < row["pass_rate"] < 1 and len(row["images"]) == 1
            assert "</think>" in text(row["chosen"])  # the model's own response, reasoning included
            checked += 1
    assert checked >= 5, "too few pairs to say anything"


@pytest.mark.slow
def test_grpo_rows_are_the_learnable_questions(explored_run):
    out, _ = explored_run
    stats = json.loads(OutputLayout(out).stats_json.read_text())
    total = 0
    for family, fam in stats["families"].items():
        explore = fam["explore"]
        hist = dict(zip(explore["pass_rate_histogram"]["bins"], explore["pass_rate_histogram"]["counts"]))
        assert sum(hist.values()) == explore["questions"] == fam["prepared_qa"]
        assert explore["learnable"] == explore["questions"] - hist["0"] - hist["1"]
        if not explore["learnable"]:
            continue
        rows = load_view(out, f"{family}_grpo").to_list()
        assert len(rows) == explore["learnable"] == fam["splits"]["grpo"]["rows"]
        for row in rows:
            assert 0 < row["pass_rate"] < 1
            assert [p["type"] for p in row["prompt"][0]["content"]] == ["image", "text"] and len(row["images"]) == 1
        total += len(rows)
    assert total >= 5
    card = (OutputLayout(out).dataset / "README.md").read_text()
    assert "Pair hunting" in card and "assets/pass_rates.png" in card
    assert (OutputLayout(out).dataset / "assets" / "pass_rates.png").is_file()


@pytest.mark.slow
def test_grpo_pass_rate_band_keeps_exactly_the_questions_inside(explored_run, tmp_path):
    """Emit again with `grpo_pass_rate_band: [0.3, 0.7]`: the `_grpo` rows are exactly the default band's rows
    with 0.3 < pass rate < 0.7 (the default band, 0 < p < 1, holds every question not always right or wrong), and
    stats count the questions below and above."""
    import dataclasses
    import shutil

    from rsgen.pipeline import run_stage

    out, recipe = explored_run
    banded = tmp_path / "banded"
    shutil.copytree(out, banded)
    shutil.rmtree(OutputLayout(banded).dataset)
    low, high = 0.3, 0.7
    run_stage("emit", dataclasses.replace(recipe, output_dir=str(banded), grpo_pass_rate_band=[low, high]))
    stats = json.loads(OutputLayout(banded).stats_json.read_text())
    default = json.loads(OutputLayout(out).stats_json.read_text())

    def rows_of(where, family):
        return sorted((row["prompt"][0]["content"][1]["text"], row["pass_rate"])
                      for row in load_view(where, f"{family}_grpo").to_list())

    changed = 0
    for family, fam in stats["families"].items():
        before = default["families"][family]["explore"]["grpo_band"]
        assert default["families"][family]["splits"]["grpo"]["skipped"] == {"above_band": before["above"],
                                                                           "below_band": before["below"]}
        learnable = rows_of(out, family) if before["inside"] else []
        inside = [(q, p) for q, p in learnable if low < p < high]
        assert (rows_of(banded, family) if inside else []) == inside
        assert fam["explore"]["grpo_band"] == {
            "below": before["below"] + sum(p <= low for _, p in learnable), "inside": len(inside),
            "above": before["above"] + sum(p >= high for _, p in learnable)}
        changed += len(learnable) - len(inside)
    assert changed, "the band [0.3, 0.7] changed no family's _grpo rows: pick a band this pool separates"
    card = (OutputLayout(banded).dataset / "README.md").read_text()
    assert "0.3 < pass rate < 0.7" in card and "Questions per family below, inside and above" in card


def _snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
@pytest.mark.floors  # .ci/run runs it on the declared floors too
def test_dpo_trainer_two_steps_on_dpo_onpolicy(explored_run, tmp_path):
    from trl import DPOConfig, DPOTrainer

    from rsgen.engine import demo_model_path
    from rsgen.engine.models import load_model_and_processor

    out, _ = explored_run
    dataset = load_view(out, "CLEVRMath_dpo_onpolicy")
    model, processor = load_model_and_processor(demo_model_path(), device="cpu")
    model.train()
    args = DPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, use_cpu=True, bf16=False,
                     max_length=None, report_to="none", save_strategy="no", logging_steps=1, seed=0)
    trainer = DPOTrainer(model=model, args=args, train_dataset=dataset, processing_class=processor)
    before = _snapshot(model)
    result = trainer.train()
    assert trainer.state.global_step == 2 and math.isfinite(result.training_loss)
    assert any(not torch.equal(before[n], p) for n, p in _snapshot(model).items())


@pytest.mark.slow
@pytest.mark.floors  # .ci/run runs it on the declared floors too
def test_grpo_trainer_one_step_with_the_dotted_path_reward(explored_run, tmp_path):
    """TRL resolves the reward by its dotted path, as `--reward_funcs` does; it reads the view's `solution`."""
    from trl import GRPOConfig, GRPOTrainer

    from rsgen.engine import demo_model_path
    from rsgen.engine.models import load_model_and_processor
    out, _ = explored_run
    dataset = load_view(out, "CLEVRMath_grpo")
    model, processor = load_model_and_processor(demo_model_path(), device="cpu")
    module, _, name = "rsgen.verifiers.rewards.relaxed".rpartition(".")  # as trl/scripts/grpo.py resolves it
    reward = getattr(importlib.import_module(module), name)
    seen = []

    def watched(completions, **kwargs):  # what TRL passes, then our reward as it is
        scores = reward(completions, **kwargs)
        seen.append((completions, kwargs["solution"], scores))
        return scores

    watched.__name__ = "relaxed"
    args = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, per_device_train_batch_size=4,
                      num_generations=4, max_completion_length=64, max_steps=1, learning_rate=1e-4, report_to=[],
                      logging_steps=1, save_strategy="no", seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=[watched], args=args, train_dataset=dataset,
                          processing_class=processor)
    trainer.train()
    assert trainer.state.global_step == 1
    completions, solutions, scores = seen[0]
    assert len(completions) == 4 and set(solutions) <= set(dataset["solution"])
    assert all(s in (0.0, 1.0) for s in scores)
    assert trainer.state.log_history[0]["rewards/relaxed/mean"] == pytest.approx(sum(scores) / 4)
