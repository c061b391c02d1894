"""OUTPUT_DIR/dataset/ as written by run_emit: every config loads with `datasets`, features match the schema,
accepted + rejected = prepared, rejected holds the official answer and the model's extracted answer, questions
are byte-identical to what the model received, and a second emit writes the same bytes."""

from __future__ import annotations

import hashlib
import io
import json
from collections import defaultdict

import datasets
import pytest
from emit_helpers import (
    INSTRUCTION,
    ScriptedImage,
    ScriptedPair,
    default_pool,
    scripted_recipe,
    write_scripted_run,
)
from PIL import Image

from rsgen.config import RecipeError
from rsgen.emit import EmitError, run_emit, stage
from rsgen.emit.card_header import configs_of
from rsgen.emit.trl_views import DPO_FEATURES, SFT_FEATURES, dpo_rows
from rsgen.layout import OutputLayout
from rsgen.schema import split_features
from rsgen.store import CheckpointStore

FEATURES = {"RS_think": split_features("think"), "RS_nothink": split_features("nothink"),
            "rejected": split_features("rejected"), "sft": SFT_FEATURES, "dpo": DPO_FEATURES}


def load(root, config):
    # force_redownload: `datasets` 5.2 caches a local folder's config under a key made from the card's YAML only,
    # so two output dirs whose cards match (same names and sizes) would share a cache entry.
    return datasets.load_dataset(str(OutputLayout(root).dataset), config, split="train",
                                 download_mode="force_redownload")


def tree_digest(root) -> dict[str, str]:
    root = OutputLayout(root).root
    files = [p for p in sorted((root / "dataset").rglob("*")) if p.is_file()] + [root / "stats.json"]
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def generate_records(root):
    return {rec["key"]: rec for rec in CheckpointStore(OutputLayout(root).generate_work).iter_records()}


def test_every_config_loads_with_the_schema_and_decodable_images(emitted_run):
    root, _recipe, _images = emitted_run
    stats = json.loads(OutputLayout(root).stats_json.read_text())
    configs = configs_of(stats)
    assert len(configs) == 13  # 3 families x 5, minus AllRight's empty rejected and dpo
    for family, fam in stats["families"].items():
        for kind, split in fam["splits"].items():
            files = sorted((OutputLayout(root).dataset / "data" / split["config"]).glob("*.parquet"))
            assert len(files) == split["shards"]
            if not split["rows"]:
                assert split["config"] not in configs
                continue
            ds = load(root, split["config"])
            assert ds.features == FEATURES[kind], split["config"]
            assert len(ds) == split["rows"]
            for row in ds:
                images = row["images"] if "images" in row else [row["image"]]
                assert len(images) == 1
                images[0].load()  # decodes
                assert images[0].size == (40, 32)
            if kind in ("RS_think", "RS_nothink", "rejected"):
                raw = ds.cast_column("image", datasets.Image(decode=False))
                for row in raw:
                    assert row["image"]["path"] is None  # bytes embedded, never a local path
                    assert hashlib.sha256(row["image"]["bytes"]).hexdigest() == row["image_sha256"]
                    assert row["clean_meta"]["family"] == family
                    assert row["clean_meta"]["model"] == "test-org/test-model"
                    assert row["clean_meta"]["verifier"] == fam["verifier"]
                    assert row["qa"], "a row without QA pairs in a split is not written to it"


