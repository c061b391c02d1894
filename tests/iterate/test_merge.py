"""The final dataset of `rsgen iterate`: each QA pair once, from the first round that got it right (as that round
routed it, its judge gate included), else from the last round; the round in clean_meta.qa_rounds; the card's
rounds section. Scripted rounds (emit's test helper) stand in for the models."""

from __future__ import annotations

import json

import datasets
from emit_helpers import ScriptedImage, ScriptedPair, scripted_recipe, write_scripted_run

from rsgen.emit import run_emit
from rsgen.iterate.loop import summary
from rsgen.iterate.merge import merge_rounds
from rsgen.layout import OutputLayout

Q = "How many cubes are there in picture {}?\nAnswer in short without any other content."
# Per pair: outcome in round 0, outcome in round 1.
SCRIPT = {"p-right-then-wrong": ("match", "wrong"), "p-wrong-then-right": ("wrong", "match"),
          "p-never": ("wrong", "wrong"), "p-promoted-then-wrong": ("promote", "wrong"),
          "p-cut-then-never": ("no_answer", "wrong")}


def images(k: int) -> list[ScriptedImage]:
    # Two images with several pairs each, so one row mixes rounds; the wrong answer names the round.
    ids = list(SCRIPT)
    pairs = [ScriptedPair(i, Q.format(i), "3", SCRIPT[i][k], wrong=str(10 + k)) for i in ids]
    return [ScriptedImage("CLEVRMath", pairs[:3], (10, 20, 30)), ScriptedImage("CLEVRMath", pairs[3:], (90, 20, 30))]


def iterate_stats(rounds: int) -> dict:
    def rates(v):
        return {"qa": 5, "verifier_accepted": 1, "accepted": 1, "verifier_rate": v, "accept_rate": v,
                "families": {"CLEVRMath": {"qa": 5, "verifier_accepted": 1, "accepted": 1, "verifier_rate": v,
                                           "accept_rate": v}}}
    data = {"base_model": "test-org/test-model", "iterate_from": "previous", "stopped": None,
            "held_out": {"fraction": 0.2, "images": 1, "file": "held_out_images.txt"},
            "rounds": [{"round": k, "model": f"m{k}", "held_out": rates(0.2 + 0.1 * k), "train": rates(0.4),
                        "training": ({"rows": 4, "losses": [[1, 0.9], [2, 0.5]], "pins": {}} if k < rounds - 1
                                     else {})} for k in range(rounds)]}
    return summary(data)


def test_each_pair_comes_once_from_the_first_round_that_got_it_right(tmp_path):
    # Round 0's judge passes the leniency gate, round 1's does not: round 0's promotion must stand regardless.
    write_scripted_run(tmp_path / "rounds" / "0", images(0), known_wrong_rejected=4)
    write_scripted_run(tmp_path / "rounds" / "1", images(1), known_wrong_rejected=0, known_wrong_accepted=4)
    write_scripted_run(tmp_path, images(0), judge=False)  # the pool, prepared once at the top
    rounds = [scripted_recipe(tmp_path / "rounds" / str(k), views=["sft"]) for k in range(2)]
    merged, contributed = merge_rounds(rounds)
    got = {qa_id: (o.accepted, o.via, o.round) for qa_id, o in merged.chosen.items()}
    assert got == {"p-right-then-wrong": (True, "verifier", 0), "p-wrong-then-right": (True, "verifier", 1),
                   "p-never": (False, "rejected", 1), "p-promoted-then-wrong": (True, "judge", 0),
                   "p-cut-then-never": (False, "rejected", 1)}
    assert contributed == {0: 2, 1: 1}

    run_emit(scripted_recipe(tmp_path, views=["sft"]), work=merged, extra_stats={"iterate": iterate_stats(2)})
    dataset = OutputLayout(tmp_path).dataset
    think = datasets.load_dataset(str(dataset), "CLEVRMath_RS_think", split="train")
    rejected = datasets.load_dataset(str(dataset), "CLEVRMath_rejected", split="train")
    accepted = {qa["question"]: r for row in think for qa, r in zip(row["qa"], row["clean_meta"]["qa_rounds"])}
    assert accepted == {Q.format("p-right-then-wrong"): 0, Q.format("p-wrong-then-right"): 1,
                        Q.format("p-promoted-then-wrong"): 0}
    wrong = {qa["question"]: (qa["wrong_vlm"], r) for row in rejected
             for qa, r in zip(row["qa"], row["clean_meta"]["qa_rounds"])}
    assert wrong == {Q.format("p-never"): ("11", 1), Q.format("p-cut-then-never"): ("11", 1)}  # the last round's
    assert len(accepted) + len(wrong) == len(SCRIPT)
    sft = datasets.load_dataset(str(dataset), "CLEVRMath_sft", split="train")
    assert len(sft) == 3

    card = (dataset / "README.md").read_text()
    assert "## Self-improvement rounds (`rsgen iterate`)" in card
    assert "| 0 | `m0` | 20.0% | 20.0% | 40.0% | 0 | 4 pairs | 0.900 → 0.500 |" in card
    assert "| CLEVRMath | 20.0% | 30.0% |" in card
    assert (dataset / "assets" / "iterate.png").stat().st_size > 1000


