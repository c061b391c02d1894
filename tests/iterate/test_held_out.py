"""The held-out slice: chosen by image, per family, stable, and never in a round's training rows."""

from __future__ import annotations

import hashlib

import pytest
from datasets import Image, List
from emit_helpers import ScriptedImage, ScriptedPair, scripted_recipe, write_scripted_run

from rsgen.emit import run_emit
from rsgen.iterate.held_out import choose_held_out, read_held_out, write_held_out
from rsgen.iterate.train import training_rows
from rsgen.layout import OutputLayout
from rsgen.schema import open_prepared


def sha(image: ScriptedImage) -> str:
    return hashlib.sha256(image.image_bytes()).hexdigest()


def pool(n_clevr: int, n_mc: int, outcome: str = "match") -> list[ScriptedImage]:
    images = []
    for i in range(n_clevr):
        pairs = [ScriptedPair(f"c-{i}-{j}", f"How many things {i}-{j}?\nAnswer.", str(j), outcome) for j in range(2)]
        images.append(ScriptedImage("CLEVRMath", pairs, (i * 7 % 256, 40, 90)))
    for i in range(n_mc):
        images.append(ScriptedImage("DemoMC", [ScriptedPair(f"m-{i}", f"Which {i}?\nAnswer.", "B", outcome)],
                                    (200, i * 11 % 256, 30)))
    return images


def test_each_family_holds_out_its_fraction_of_images_and_the_choice_is_stable(tmp_path):
    write_scripted_run(tmp_path / "a", pool(20, 10), judge=False)
    held = choose_held_out(open_prepared(tmp_path / "a"), 0.2)
    by_family = {f: {sha(i) for i in pool(20, 10) if i.family == f} for f in ("CLEVRMath", "DemoMC")}
    assert len(held & by_family["CLEVRMath"]) == 4 and len(held & by_family["DemoMC"]) == 2
    # The same images in another order (another pool draw, more images) keep their side.
    write_scripted_run(tmp_path / "b", pool(25, 10)[::-1], judge=False)
    held_b = choose_held_out(open_prepared(tmp_path / "b"), 0.2)
    assert held & by_family["DemoMC"] == held_b & by_family["DemoMC"]
    path = tmp_path / "held.txt"
    write_held_out(path, held)
    assert read_held_out(path) == held


def test_a_family_of_one_image_is_all_training_and_no_family_is_all_held_out(tmp_path):
    write_scripted_run(tmp_path, pool(3, 1), judge=False)
    held = choose_held_out(open_prepared(tmp_path), 0.9)
    assert sha(pool(3, 1)[-1]) not in held and len(held) == 2


def test_the_rows_handed_to_the_trainer_hold_no_held_out_image_and_every_other_accepted_pair(tmp_path, monkeypatch):
    """Measured on what the loop's training step hands to the trainer: the trainer is replaced by a recorder (this
    test is about the rows, not the training, which the slow tier runs with the demo model)."""
    import dataclasses

    from rsgen.iterate import loop
    from rsgen.iterate.train import SFT, image_sha256s
    from rsgen.store import distributed_state

    images = pool(10, 5)
    round_dir = OutputLayout(tmp_path).round_dir(0)
    write_scripted_run(round_dir, images, judge=False)
    run_emit(scripted_recipe(round_dir, judge=False, views=["sft"]))
    held = choose_held_out(open_prepared(round_dir), 0.3)
    handed = []

    def recording_trainer(recipe, kind, start_model, rows, output_dir, model_out, state):
        handed.append(rows)
        return {"rows": len(rows)}

    monkeypatch.setattr(loop, "train_round", recording_trainer)
    recipe = dataclasses.replace(scripted_recipe(round_dir, judge=False, views=["sft"]), output_dir=str(tmp_path))
    state = distributed_state()
    assert loop._train_step(recipe, loop.IterateRecord(recipe, state), 0, SFT, "model-0", tmp_path / "m1", held, state)
    [rows] = handed
    trained = [image_sha256s(row) for row in rows.cast_column("images", List(Image(decode=False)))]
    assert trained and not {sha for shas in trained for sha in shas} & held
    assert len(rows) == sum(len(img.pairs) for img in images if sha(img) not in held)