def test_accepted_plus_rejected_is_prepared_and_fields_come_from_the_work(emitted_run):
    root, _recipe, images = emitted_run
    gen = generate_records(root)
    prepared = defaultdict(dict)
    for img in images:
        for p in img.pairs:
            prepared[img.family][p.question] = p
    for family, pairs in prepared.items():
        accepted = [qa for row in load(root, f"{family}_RS_think") for qa in row["qa"]]
        nothink = [qa for row in load(root, f"{family}_RS_nothink") for qa in row["qa"]]
        rejected = ([qa for row in load(root, f"{family}_rejected") for qa in row["qa"]]
                    if family != "AllRight" else [])
        assert len(accepted) + len(rejected) == len(pairs)
        assert sorted(q["question"] for q in accepted + rejected) == sorted(pairs)
        assert [(q["question"], q["answer"]) for q in accepted] == [(q["question"], q["answer"]) for q in nothink]
        for qa in accepted + rejected:
            pair = pairs[qa["question"]]
            record = gen[pair.id]
            assert qa["question"] == record["question"]  # byte-identical to the text the model received
            assert qa["answer"] == pair.answer  # the official answer, always
        for qa in accepted:
            assert pairs[qa["question"]].outcome in ("match", "promote")
            assert qa["response"] == gen[pairs[qa["question"]].id]["response"]
        for qa in rejected:
            pair = pairs[qa["question"]]
            assert qa["wrong_vlm"] == gen[pair.id]["extracted"]
            assert qa["reason"] == {"wrong": "wrong_answer", "unsure": "judge_unsure",
                                    "no_answer": "no_answer"}[pair.outcome]


def test_sft_and_dpo_views_mirror_the_splits(emitted_run):
    root, recipe, _images = emitted_run
    assert recipe.sft_keep_reasoning
    think = load(root, "CLEVRMath_RS_think")
    sft = load(root, "CLEVRMath_sft")
    accepted = [(qa, row["image"]) for row in think for qa in row["qa"]]
    assert len(sft) == len(accepted) > len(think)  # one accepted QA pair per row
    for pair, (qa, image) in zip(sft, accepted):
        assert pair["prompt"] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                               {"type": "text", "text": qa["question"]}]}]
        # Byte-identical to what the model produced, reasoning included.
        assert pair["completion"] == [{"role": "assistant", "content": [{"type": "text", "text": qa["response"]}]}]
        assert "<think>" in qa["response"]
        assert len(pair["images"]) == 1 and pair["images"][0].tobytes() == image.tobytes()
    rejected = [qa for row in load(root, "CLEVRMath_rejected") for qa in row["qa"]]
    dpo = load(root, "CLEVRMath_dpo")
    expected = [qa for qa in rejected if qa["wrong_vlm"] is not None]
    assert len(dpo) == len(expected) == len(rejected) - 1  # the no_answer pair has nothing to prefer against
    for pair, qa in zip(dpo, expected):
        assert pair["prompt"] == [{"role": "user", "content": [{"type": "image", "text": None},
                                                               {"type": "text", "text": qa["question"]}]}]
        assert pair["chosen"] == [{"role": "assistant", "content": [{"type": "text", "text": qa["answer"]}]}]
        assert pair["rejected"] == [{"role": "assistant", "content": [{"type": "text", "text": qa["wrong_vlm"]}]}]
        assert len(pair["images"]) == 1


def test_dpo_leaves_out_pairs_without_a_usable_wrong_answer():
    image = {"bytes": b"x", "path": None}
    qa = [{"question": "q1", "answer": "B", "wrong_vlm": "C", "reason": "wrong_answer"},
          {"question": "q2", "answer": "B", "wrong_vlm": None, "reason": "no_answer"},
          {"question": "q3", "answer": "B", "wrong_vlm": "B", "reason": "mc_ambiguous"},
          {"question": "q4", "answer": "seven", "wrong_vlm": "A", "reason": "bad_input"}]
    rows, skipped = dpo_rows(image, qa)
    assert [r["prompt"][0]["content"][1]["text"] for r in rows] == ["q1"]
    assert skipped == {"no_answer": 1, "bad_input": 1, "same_as_answer": 1}


