"""A byte-level BPE tokenizer trained in milliseconds on a small built-in corpus, for the tiny test models.

The corpus covers what the pipeline's tests and demo feed a model: CLEVR-Math-like counting questions, chart
and multiple-choice questions, the answer instruction, digits, reasoning tags and the judge's verdict words.
Byte-level BPE encodes any text (no unknown token), so a question outside the corpus still round-trips.
"""

from __future__ import annotations

import functools
import itertools

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

COLORS = ("gray", "red", "blue", "green", "brown", "purple", "cyan", "yellow")
SIZES = ("big", "small", "large", "tiny")
MATERIALS = ("rubber", "metal", "matte", "shiny", "metallic")
SHAPES = ("cube", "sphere", "cylinder", "cubes", "spheres", "cylinders", "things", "objects", "blocks", "balls")

_FIXED_LINES = (
    "Answer in short without any other content.",
    "How many objects are left?",
    "How many objects exist?",
    "How many things are left?",
    "Count the objects in the image.",
    "<think>\nLet me count the objects in the image step by step.\n</think>\n\n3",
    "<think>\n\n</think>\n\n7",
    "There are 4 cubes, 2 spheres and 1 cylinder, so the answer is 7.",
    "The answer is 5. Final answer: 5",
    "CORRECT", "WRONG", "UNSURE",
    "Verdict: CORRECT", "Verdict: WRONG", "Verdict: UNSURE",
    "You are a strict grader. Compare the candidate answer with the reference answer.",
    "Question: How many objects are left? Reference answer: 3 Candidate answer: 4",
    "Reply with exactly one word: CORRECT, WRONG or UNSURE.",
    "What is the value of the highest bar?",
    "Which bar has the lowest value?",
    "What is the label of the second bar?",
    "What is the difference between the largest and the smallest value?",
    "Which of the following is true? A. apples B. bananas C. cherries D. dates",
    "Options: A. 2 B. 3 C. 4 D. 5",
    "Answer with the option's letter from the given choices directly.",
    "The answer is (B).",
    "You are a helpful assistant.",
    "Describe the image. The picture shows a scene with several shapes on a table.",
    "Is there a red cube? Yes. Is there a blue sphere? No.",
    "2021 2022 2023 2024 revenue sales profit percent % share",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 25 30 40 50 100 0.5 1.5 2.25",
    "zero one two three four five six seven eight nine ten",
)


def corpus_lines() -> list[str]:
    """The training corpus: fixed lines plus CLEVR-Math-template questions over every attribute."""
    lines = list(_FIXED_LINES)
    for color, size, material, shape in itertools.product(COLORS, SIZES[:2], MATERIALS[:2], SHAPES[:3]):
        lines.append(f"Subtract all {size} {color} {shape}s. How many objects are left?")
        lines.append(f"Add 1 {material} {shape}s. How many objects exist?")
    for color, material, shape in zip(COLORS, itertools.cycle(MATERIALS), itertools.cycle(SHAPES)):
        lines.append(f"Subtract all {material} {shape}. Subtract all {color} things. How many objects are left?")
        lines.append(f"How many {color} {material} {shape} are there?")
    return lines


@functools.cache
def _train(vocab_size: int, special_tokens: tuple[str, ...]) -> str:
    # Cached as JSON (a Tokenizer is mutable; callers get a fresh copy each time).
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    return tokenizer.to_str()


def train_tokenizer(special_tokens: list[str], vocab_size: int = 420) -> Tokenizer:
    """A byte-level BPE tokenizer whose first ids are `special_tokens`, in order, then bytes and merges."""
    return Tokenizer.from_str(_train(vocab_size, tuple(special_tokens)))
