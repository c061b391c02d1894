"""`write_scripted_run`: an output directory as prepare, generate and judge leave it (prepared parquet in the
contract's layout, work JSON Lines, prepare_report.json, run.json), with outcomes the test scripts pair by pair.

Used where a test is about emit's routing, files and card; the TRL test trains a real tiny model on the result.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass, field

import datasets
from PIL import Image, ImageDraw

from rsgen.layout import OutputLayout
from rsgen.schema import PREPARED_FEATURES
from rsgen.store import CheckpointStore

INSTRUCTION = "Answer in short without any other content."

# What generate (and the judge) made of a QA pair:
#   match      verifier accepted
#   promote    verifier rejected, judge CORRECT
#   wrong      verifier rejected, judge WRONG
#   unsure     verifier rejected, judge UNSURE
#   no_answer  reasoning cut off at the token limit: nothing extracted, never judged
#   bad_input  the verifier could not use the reference (its reason); never judged
OUTCOMES = ("match", "promote", "wrong", "unsure", "no_answer", "bad_input")


@dataclass
class ScriptedPair:
    id: str
    question: str
    answer: str
    outcome: str
    wrong: str = "7"  # what the model answered when it was wrong
    options: list[str] = field(default_factory=list)

    def response(self, sample: int = 0) -> str:
        if self.outcome == "no_answer":
            return f"<think>Counting the objects in {self.id}: one, two, three, four and"
        final = self.answer if self.outcome == "match" else self.wrong
        return f"<think>Looking at {self.id} (sample {sample}).\nCounting | carefully.</think>\nThe answer is {final}"

    def extracted(self) -> str | None:
        return None if self.outcome == "no_answer" else (self.answer if self.outcome == "match" else self.wrong)


@dataclass
class ScriptedImage:
    family: str
    pairs: list[ScriptedPair]
    color: tuple[int, int, int]
    fmt: str = "PNG"
    steps: list[str] = field(default_factory=list)

    def image_bytes(self) -> bytes:
        img = Image.new("RGB", (40, 32), self.color)
        ImageDraw.Draw(img).rectangle((4, 4, 18, 20), fill=(255 - self.color[0], 200, 40))
        buf = io.BytesIO()
        img.save(buf, format=self.fmt)
        return buf.getvalue()


def default_pool() -> list[ScriptedImage]:
    """Two families with every outcome, a JPEG, multi-pair images, an image with no accepted pair and one with no
    rejected pair; plus a family the model gets entirely right (its rejected and dpo configs are empty)."""
    images = []
    outcomes = ["match", "wrong", "promote", "unsure", "no_answer", "match", "wrong", "match", "match", "wrong", "unsure"]
    k = 0
    for i, n_pairs in enumerate([3, 2, 1, 2, 1, 2]):  # 11 pairs
        pairs = []
        for j in range(n_pairs):
            outcome = outcomes[k]
            q = (f"Question: Subtract all red cubes {i}. How many objects are left? (pair {j})\n{INSTRUCTION}")
            pairs.append(ScriptedPair(f"clevr-{i:02d}-{j}", q, str(i + j + 1), outcome, wrong=str(i + j + 9)))
            k += 1
        images.append(ScriptedImage("CLEVRMath", pairs, (30 * i, 80, 120), fmt="JPEG" if i == 1 else "PNG",
                                    steps=["provenance@1"] + (["dedup_merge@1"] if i == 2 else [])))
    mc_outcomes = [["match", "wrong"], ["promote"], ["unsure", "match"]]
    for i, outs in enumerate(mc_outcomes):
        pairs = []
        for j, outcome in enumerate(outs):
            q = (f"Which shape is largest in picture {i}-{j}?\nA. cube\nB. sphere\nC. cylinder\n"
                 f"Answer with the option's letter.\n{INSTRUCTION}")
            pairs.append(ScriptedPair(f"mc-{i}-{j}", q, "B", outcome, wrong="C", options=["cube", "sphere", "cylinder"]))
        images.append(ScriptedImage("DemoMC", pairs, (200, 40 * i, 90), steps=["mc_normalise@1"]))
    images.append(ScriptedImage("AllRight", [ScriptedPair("ok-0-0", f"Count the dots.\n{INSTRUCTION}", "2", "match")],
                                (10, 10, 10)))
    return images


def write_scripted_run(root, images: list[ScriptedImage] | None = None, *, judge: bool = True,
                       num_samples: int = 1, calibration_agree: int = 3, calibration_disagree: int = 1,
                       known_wrong_rejected: int = 4, known_wrong_accepted: int = 0,
                       every_items: int = 4) -> list[ScriptedImage]:
    """Write prepared/, work/generate, work/judge (when `judge`), prepare_report.json and run.json under `root`.

    With `num_samples > 1` every sample but the last is a wrong answer and the last follows the script, so a
    scripted `match` is accepted through its last sample, and a rejected pair is described by sample 0.

    Each family gets `known_wrong_rejected` known-wrong calibration records the judge called WRONG and
    `known_wrong_accepted` it called CORRECT (the leniency gate reads them)."""
    images = images if images is not None else default_pool()
    layout = OutputLayout(root)
    rows = []
    for img in images:
        data = img.image_bytes()
        rows.append({
            "image": {"bytes": data, "path": None},
            "image_sha256": hashlib.sha256(data).hexdigest(),
            "family": img.family,
            "qa": [{"id": p.id, "question": p.question, "answers": [p.answer], "options": p.options,
                    "source_row_id": p.id} for p in img.pairs],
            "clean_meta": {"source_dataset": "test/pool", "source_config": "default", "source_split": "train",
                           "source_row_ids": [p.id for p in img.pairs], "family": img.family,
                           "policy_version": "rsgen-clean-v1", "steps": img.steps},
        })
    layout.prepared.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=PREPARED_FEATURES).to_parquet(
        str(layout.prepared / "data-00000-of-00001.parquet"))
    # The shape rsgen.prepare writes (only the parts emit reads).
    layout.prepare_report.write_text(json.dumps({
        "policy_version": "rsgen-clean-v1",
        "steps": {"provenance": {"version": 1, "does": "recorded source resolves to the attached image"},
                  "mc_normalise": {"version": 1, "does": "options re-rendered as a lettered block"},
                  "dedup_merge": {"version": 1, "does": "the same question twice on the same image merged"}},
        "rows": len(rows), "shards": ["data-00000-of-00001.parquet"],
        "input_qa_pairs": 23, "kept_qa_pairs": 17, "dropped_qa_pairs": 5, "merged_qa_pairs": 1,
        "dropped": {"provenance_mismatch": 3, "image_undecodable": 2}, "merged": {"duplicate_question": 1},
        "converted": {}, "images": {"checked": 12, "dropped": {"image_undecodable": 2}, "converted": {}},
        "families": {
            "CLEVRMath": {"rows": 6, "input_qa_pairs": 15, "kept_qa_pairs": 11, "dropped_qa_pairs": 3,
                          "merged_qa_pairs": 1, "dropped": {"provenance_mismatch": 3},
                          "merged": {"duplicate_question": 1}, "converted": {}},
            "DemoMC": {"rows": 3, "input_qa_pairs": 7, "kept_qa_pairs": 5, "dropped_qa_pairs": 2,
                       "merged_qa_pairs": 0, "dropped": {"image_undecodable": 2}, "merged": {}, "converted": {}},
        },
        "sources": [],
    }))

    pairs = [(img.family, p) for img in images for p in img.pairs]
    calib_keys = []
    with CheckpointStore(layout.generate_work).writer(0, every_items, 1e9) as gen:
        for family, p in pairs:
            for s in range(num_samples):
                key = p.id if num_samples == 1 else f"{p.id}#{s}"
                scripted = s == num_samples - 1
                outcome = p.outcome if scripted else ("wrong" if p.outcome != "no_answer" else "no_answer")
                shown = ScriptedPair(p.id, p.question, p.answer, outcome, p.wrong, p.options)
                match = outcome == "match"
                extracted = shown.extracted()
                gen.add({
                    "key": key, "id": p.id, "sample": s, "family": family, "question": p.question,
                    "response": shown.response(s), "extracted": extracted, "match": match,
                    "reason": None if match else ("no_answer" if extracted is None else
                                                  "bad_input" if outcome == "bad_input" else "wrong_answer"),
                    "verifier": "mc" if family == "DemoMC" else "relaxed",
                    "prompt_tokens": 30 + s, "generated_tokens": 12 + len(p.id) + 5 * s,
                    "hit_limit": outcome == "no_answer", "model": "test-model", "revision": None,
                })
                if match:
                    calib_keys.append((key, p))
    if judge:
        verdicts = {"promote": "CORRECT", "wrong": "WRONG", "unsure": "UNSURE"}
        with CheckpointStore(layout.judge_work).writer(0, every_items, 1e9) as jw:
            for _family, p in pairs:
                for s in range(num_samples):
                    key = p.id if num_samples == 1 else f"{p.id}#{s}"
                    outcome = p.outcome if s == num_samples - 1 else "wrong"
                    if outcome not in verdicts or p.outcome == "no_answer":
                        continue
                    jw.add({"key": key, "id": p.id, "kind": "rejected", "reference": p.answer,
                            "candidate": p.wrong, "verdict": verdicts[outcome], "response": verdicts[outcome],
                            "prompt_tokens": 50, "generated_tokens": 3, "hit_limit": False, "model": "test-model"})
            for n, (key, p) in enumerate(calib_keys[: calibration_agree + calibration_disagree]):
                verdict = "CORRECT" if n < calibration_agree else "WRONG"
                jw.add({"key": f"calibration:{key}", "id": p.id, "kind": "calibration", "reference": p.answer,
                        "candidate": p.answer, "verdict": verdict, "response": verdict, "prompt_tokens": 50,
                        "generated_tokens": 2, "hit_limit": False, "model": "test-model"})
            for family in sorted({img.family for img in images}):
                family_pairs = [p for img in images if img.family == family for p in img.pairs]
                for n in range(min(len(family_pairs), known_wrong_rejected + known_wrong_accepted)):
                    p = family_pairs[n]
                    verdict = "WRONG" if n < known_wrong_rejected else "CORRECT"
                    jw.add({"key": f"known_wrong:{p.id}", "id": p.id, "kind": "known_wrong", "family": family,
                            "reference": p.answer, "candidate": "purple elephant", "miss": "unrelated",
                            "verdict": verdict, "response": verdict, "prompt_tokens": 50, "generated_tokens": 2,
                            "hit_limit": False, "model": "test-model"})
    layout.run_json.write_text(json.dumps({
        "started_at": "2026-01-02T03:04:05+00:00",
        "model_revision": None,
        "stages": {
            "prepare": {"started_at": "2026-01-02T03:04:05+00:00", "finished_at": "2026-01-02T03:04:15+00:00"},
            "generate": {"started_at": "2026-01-02T03:04:15+00:00", "finished_at": "2026-01-02T03:14:15+00:00"},
            "judge": {"started_at": "2026-01-02T03:14:15+00:00", "finished_at": "2026-01-02T03:15:15+00:00"},
        },
    }))
    return images


def scripted_recipe(root, **overrides):
    from rsgen.config import recipe_from_dict

    values = {"output_dir": str(root), "model_name_or_path": "test-org/test-model",
              "verifier": {"CLEVRMath": "relaxed", "DemoMC": "mc", "AllRight": "exact"}, "judge": True,
              # The scripted wrong answers are numbers and letters, decisive under the default scope: judge them
              # all, so these tests see every verdict (tests/emit/test_emit_judge_rules.py covers the default).
              "judge_scope": "all", "max_new_tokens": 64, **overrides}
    if values.get("num_samples", 1) > 1:
        values.setdefault("temperature", 0.7)  # sampling several answers needs temperature > 0
    from rsgen.testing.work import verified_as_scripted

    return verified_as_scripted(recipe_from_dict(values))  # the scripted decisions are the verify stage's