def test_stats_count_what_was_written(emitted_run):
    root, _recipe, _images = emitted_run
    stats = json.loads(OutputLayout(root).stats_json.read_text())
    fam = stats["families"]["CLEVRMath"]
    # default_pool: 11 CLEVRMath pairs: 4 match, 1 promote, 3 wrong, 2 unsure, 1 no_answer.
    assert (fam["prepared_qa"], fam["accepted_qa"], fam["rejected_qa"]) == (11, 5, 6)
    assert fam["accept_rate"] == round(5 / 11, 6)
    assert fam["verifier_accepted_qa"] == 4
    assert fam["rejected_reasons"] == {"judge_unsure": 2, "no_answer": 1, "wrong_answer": 3}
    judge = fam["judge"]
    promotions = judge.pop("promotions")
    assert judge.pop("withheld_promotions") == []
    assert judge == {"enabled": True, "verifier": 4, "decisive": 0, "judged": 6, "promoted": 1, "withheld": 0,
                     "correct": 1, "wrong": 3, "unsure": 2,
                     "gate": {"min_specificity": 0.95, "specificity": 1.0, "withheld": False, "consulted": True,
                              "min_recall": 0.5, "recall": None, "adds_little": False}}
    assert promotions == [{"question": _images[0].pairs[2].question, "reference": "3", "candidate": "11"}]
    calib = fam["calibration"]
    examples = calib.pop("examples")
    assert calib == {"agreed": 3, "total": 4, "known_wrong_rejected": 4, "known_wrong_total": 4,
                     "known_right_promoted": 0, "known_right_total": 0,
                     "known_wrong_forms": {"unrelated": {"as_expected": 4, "total": 4}}, "known_right_forms": {}}
    assert len(examples["accepted"]) == 4 and len(examples["known_wrong"]) == 4
    assert stats["calibration"] == {"agreed": 3, "total": 4, "known_wrong_rejected": 9, "known_wrong_total": 9,
                                    "known_right_promoted": 0, "known_right_total": 0}  # 4 + 4 + AllRight's 1
    assert stats["judge_counts"] == {"judged": 9, "decisive": 0, "promoted": 2, "withheld": 0}
    assert stats["judge_scope"] == "all" and stats["judge_min_specificity"] == 0.95
    rejected = fam["splits"]["rejected"]
    assert {k: rejected[k] for k in ("config", "rows", "qa_pairs", "shards")} == {
        "config": "CLEVRMath_rejected", "rows": 4, "qa_pairs": 6, "shards": 1}
    shard = OutputLayout(root).dataset / "data" / "CLEVRMath_rejected" / "train-00000-of-00001.parquet"
    assert rejected["download_size"] == shard.stat().st_size and rejected["num_bytes"] > 0
    assert fam["splits"]["dpo"]["skipped"] == {"no_answer": 1, "bad_input": 0, "same_as_answer": 0}
    assert fam["tokens"]["samples"] == 11 and fam["tokens"]["hit_limit"] == 1
    assert sum(fam["response_lengths"]["counts"]) == 11
    assert fam["cleaning"]["steps"] == {"dedup_merge@1": 1, "provenance@1": 6}
    assert fam["cleaning"]["report"]["family"]["dropped.provenance_mismatch"] == 3
    assert stats["wall_time"] == {"stages_seconds": {"prepare": 10.0, "generate": 600.0, "judge": 60.0},
                                  "total_seconds": 670.0, "started_at": "2026-01-02T03:04:05+00:00"}
    assert stats["families"]["AllRight"]["splits"]["rejected"]["shards"] == 0


def test_emitting_twice_gives_byte_identical_files(tmp_path):
    write_scripted_run(tmp_path)
    recipe = scripted_recipe(tmp_path)
    run_emit(recipe)
    first = tree_digest(tmp_path)
    run_emit(recipe)
    assert tree_digest(tmp_path) == first
    assert any(name.endswith(".parquet") for name in first) and "dataset/README.md" in first