def test_a_run_without_iterate_has_no_rounds_section_or_field(tmp_path):
    write_scripted_run(tmp_path, images(0))
    run_emit(scripted_recipe(tmp_path, views=["sft"]))
    dataset = OutputLayout(tmp_path).dataset
    assert "Self-improvement rounds" not in (dataset / "README.md").read_text()
    think = datasets.load_dataset(str(dataset), "CLEVRMath_RS_think", split="train")
    assert "qa_rounds" not in think.features["clean_meta"]


def _write_blind(round_dir, solvable: dict[str, bool]) -> None:
    from rsgen.store import CheckpointStore

    with CheckpointStore(OutputLayout(round_dir).blind_work).writer(0, 64, 1e9) as writer:
        for qa_id, is_solvable in solvable.items():
            writer.add({"key": qa_id, "id": qa_id, "family": "CLEVRMath", "question": Q.format(qa_id),
                        "response": "3" if is_solvable else "7", "extracted": "3" if is_solvable else "7",
                        "solvable": is_solvable, "verifier": "relaxed", "options": 0, "generated_tokens": 3,
                        "model": "test-model", "settings": "scripted"})


def test_the_final_card_has_each_accepted_pairs_blind_check_from_its_round_the_judge_and_the_truth(tmp_path):
    write_scripted_run(tmp_path / "rounds" / "0", images(0), known_wrong_rejected=4)
    write_scripted_run(tmp_path / "rounds" / "1", images(1), known_wrong_rejected=4)
    write_scripted_run(tmp_path, images(0), judge=False)
    # Round 0 accepts p-right-then-wrong and p-promoted-then-wrong, round 1 p-wrong-then-right (test above).
    _write_blind(tmp_path / "rounds" / "0", {"p-right-then-wrong": True, "p-promoted-then-wrong": False})
    _write_blind(tmp_path / "rounds" / "1", {"p-wrong-then-right": False, "p-right-then-wrong": False})
    rounds = [scripted_recipe(tmp_path / "rounds" / str(k), views=["sft"], blind_check="flag") for k in range(2)]
    merged, _ = merge_rounds(rounds)
    assert {qa_id: rec.solvable for qa_id, rec in merged.blind.items()} == {
        "p-right-then-wrong": True, "p-promoted-then-wrong": False, "p-wrong-then-right": False}
    stats = iterate_stats(2)
    stats["judge_model"] = "test-org/test-model"
    for k, r in enumerate(stats["rounds"]):
        r["held_out"].update({"truth_right": 1 + k, "truth_rate": 0.2 * (1 + k)})
        r["truth"] = {"accepted": 4 + k, "accepted_wrong": k, "verifier_missed": 0, "recovered": 0}
    run_emit(scripted_recipe(tmp_path, views=["sft"], blind_check="flag"), work=merged,
             extra_stats={"iterate": stats})
    card = (OutputLayout(tmp_path).dataset / "README.md").read_text()
    assert "## Blind check: accepted pairs answered without the image" in card
    blind = json.loads(OutputLayout(tmp_path).stats_json.read_text())["families"]["CLEVRMath"]["blind"]
    assert (blind["checked"], blind["solvable"]) == (3, 1)
    assert "The judge of every round was `test-org/test-model` (the round-0 model)" in card
    # held-out right by the scene, its change against the round before (± se), the round's truth check
    assert "| 0 | `m0` | 20.0% | 20.0% | 20.0% | – | 0 of 4 | 40.0% |" in card
    assert "| 1 | `m1` | 30.0% | 30.0% | 40.0% | +20.0 ± 28.3 | 1 of 5 | 40.0% |" in card
