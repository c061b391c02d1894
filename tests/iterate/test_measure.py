"""A round's accept rates by slice and family, routed as the round's emit routed them (verifier alone, and with the
judge's trusted promotions), and the table `rsgen iterate` prints. Scripted work (emit's test helper) stands in
for the model."""

from __future__ import annotations

import hashlib

from emit_helpers import ScriptedImage, ScriptedPair, scripted_recipe, write_scripted_run

from rsgen.iterate.measure import measure_round
from rsgen.iterate.report import rounds_table

Q = "How many cubes are there in picture {}?\nAnswer in short without any other content."


def pair(name: str, outcome: str) -> ScriptedPair:
    return ScriptedPair(name, Q.format(name), "3", outcome)


def test_rates_split_by_image_into_held_out_and_train_and_count_judge_promotions_apart(tmp_path):
    held = ScriptedImage("CLEVRMath", [pair("h1", "match"), pair("h2", "promote"), pair("h3", "wrong"),
                                       pair("h4", "no_answer")], (10, 20, 30))
    train = ScriptedImage("CLEVRMath", [pair("t1", "match"), pair("t2", "wrong")], (90, 20, 30))
    write_scripted_run(tmp_path, [held, train], known_wrong_rejected=4)
    rates = measure_round(scripted_recipe(tmp_path), {hashlib.sha256(held.image_bytes()).hexdigest()})
    assert {k: rates["held_out"][k] for k in ("qa", "verifier_accepted", "accepted")} == \
        {"qa": 4, "verifier_accepted": 1, "accepted": 2}
    assert (rates["held_out"]["verifier_rate"], rates["held_out"]["accept_rate"]) == (0.25, 0.5)
    assert rates["held_out"]["families"]["CLEVRMath"]["accept_rate"] == 0.5
    assert (rates["train"]["qa"], rates["train"]["verifier_rate"], rates["train"]["accept_rate"]) == (2, 0.5, 0.5)


def test_the_printed_table_shows_every_round_the_dpo_step_and_why_it_stopped():
    def rates(v):
        return {"qa": 8, "verifier_rate": v, "accept_rate": v}
    data = {"held_out": {"images": 2, "fraction": 0.25}, "stopped": "round 1's held-out verifier accept rate fell",
            "rounds": [{"round": 0, "model": "base", "held_out": rates(0.5), "train": rates(0.6),
                        "contributed_accepted": 7, "training": {"rows": 12, "losses": [[1, 0.8], [2, 0.4]]},
                        "dpo": {"rows": 5}},
                       {"round": 1, "model": "out/models/1", "held_out": rates(0.25), "train": rates(0.3),
                        "contributed_accepted": 1}]}
    lines = rounds_table(data).splitlines()
    assert lines[2].split() == ["0", "50.0%", "50.0%", "60.0%", "7", "12", "pairs", "+", "5", "DPO", "0.800", "->",
                                "0.400", "base"]
    assert lines[3].split() == ["1", "25.0%", "25.0%", "30.0%", "1", "-", "-", "out/models/1"]
    assert lines[-1] == "stopped early: round 1's held-out verifier accept rate fell"


def test_the_report_command_prints_the_measured_rounds_of_a_loop_on_disk(tmp_path, capsys):
    import json

    from rsgen.iterate.report import main

    def held(truth_right):
        return {"qa": 800, "verifier_rate": 0.2, "accept_rate": 0.2, "truth_right": truth_right,
                "truth_rate": truth_right / 800}
    data = {"held_out": {"images": 200, "fraction": 0.25}, "judge_model": "base", "stopped": None,
            "rounds": [{"round": 0, "model": "base", "held_out": held(160), "train": held(500),
                        "truth": {"accepted": 475, "accepted_wrong": 0}, "training": {"rows": 349}},
                       {"round": 1, "model": "out/models/1", "held_out": held(240), "train": held(700),
                        "truth": {"accepted": 600, "accepted_wrong": 1}},
                       {"round": 2, "model": "out/models/2"}]}  # round 2 is still answering: not reported
    (tmp_path / "iterate.json").write_text(json.dumps(data))
    assert main([str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[3].split()[:6] == ["1", "20.0%", "20.0%", "30.0%", "+10.0", "±"]  # 20% -> 30% of 800: se 2.2
    assert lines[3].split()[6] == "2.2" and len(lines) == 8
    assert lines[5] == "judge in every round: base (never a fine-tuned model grading itself)"
    assert lines[6].startswith("truth check (accepted pairs that contradict the scene the pool drew): round 0 0 of "
                               "475, round 1 1 of 600;")
    assert lines[7] == "held-out truth, round 1 against the base: +10.0 ± 2.2 points"
    assert main([str(tmp_path / "nowhere")]) == 2
