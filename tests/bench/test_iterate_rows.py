"""`bench/bench_iterate_rows.py --fast` (docs/iterate.md's table of what a round should train on, on 24 demo
images): every line fine-tuned from the base on its selection of round 0's rows and measured on one held-out slice."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from bench_helpers import run_fast_bench

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

LINES = ["base (round 0)", "accepted", "explored", "explored, lr / 10", "explored, reasoning agrees",
         "accepted, answer only", "accepted, reasoning agrees", "accepted, loss on prompt too",
         "gold, accepted's questions", "gold, random questions", "gold, random qs, lr / 10", "accepted, lr / 10",
         "gold, every question", "gold, random qs, long", "accepted, long", "explored, long",
         "gold, accepted's qs, long"]


def _row(text: str, question: str = "How many?") -> dict:
    return {"prompt": [{"role": "user", "content": [{"type": "image", "text": None},
                                                    {"type": "text", "text": question}]}],
            "completion": [{"role": "assistant", "content": [{"type": "text", "text": text}]}]}


@pytest.mark.parametrize(("text", "question", "agrees"), [
    ("<think>\nThere are 5 objects. Subtract 2: 3 left.\n</think>\n\n3", "How many?", True),
    ("<think>\nThere are 5 objects. Add 1: 6.\n</think>\n\n8", "How many?", False),
    ("<think>\nThere are 2 tiny things.\n</think>\n\ntwo", "How many?", True),
    ("<think>\nThe cyan thing is sphere. That is A.\n</think>\n\nC", "What shape?\nA. cube\nB. ball\nC. cone", False),
    ("<think>\nThe red thing is cone. That is C.\n</think>\n\nC", "What shape?\nA. cube\nB. ball\nC. cone", True),
    ("3", "How many?", False),  # no reasoning: nothing to agree
])
def test_reasoning_agrees_reads_the_last_sentence_against_the_final_answer(text, question, agrees):
    from bench_iterate_rows import reasoning_agrees

    assert reasoning_agrees(_row(text, question)) is agrees


@pytest.mark.slow  # about 4 minutes: a round 0 and sixteen fine-tunings of 4 steps, each measured
def test_the_fast_table_has_every_line_on_one_held_out_slice(tmp_path):
    out = tmp_path / "rows"
    table = run_fast_bench("bench_iterate_rows.py", out, "iterate_rows.txt")
    rows = table.splitlines()[2:-2]
    assert [row[:28].strip() for row in rows] == LINES
    assert [int(row[36:42]) for row in rows] == [0] + [4] * (len(LINES) - 1), table
    assert table.splitlines()[-2].startswith("held out: ") and "reasoning agrees with the final answer: " in table
    # docs/iterate.md quotes this command's table (at the recipe's 800 images): the same header, lines and footnotes.
    docs = (ROOT / "docs" / "iterate.md").read_text()
    assert f"\n{table.splitlines()[0]}\n" in docs
    for line in LINES + ["held out: ", "reasoning agrees with the final answer: "]:
        assert f"\n{line}" in docs, line
