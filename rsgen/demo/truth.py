"""The demo's outside truth: every accepted QA pair of a demo run checked against the scene the pool drew.

The demo pool knows every answer (`rsgen.demo.pool.answer_from_scene`), so a demo run can be graded without
trusting the verifier, the judge or the stored reference: the pool is drawn again from its seed, each accepted pair
is traced back to its pool row (emitted question -> prepared QA -> `source_row_id`), the answer is recomputed from
the scene, and the model's final answer (extracted from the accepted response) must state it exactly: the same
number (no tolerance), the same text after normalisation, or, for multiple choice, the letter of the right option.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rsgen.demo.pool import LETTERS, answer_from_scene, make_demo_rows, mc_option_texts
from rsgen.layout import OutputLayout
from rsgen.schema import open_prepared
from rsgen.verify import extract_answer
from rsgen.verify.mc import option_letter
from rsgen.verify.normalize import text_info


@dataclass
class TruthReport:
    accepted: int = 0
    wrong: list[dict[str, Any]] = field(default_factory=list)  # question, truth, answer, family

    @property
    def wrong_rate(self) -> float:
        return len(self.wrong) / self.accepted if self.accepted else 0.0

    def line(self) -> str:
        return (f"truth check: {len(self.wrong)} of {self.accepted} accepted QA pairs contradict the scene the pool "
                f"drew ({self.wrong_rate:.1%})")


def states_truth(answer: str | None, truth: str, options: list[str]) -> bool:
    """Whether the final `answer` states `truth` (an option text when `options`, else a number or a word)."""
    if answer is None:
        return False
    if options:
        letter, _ = option_letter(answer, options)
        return letter is not None and letter == LETTERS[options.index(truth)]
    got_text, got_number, _ = text_info(answer)
    want_text, want_number, _ = text_info(truth)
    if want_number is not None:
        return got_number is not None and got_number.value == want_number.value
    return got_text == want_text


def check_demo_run(output_dir: str | Path, num_images: int, seed: int) -> TruthReport:
    """Check every accepted QA pair (the `_RS_think` configs) of the demo run in `output_dir`, whose pool was
    drawn with `num_images` and `seed`."""
    import pyarrow.parquet as pq

    pool = {row["source_id"]: row for row in make_demo_rows(num_images, seed)}
    prepared: dict[tuple[str, str], dict[str, Any]] = {}
    for table in open_prepared(output_dir).batches(["image_sha256", "qa"]):
        for row in table.to_pylist():
            for qa in row["qa"]:
                prepared[(row["image_sha256"], qa["question"])] = qa
    report = TruthReport()
    data = OutputLayout(output_dir).dataset / "data"
    for config in sorted(data.iterdir()):
        if not config.name.endswith("_RS_think"):
            continue
        for shard in sorted(config.glob("*.parquet")):
            for row in pq.read_table(shard, columns=["image_sha256", "qa"]).to_pylist():
                for qa in row["qa"]:
                    source = prepared[(row["image_sha256"], qa["question"])]
                    origin = pool[source["source_row_id"]]
                    options = source["options"] or mc_option_texts(origin["question"], origin["options"])[1]
                    truth = answer_from_scene(origin["scene"], origin["question"], origin["options"])
                    answer = extract_answer(qa["response"]).answer
                    report.accepted += 1
                    if not states_truth(answer, truth, options):
                        report.wrong.append({"family": origin["family"], "question": qa["question"],
                                             "truth": truth, "answer": answer})
    return report
