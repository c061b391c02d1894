"""What a round's fine-tuning should be trained on, on the demo: one table, each line the base fine-tuned once on
another selection of round 0's rows (or with another learning rate), every line measured on the same held-out slice
against the scene's truth.

    python bench/bench_iterate_rows.py                        # recipes/demo_iterate.yaml as it is (800 images)
    python bench/bench_iterate_rows.py --num-images 240       # a smaller pool: a quicker look (60 held-out images)
    python bench/bench_iterate_rows.py --fast                 # 24 images, 4 steps: the test's form

Round 0 is `rsgen iterate` with `iterate_rounds: 0` (the recipe's judge and explore pass, blind check off) in
`--output-dir`/round0; each line is `bench_training_value.trained_line`: the recipe's `iterate_train` (epochs, batch,
learning rate unless the line names one) from the base on the line's rows, measured by a greedy generate + verify
pass. Lines:

- accepted: the accepted greedy answers (`iterate_sft_rows: accepted`);
- explored: those plus the explore pass's right samples of the questions they missed (`explored`);
- explored, lr / 10: the same at a tenth of the learning rate;
- explored, reasoning agrees: only the rows whose reasoning's last sentence states the final answer (the verifier
  checks the final answer alone: a right answer after reasoning that says something else is a lucky one);
- accepted, answer only: the accepted answers without their reasoning (the `nothink` form), measured as every line
  is, with thinking on;
- accepted, reasoning agrees: the accepted greedy answers whose reasoning states their final answer;
- accepted, loss on prompt too: the accepted rows with the loss on the whole sequence (`completion_only_loss:
  false`; every other line has it on the completion only, TRL's default for prompt-completion rows);
- gold, accepted's questions: the control. The same questions as `accepted`, the completion being the scene's
  reasoning and answer in the demo model's own training format (`scripts/train_demo_model.py`'s
  `scene_solution`): the same rows and steps, right for the right reasons;
- gold, random questions: as many questions as `accepted` drawn at random from the whole training slice (seeded),
  answered from the scene likewise: what the same budget does with data that also covers what the base gets wrong;
- gold, random qs, lr / 10 and accepted, lr / 10: those two at a tenth of the learning rate;
- gold, every question: every question of the training slice answered from the scene, at the recipe's epochs (so
  more steps: the rows column and the steps column say how many);
- gold, random qs, long / accepted, long / explored, long / gold, accepted's qs, long: those rows trained for the
  steps `gold, every question` takes (`max_steps`), which tells the budget from the data.

If the gold lines move the held-out truth and `accepted` does not, the trainer and its budget can move this base
and the gap is in the data; if gold does not move it either, the budget or the procedure is the limit.
`--line NAME` (repeatable) runs only those lines; each line's run is kept in `--output-dir`/lineN, so a later run
of the whole table reuses it.

The row counts column says how many rows each selection holds; `reasoning agrees` is also printed for the accepted
and the sampled rows apart, which is what tells a lucky answer from a reasoned one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_training_value import RECIPE, _iterate, trained_line, write_table  # noqa: E402

GOLD_SEED = 0  # the draw of `gold, random questions`
LINES = ("accepted", "explored", "explored, lr / 10", "explored, reasoning agrees", "accepted, answer only",
         "accepted, reasoning agrees", "accepted, loss on prompt too", "gold, accepted's questions",
         "gold, random questions", "gold, random qs, lr / 10", "accepted, lr / 10", "gold, every question",
         "gold, random qs, long", "accepted, long", "explored, long", "gold, accepted's qs, long")

THINK = re.compile(r"<think>\n(.*)\n</think>\n\n(.*)", re.S)
LETTERED = re.compile(r"^([A-Z])\. (.*)$", re.M)


def completion_text(row) -> str:
    return row["completion"][0]["content"][0]["text"]


def reasoning_agrees(row) -> bool:
    """The reasoning's last sentence states the row's final answer: the same last number (digits or a number word),
    the same option (its letter, by the verifier's multiple-choice reading), or the answer's last word."""
    from rsgen.demo.truth import stated_numbers
    from rsgen.verifiers import verify_response

    found = THINK.fullmatch(completion_text(row).strip())
    if not found:
        return False
    reasoning, final = found.group(1).strip(), found.group(2).strip()
    last = re.split(r"(?<=\.)\s+", reasoning)[-1]
    question = " ".join(part["text"] or "" for part in row["prompt"][0]["content"])
    options = [text for _letter, text in LETTERED.findall(question)]
    if options:
        return verify_response("relaxed", last, final, options=options).match
    numbers = stated_numbers(final)
    if numbers:
        return stated_numbers(last)[-1:] == numbers[-1:]
    return bool(final) and final.lower().split()[-1] in last.lower()


def answer_only(row) -> dict:
    found = THINK.fullmatch(completion_text(row).strip())
    final = found.group(2).strip() if found else completion_text(row)
    return {"completion": [{"role": "assistant", "content": [{"type": "text", "text": final}]}]}


def gold_rows(round_0_dir: Path, held_out: set[str], questions: set[tuple[str, str]] | None = None,
               count: int | None = None):
    """SFT rows of the training slice whose completion is the scene's reasoning and answer, in the demo model's own
    training format (`<think>\nreasoning\n</think>\n\nanswer`, `scene_solution`): every question of the prepared
    pool (the user text byte for byte) on an image not held out; with `questions`, only those (image sha256, user
    text); with `count`, that many drawn at random (`GOLD_SEED`). Each question's scene is the pool's: its
    `source_row_id` is `seed/image index/question index`, and the pool draws an image from (seed, index) alone."""
    import random

    import datasets

    from rsgen.demo.pool import make_demo_image
    from rsgen.emit.trl_views import SFT_FEATURES, _assistant, _user
    from rsgen.schema import open_prepared

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from train_demo_model import completion_text, scene_solution

    rows = []
    for table in open_prepared(round_0_dir).batches(["image", "image_sha256", "qa"]):
        for row in table.to_pylist():
            if row["image_sha256"] in held_out:
                continue
            for qa in row["qa"]:
                if questions is not None and (row["image_sha256"], qa["question"]) not in questions:
                    continue
                seed, index, q_index = map(int, qa["source_row_id"].split("/"))
                family, _png, scene, qas = make_demo_image(seed, index)
                question, _answer, options = qas[q_index]
                reasoning, answer = scene_solution(family, scene, question, options)
                rows.append({"prompt": [_user(qa["question"])],
                             "completion": [_assistant(completion_text(reasoning, answer))],
                             "images": [row["image"]]})
    if questions is not None and len(rows) != len(questions):
        raise RuntimeError(f"gold rows: {len(rows)} of {len(questions)} questions found in the prepared pool's "
                           "training slice (image sha256 and user text should match the emitted rows')")
    if count is not None:
        rows = random.Random(GOLD_SEED).sample(rows, min(count, len(rows)))
    return datasets.Dataset.from_list(rows, features=SFT_FEATURES)


def row_question(row) -> tuple[str, str]:
    """(image sha256, user text) of a decoded-image-free SFT row's question."""
    import hashlib

    text = "".join(part["text"] or "" for part in row["prompt"][0]["content"])  # the image part has no text
    return hashlib.sha256(row["images"][0]["bytes"]).hexdigest(), text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(RECIPE))
    parser.add_argument("--output-dir", default="runs/iterate_rows")
    parser.add_argument("--num-images", type=int, default=None, help="demo pool images (default: the recipe's)")
    parser.add_argument("--fast", action="store_true", help="24 images, 4 steps per fine-tuning: the test's form")
    parser.add_argument("--line", action="append", default=None,
                        help="only this line (repeatable; the base is always printed): a quicker look at some")
    args = parser.parse_args(argv)

    unknown = sorted(set(args.line or ()) - set(LINES))
    if unknown:
        parser.error(f"--line {unknown[0]!r}: not a line of this bench ({', '.join(LINES)})")

    import datasets
    import trl

    from rsgen.config import load_recipe
    from rsgen.iterate.held_out import read_held_out
    from rsgen.iterate.report import change_text, rate_change
    from rsgen.iterate.train import sft_training_rows
    from rsgen.layout import OutputLayout

    recipe = load_recipe(args.config, {})
    if args.fast:
        args.num_images = 24
        recipe = dataclasses.replace(recipe, iterate_train={**recipe.iterate_train, "max_steps": 4})
    if args.num_images:
        recipe.sources[0].demo_num_images = args.num_images
    recipe = dataclasses.replace(recipe, iterate_rounds=0, blind_check="off",
                                 explore_samples=recipe.explore_samples or 4)
    out = Path(args.output_dir)
    started = time.perf_counter()
    round0 = _iterate(recipe, out / "round0")
    dataset = OutputLayout(out / "round0").round_dir(0) / "dataset"
    held_out = read_held_out(OutputLayout(out / "round0").held_out_images)
    accepted = sft_training_rows(dataset, held_out, "accepted")
    explored = sft_training_rows(dataset, held_out, "explored")
    agree_accepted = sum(map(reasoning_agrees, accepted))
    agree_all = sum(map(reasoning_agrees, explored))
    # TRL's default when the recipe names none (SFTConfig's field default).
    lr = recipe.iterate_train.get("learning_rate") or trl.SFTConfig.__dataclass_fields__["learning_rate"].default
    lower = dataclasses.replace(recipe, iterate_train={**recipe.iterate_train, "learning_rate": lr / 10})
    whole_sequence = dataclasses.replace(recipe, iterate_train={**recipe.iterate_train, "completion_only_loss": False})
    accepted_questions = {row_question(row) for row in accepted.cast_column(
        "images", datasets.List(datasets.Image(decode=False)))}
    round_0_dir = out / "round0"
    gold_all = gold_rows(round_0_dir, held_out)
    long_steps = recipe.iterate_train.get("max_steps") or math.ceil(len(gold_all) / recipe.iterate_train.get("per_device_train_batch_size", 8)) * math.ceil(
        recipe.iterate_train.get("num_train_epochs", 3))
    longer = dataclasses.replace(recipe, iterate_train={**recipe.iterate_train, "max_steps": long_steps})
    lines = [
        ("accepted", recipe, lambda d, h: accepted),
        ("explored", recipe, lambda d, h: explored),
        ("explored, lr / 10", lower, lambda d, h: explored),
        ("explored, reasoning agrees", recipe, lambda d, h: explored.filter(reasoning_agrees)),
        ("accepted, answer only", recipe, lambda d, h: accepted.map(answer_only)),
        ("accepted, reasoning agrees", recipe, lambda d, h: accepted.filter(reasoning_agrees)),
        ("accepted, loss on prompt too", whole_sequence, lambda d, h: accepted),
        ("gold, accepted's questions", recipe, lambda d, h: gold_rows(round_0_dir, h, accepted_questions)),
        ("gold, random questions", recipe, lambda d, h: gold_rows(round_0_dir, h, count=len(accepted))),
        ("gold, random qs, lr / 10", lower, lambda d, h: gold_rows(round_0_dir, h, count=len(accepted))),
        ("accepted, lr / 10", lower, lambda d, h: accepted),
        ("gold, every question", recipe, lambda d, h: gold_all),
        # `long`: the steps `gold, every question` takes (its rows at the recipe's epochs and batch): more steps on
        # the same rows, to tell the budget from the data.
        ("gold, random qs, long", longer, lambda d, h: gold_rows(round_0_dir, h, count=len(accepted))),
        ("accepted, long", longer, lambda d, h: accepted),
        ("explored, long", longer, lambda d, h: explored),
        ("gold, accepted's qs, long", longer, lambda d, h: gold_rows(round_0_dir, h, accepted_questions)),
    ]
    base = round0["rounds"][0]["held_out"]
    header = f"{'line':<28} {'rows':>6} {'steps':>6} {'held-out verifier':>18} {'held-out truth':>15} {'truth vs base':>14}"
    table = [header, "-" * len(header),
             f"{'base (round 0)':<28} {'-':>6} {0:>6} {base['verifier_rate']:>18.1%} {base['truth_rate']:>15.1%} "
             f"{'-':>14}"]
    assert tuple(name for name, _, _ in lines) == LINES, "LINES is the table's order"
    for i, (name, line_recipe, rows_of) in enumerate(lines):
        if args.line and name not in args.line:
            continue  # line{i} keeps its index: a later run of every line reuses what this one measured
        record = trained_line(line_recipe, out / "round0", out / f"line{i}", rows_of)
        held = record["held_out"]
        table.append(f"{name:<28} {record['training']['rows']:>6} {record['training']['steps']:>6} "
                     f"{held['verifier_rate']:>18.1%} {held['truth_rate']:>15.1%} "
                     f"{change_text(rate_change(held, base)):>14}")
    table.append(f"held out: {base['qa']} QA pairs (the same slice on every line); truth vs base in points ± se; "
                 f"learning rate {lr}")
    table.append(f"reasoning agrees with the final answer: {agree_accepted} of {len(accepted)} accepted greedy answers, "
                 f"{agree_all - agree_accepted} of {len(explored) - len(accepted)} right samples added by the explore pass")
    return write_table(out / "iterate_rows.txt", "\n".join(table), started)


if __name__ == "__main__":
    raise SystemExit(main())
