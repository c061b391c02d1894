"""Helpers for the judge tests: an output directory holding a prepared pool and finished generate work, and a judge
engine whose answers the test controls (`ScriptedJudgeEngine`, used where a test is about routing or parsing)."""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass

import datasets
from PIL import Image

from rsgen.config import recipe_from_dict
from rsgen.layout import OutputLayout
from rsgen.schema import PREPARED_FEATURES
from rsgen.store import CheckpointStore
from rsgen.testing.work import verified_as_scripted


@dataclass
class Pair:
    """One QA pair and what generate made of it."""

    id: str
    answers: list[str]
    match: bool
    extracted: str | None
    reason: str | None = None
    family: str = "Demo"
    verifier: str = "relaxed"
    options: tuple[str, ...] = ()

    @property
    def question(self) -> str:
        return f"Question: how many things in scene {self.id}?\nAnswer in short without any other content."


def _png(seed: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (seed * 37 % 256, 90, 160)).save(buf, format="PNG")
    return buf.getvalue()


def write_output_dir(root, pairs: list[Pair], pairs_per_image: int = 2, every_items: int = 3) -> None:
    """A prepared pool (one parquet shard in the contract's layout) and generate records for `pairs` (an image
    holds up to `pairs_per_image` consecutive pairs of one family)."""
    layout = OutputLayout(root)
    rows = []
    groups = []
    for p in pairs:
        if groups and len(groups[-1]) < pairs_per_image and groups[-1][0].family == p.family:
            groups[-1].append(p)
        else:
            groups.append([p])
    for start, group in enumerate(groups):
        image = _png(start)
        rows.append({
            "image": {"bytes": image, "path": None},
            "image_sha256": hashlib.sha256(image).hexdigest(),
            "family": group[0].family,
            "qa": [{"id": p.id, "question": p.question, "answers": p.answers, "options": list(p.options),
                    "source_row_id": p.id}
                   for p in group],
            "clean_meta": {"source_dataset": "test", "source_config": "", "source_split": "train",
                           "source_row_ids": [p.id for p in group], "family": group[0].family,
                           "policy_version": "test", "steps": []},
        })
    layout.prepared.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_list(rows, features=PREPARED_FEATURES).to_parquet(
        str(layout.prepared / "data-00000-of-00001.parquet"))
    with CheckpointStore(layout.generate_work).writer(0, every_items, 1e9) as writer:
        for p in pairs:
            writer.add({
                "key": p.id, "id": p.id, "sample": 0, "family": p.family, "question": p.question,
                "response": f"<think>...</think>{p.extracted or ''}", "extracted": p.extracted, "match": p.match,
                "reason": None if p.match else (p.reason or "wrong_answer"), "verifier": p.verifier,
                "prompt_tokens": 10, "generated_tokens": 5, "hit_limit": p.reason == "no_answer",
                "model": "test-model", "revision": None,
            })


def make_recipe(root, **overrides):
    raw = {"output_dir": str(root), "model_name_or_path": "test-model", "judge_calibration_size": 3,
           "checkpoint_every_items": 2, "checkpoint_every_seconds": 1e9, **overrides}
    return verified_as_scripted(recipe_from_dict(raw))  # the scripted decisions are the verify stage's


def candidate_of(prompt: str) -> str:
    """The fenced candidate text of a rendered judge prompt."""
    match = re.search(r"<<<CANDIDATE>>>\n(.*)\n<<<END>>>", prompt, re.DOTALL)
    assert match, prompt
    return match.group(1)


class ScriptedJudgeEngine:
    """A judge engine whose answers the test controls: `script(prompt) -> (text, hit_limit)` or text.
    It records every request it receives, so a test can check what the judge was shown."""

    def __init__(self, script):
        self.script = script
        self.requests = []

    def generate(self, requests):
        from rsgen.engine import GenerationResult

        for request in requests:
            self.requests.append(request)
            prompt = request.messages[0]["content"][0]["text"]
            out = self.script(prompt)
            text, hit_limit = out if isinstance(out, tuple) else (out, False)
            yield request, GenerationResult(text=text, prompt_tokens=len(prompt.split()),
                                            generated_tokens=len(text.split()), hit_limit=hit_limit)


@dataclass
class FakeState:
    """The parts of accelerate's PartialState the stage uses, for one rank of a simulated world."""

    process_index: int = 0
    num_processes: int = 1
    device: str = "cpu"

    @property
    def is_main_process(self) -> bool:
        return self.process_index == 0

    def wait_for_everyone(self) -> None:
        pass
