"""The demo's outside truth: every QA pair of a demo run checked against the scene the pool drew.

The demo pool knows every answer (`rsgen.demo.pool.answer_from_scene`), so a demo run can be graded without
trusting the verifier, the judge or the stored reference: the pool is drawn again from its seed, each QA pair is
traced back to its pool row (prepared QA -> `source_row_id`), the answer is recomputed from the scene, and the
model's final answer must state it exactly: the same number (no tolerance; digits or a number word), the same word
(articles and a plural allowed), or, for multiple choice, the right option (its letter or its text).

The final answer is read here on its own -- the text after the reasoning, parsed by `stated_values` -- never with
the verifier's extraction or normalisation, so a bug shared with the verifier would show as a disagreement.

Two figures come out: accepted pairs that contradict the scene (the data's error rate), and right answers the
verifier rejected -- its false negatives -- with how many the judge recovered (its recall) and how many stay
rejected.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsgen.demo.pool import answer_from_scene, make_demo_rows, mc_option_texts
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, VerifyRecord, read_records, records_by_key
from rsgen.schema import open_prepared
from rsgen.store import CheckpointStore


@dataclass
class TruthReport:
    accepted: int = 0
    wrong: list[dict[str, Any]] = field(default_factory=list)  # accepted pairs against the scene
    verifier_missed: int = 0  # right answers (by the scene) the verifier rejected
    recovered: int = 0  # of those, promoted by the judge into the accepted splits
    still_rejected: list[dict[str, Any]] = field(default_factory=list)  # of those, left in the rejected split

    @property
    def wrong_rate(self) -> float:
        return len(self.wrong) / self.accepted if self.accepted else 0.0

    @property
    def recall(self) -> float | None:
        return self.recovered / self.verifier_missed if self.verifier_missed else None

    def line(self) -> str:
        recall = f" ({self.recall:.1%})" if self.recall is not None else ""
        return (f"truth check: {len(self.wrong)} of {self.accepted} accepted QA pairs contradict the scene the pool "
                f"drew ({self.wrong_rate:.1%}); {self.verifier_missed} right answers were rejected by the verifier, "
                f"the judge recovered {self.recovered}{recall}, {len(self.still_rejected)} stay rejected")


_NUMBER_WORDS = {word: value for value, word in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
    "seventeen eighteen nineteen".split())}
_NUMBER_WORDS.update({word: 20 + 10 * i for i, word in enumerate(
    "twenty thirty forty fifty sixty seventy eighty ninety".split())})
_ARTICLES = {"a", "an", "the"}
_FILLER = re.compile(r"^(the answer is|it is|answer:)\s+", re.IGNORECASE)


def final_answer(response: str) -> str | None:
    """What the model answered after its reasoning: the text after the last `</think>`, stripped; None if empty."""
    text = response.rsplit("</think>", 1)[-1].strip()
    return text or None


def stated_numbers(text: str) -> list[float]:
    """Every number `text` states, in digits or in words ("forty-two", "There are 7 cubes left.")."""
    values = [float(v) for v in re.findall(r"(?<![\w.])-?\d+(?:\.\d+)?", text)]
    for token in re.findall(r"[a-z]+(?:-[a-z]+)?", text.lower()):
        parts = token.split("-")
        if all(p in _NUMBER_WORDS for p in parts) and (len(parts) == 1 or _NUMBER_WORDS[parts[0]] >= 20):
            values.append(float(sum(_NUMBER_WORDS[p] for p in parts)))
    return values


def _words(text: str) -> list[str]:
    text = _FILLER.sub("", text.strip().strip("*").strip())
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _ARTICLES]


def states_truth(answer: str | None, truth: str, options: list[str]) -> bool:
    """Whether the final `answer` states `truth` (an option text when `options`, else a number or a word)."""
    if answer is None:
        return False
    if options:
        letters = re.findall(r"(?<![A-Za-z])\(?([A-H])\)?(?![A-Za-z])", answer)
        said = " ".join(_words(answer))
        named = [i for i, text in enumerate(options) if _words(text) and " ".join(_words(text)) in said]
        right = options.index(truth)
        picked = {ord(letter) - 65 for letter in letters} | set(named)
        return picked == {right}
    if re.fullmatch(r"-?\d+(?:\.\d+)?", truth):
        return stated_numbers(answer.strip("*")) == [float(truth)]
    words, want = _words(answer), _words(truth)
    return words == want or (len(words) == len(want) and words[:-1] == want[:-1] and words[-1] == want[-1] + "s")


@dataclass(frozen=True)
class GradedPair:
    """One QA pair of a demo run graded against the scene."""

    image_sha256: str
    qa_id: str
    family: str
    question: str
    truth: str  # the scene's answer
    answer: str | None  # the model's final answer, read on its own
    right: bool  # the answer states the truth
    accepted: bool  # in an accepted split of the run's dataset
    verifier_match: bool  # the verifier accepted it

    def example(self) -> dict[str, Any]:
        return {"family": self.family, "question": self.question, "truth": self.truth, "answer": self.answer}


def grade_demo_run(output_dir: str | Path, num_images: int, seed: int) -> Iterator[GradedPair]:
    """Every QA pair of the demo run in `output_dir` (greedy answers), whose pool was drawn with `num_images` and
    `seed`, graded against the scene; `accepted` is read from the run's `_RS_think` configs."""
    import pyarrow.parquet as pq

    pool = {row["source_id"]: row for row in make_demo_rows(num_images, seed)}
    layout = OutputLayout(output_dir)
    accepted: set[tuple[str, str]] = set()  # (image_sha256, question) of every accepted pair
    data = layout.dataset / "data"
    for config in sorted(data.iterdir()):
        if config.name.endswith("_RS_think"):
            for shard in sorted(config.glob("*.parquet")):
                for row in pq.read_table(shard, columns=["image_sha256", "qa"]).to_pylist():
                    accepted.update((row["image_sha256"], qa["question"]) for qa in row["qa"])
    responses = {rec.id: rec for rec in read_records(CheckpointStore(layout.generate_work), GenerateRecord)
                 if not rec.sample}
    decisions = records_by_key(CheckpointStore(layout.verify_work), VerifyRecord)
    for table in open_prepared(output_dir).batches(["image_sha256", "qa"]):
        for row in table.to_pylist():
            for qa in row["qa"]:
                origin = pool[qa["source_row_id"]]
                options = list(qa["options"] or []) or mc_option_texts(origin["question"], origin["options"])[1]
                truth = answer_from_scene(origin["scene"], origin["question"], origin["options"])
                rec = responses[qa["id"]]
                answer = final_answer(rec.response)
                decision = decisions.get(rec.key)
                yield GradedPair(
                    image_sha256=row["image_sha256"], qa_id=qa["id"], family=origin["family"],
                    question=qa["question"], truth=truth, answer=answer, right=states_truth(answer, truth, options),
                    accepted=(row["image_sha256"], qa["question"]) in accepted,
                    verifier_match=decision.match if decision is not None else rec.match)


def check_demo_run(output_dir: str | Path, num_images: int, seed: int) -> TruthReport:
    """Check every QA pair of the demo run in `output_dir` (`grade_demo_run`): the accepted ones must state the
    scene's answer; the right answers the verifier rejected are counted with what became of them."""
    report = TruthReport()
    for pair in grade_demo_run(output_dir, num_images, seed):
        if pair.accepted:
            report.accepted += 1
            if not pair.right:
                report.wrong.append(pair.example())
        if pair.right and not pair.verifier_match:
            report.verifier_missed += 1
            if pair.accepted:
                report.recovered += 1
            else:
                report.still_rejected.append(pair.example())
    return report