def test_shards_follow_shard_size_and_keep_row_order(tmp_path, monkeypatch):
    # Twelve small images; with a "megabyte" of 1,000 bytes, shard_size_mb=3 needs several shards.
    pool = [ScriptedImage("Big", [ScriptedPair(f"b-{i}-{j}", f"Q {i} {j}?", "1", "match" if j % 2 else "wrong")
                                  for j in range(8)], (i * 20, 50, 50)) for i in range(12)]
    write_scripted_run(tmp_path, pool, judge=False)
    monkeypatch.setattr(stage, "MB", 1000)
    run_emit(scripted_recipe(tmp_path, judge=False, verifier="relaxed", shard_size_mb=3))
    stats = json.loads(OutputLayout(tmp_path).stats_json.read_text())
    split = stats["families"]["Big"]["splits"]["RS_think"]
    assert split["shards"] > 1
    names = sorted(p.name for p in (OutputLayout(tmp_path).dataset / "data" / "Big_RS_think").iterdir())
    assert names == [f"train-{i:05d}-of-{split['shards']:05d}.parquet" for i in range(split["shards"])]
    ds = load(tmp_path, "Big_RS_think")
    assert [row["qa"][0]["question"] for row in ds] == [f"Q {i} 1?" for i in range(12)]


def test_judge_disabled_keeps_verifier_reasons(tmp_path):
    write_scripted_run(tmp_path, judge=False)
    run_emit(scripted_recipe(tmp_path, judge=False))
    stats = json.loads(OutputLayout(tmp_path).stats_json.read_text())
    fam = stats["families"]["CLEVRMath"]
    # Without the judge, "promote" and "unsure" pairs stay rejected with the verifier's reason.
    assert (fam["accepted_qa"], fam["rejected_qa"]) == (4, 7)
    assert fam["rejected_reasons"] == {"no_answer": 1, "wrong_answer": 6}
    assert fam["judge"]["enabled"] is False and fam["calibration"] is None
    card = (OutputLayout(tmp_path).dataset / "README.md").read_text()
    assert "was **disabled** for this run (`judge: false`)" in card


@pytest.mark.parametrize("judge_scope", ["undecided", "all"])
def test_bad_input_is_never_judged_promoted_or_a_dpo_pair_and_is_counted_as_such(tmp_path, capsys, judge_scope):
    """Issue #28.2: bad_input pairs went to the judge (13 of 24 promoted, the rest written as wrong_answer and
    made DPO pairs). Here no judge record exists for them: emit must not ask for one."""
    question = f"Which colour is the ball?\nA. red\nB. blue\n{INSTRUCTION}"
    pairs = [ScriptedPair("bad-0", question, "seven", "bad_input", wrong="A", options=["red", "blue"]),
             ScriptedPair("ok-0", f"How many balls?\n{INSTRUCTION}", "2", "match"),
             ScriptedPair("wrong-0", f"How many cubes?\n{INSTRUCTION}", "3", "wrong", wrong="fig")]
    write_scripted_run(tmp_path, [ScriptedImage("Mixed", pairs, (90, 90, 200))], known_wrong_rejected=1)
    run_emit(scripted_recipe(tmp_path, verifier="relaxed", judge_scope=judge_scope))
    fam = json.loads(OutputLayout(tmp_path).stats_json.read_text())["families"]["Mixed"]
    assert fam["rejected_reasons"] == {"bad_input": 1, "wrong_answer": 1}
    assert fam["judge"]["judged"] == 1 and fam["judge"]["promoted"] == 0
    assert [(qa["question"], qa["reason"]) for row in load(tmp_path, "Mixed_rejected") for qa in row["qa"]
            if qa["reason"] == "bad_input"] == [(question, "bad_input")]
    assert [row["rejected"][0]["content"][0]["text"] for row in load(tmp_path, "Mixed_dpo")] == ["fig"]
    assert fam["splits"]["dpo"]["skipped"]["bad_input"] == 1
    header, _, row = capsys.readouterr().out.strip().splitlines()[-3:]  # the final table
    assert "bad input" in header and row.split()[:4] == ["Mixed", "1", "2", "1"]