def _write_sft_config(dataset_dir, rows_images: list[list[bytes]]) -> None:
    import datasets

    rows = {"prompt": [[{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"q{i}"}]}]
                       for i in range(len(rows_images))],
            "completion": [[{"role": "assistant", "content": [{"type": "text", "text": "a"}]}]] * len(rows_images),
            "images": [[{"bytes": b, "path": None} for b in images] for images in rows_images]}
    folder = dataset_dir / "data" / "Multi_sft"
    folder.mkdir(parents=True)
    datasets.Dataset.from_dict(rows).cast_column("images", List(Image())).to_parquet(
        str(folder / "train-00000-of-00001.parquet"))


def test_a_row_is_held_out_when_any_of_its_images_is(tmp_path):
    first, second, third = (ScriptedImage("CLEVRMath", [], (i * 60, 10, 10)).image_bytes() for i in range(3))
    _write_sft_config(tmp_path, [[first, second], [second, first], [first], [first, third]])
    held = {hashlib.sha256(second).hexdigest()}
    rows = training_rows(tmp_path, held)
    kept = [[hashlib.sha256(image["bytes"]).hexdigest() for image in row["images"]]
            for row in rows.cast_column("images", List(Image(decode=False)))]
    assert kept == [[hashlib.sha256(first).hexdigest()],
                    [hashlib.sha256(first).hexdigest(), hashlib.sha256(third).hexdigest()]]


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5])
def test_eval_fraction_outside_0_1_is_a_recipe_error(fraction):
    from rsgen.config import RecipeError, recipe_from_dict

    with pytest.raises(RecipeError, match="iterate_eval_fraction"):
        recipe_from_dict({"iterate_eval_fraction": fraction})


def _write_onpolicy_config(dataset_dir, rows: list[tuple[bytes, str, str]]) -> None:
    """`Multi_dpo_onpolicy` rows (image, question, chosen response) as emit writes them."""
    import datasets

    def message(role, text):
        return [{"role": role, "content": [{"type": "text", "text": text}]}]

    data = {"prompt": [[{"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": q}]}]
                       for _image, q, _chosen in rows],
            "chosen": [message("assistant", chosen) for _image, _q, chosen in rows],
            "rejected": [message("assistant", "wrong") for _row in rows],
            "images": [[{"bytes": image, "path": None}] for image, _q, _chosen in rows],
            "answer": ["1"] * len(rows), "pass_rate": [0.5] * len(rows)}
    folder = dataset_dir / "data" / "Multi_dpo_onpolicy"
    folder.mkdir(parents=True)
    datasets.Dataset.from_dict(data).cast_column("images", List(Image())).to_parquet(
        str(folder / "train-00000-of-00001.parquet"))


def test_explored_sft_rows_add_the_right_samples_of_questions_the_greedy_answer_missed(tmp_path):
    """iterate_sft_rows: explored: the accepted greedy rows, plus the on-policy chosen response of each other
    question of the training slice (never a second row for a question the greedy answer already has, never a held-out
    image)."""
    from rsgen.iterate.train import sft_training_rows

    first, held_image = (ScriptedImage("CLEVRMath", [], (i * 60, 10, 10)).image_bytes() for i in range(2))
    _write_sft_config(tmp_path, [[first]])  # question q0, completion "a"
    _write_onpolicy_config(tmp_path, [(first, "q0", "sampled q0"), (first, "q1", "sampled q1"),
                                      (held_image, "q2", "sampled q2")])
    held = {hashlib.sha256(held_image).hexdigest()}
    completions = {row["prompt"][0]["content"][1]["text"]: row["completion"][0]["content"][0]["text"]
                   for row in sft_training_rows(tmp_path, held, "explored")}
    assert completions == {"q0": "a", "q1": "sampled q1"}
    assert len(sft_training_rows(tmp_path, held, "accepted")) == 1


def test_explored_sft_rows_need_an_explore_pass(tmp_path):
    from rsgen.config import RecipeError, recipe_from_dict
    from rsgen.iterate.loop import check_iterate_recipe

    recipe = recipe_from_dict({"iterate_sft_rows": "explored", "output_dir": str(tmp_path), "temperature": 0})
    with pytest.raises(RecipeError, match="explore_samples"):
        check_iterate_recipe(recipe)