def test_several_samples_accept_any_match_and_describe_rejections_by_sample_0(tmp_path):
    images = write_scripted_run(tmp_path, num_samples=2)
    run_emit(scripted_recipe(tmp_path, num_samples=2))
    gen = generate_records(tmp_path)
    pairs = {p.question: p for img in images for p in img.pairs}
    for row in load(tmp_path, "CLEVRMath_RS_think"):
        for qa in row["qa"]:
            assert qa["response"] == gen[f"{pairs[qa['question']].id}#1"]["response"]  # the accepted sample
    for row in load(tmp_path, "CLEVRMath_rejected"):
        for qa in row["qa"]:
            assert qa["wrong_vlm"] == gen[f"{pairs[qa['question']].id}#0"]["extracted"]
    stats = json.loads(OutputLayout(tmp_path).stats_json.read_text())
    assert stats["families"]["CLEVRMath"]["accepted_qa"] == 5
    assert stats["families"]["CLEVRMath"]["tokens"]["samples"] == 22


def test_unfinished_work_is_refused(tmp_path):
    write_scripted_run(tmp_path, judge=False)
    with pytest.raises(EmitError, match="no judge records"):
        run_emit(scripted_recipe(tmp_path, judge=True))
    assert not OutputLayout(tmp_path).dataset.exists()


def test_example_images_are_the_stored_files(emitted_run):
    root, _recipe, _images = emitted_run
    assets = OutputLayout(root).dataset / "assets"
    raw = load(root, "CLEVRMath_rejected").cast_column("image", datasets.Image(decode=False))
    first, second = raw[0]["image"]["bytes"], raw[1]["image"]["bytes"]
    assert (assets / "CLEVRMath_rejected_example_1.png").read_bytes() == first
    assert (assets / "CLEVRMath_rejected_example_2.jpg").read_bytes() == second  # JPEG kept as JPEG
    assert Image.open(io.BytesIO(second)).format == "JPEG"
    assert default_pool()[1].fmt == "JPEG"


def test_sft_without_reasoning_answers_with_the_official_answer():
    from rsgen.emit.trl_views import sft_rows

    qa = [{"question": "q1", "answer": "3", "response": "<think>x</think>3"},
          {"question": "q2", "answer": "B", "response": "<think>y</think>B"}]
    image = {"bytes": b"x", "path": None}
    rows = sft_rows(image, qa, keep_reasoning=False)
    assert [r["prompt"][0]["content"][-1]["text"] for r in rows] == ["q1", "q2"]
    assert [r["completion"][0]["content"] for r in rows] == [[{"type": "text", "text": "3"}],
                                                             [{"type": "text", "text": "B"}]]
    assert all(r["prompt"][0]["content"][0] == {"type": "image", "text": None} for r in rows)  # each row its image
    rows = sft_rows(image, qa, keep_reasoning=True)
    assert [r["completion"][0]["content"][0]["text"] for r in rows] == ["<think>x</think>3", "<think>y</think>B"]


def test_views_choose_which_views_are_written(tmp_path):
    write_scripted_run(tmp_path)
    run_emit(scripted_recipe(tmp_path, views=["sft"]))
    layout = OutputLayout(tmp_path)
    written = sorted(p.name for p in (layout.dataset / "data").iterdir())
    assert [c for c in written if c.startswith("CLEVRMath")] == [
        "CLEVRMath_RS_nothink", "CLEVRMath_RS_think", "CLEVRMath_rejected", "CLEVRMath_sft"]
    stats = json.loads(layout.stats_json.read_text())
    assert list(stats["families"]["CLEVRMath"]["splits"]) == ["RS_think", "RS_nothink", "rejected", "sft"]
    assert "CLEVRMath_dpo" not in (layout.dataset / "README.md").read_text()
    assert len(load(tmp_path, "CLEVRMath_sft")) == 5
    with pytest.raises(RecipeError, match="'ppo'.*sft, dpo, dpo_onpolicy, grpo"):
        run_emit(scripted_recipe(tmp_path, views=["sft", "ppo"]))
    with pytest.raises(RecipeError, match="grpo need.* an explore pass; set explore_samples > 0"):
        run_emit(scripted_recipe(tmp_path, views=["sft", "grpo"]))
