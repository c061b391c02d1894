"""Train the demo VLM that ships in `rsgen/demo/model/`: a Qwen2-VL-style model of a few MB, on CPU.

    python scripts/train_demo_model.py                      # from scratch: save to rsgen/demo/model/, then evaluate
    python scripts/train_demo_model.py --init-from DIR      # continue a trained model (phase 2 only)
    python scripts/train_demo_model.py --eval-only          # evaluate the shipped model on a fresh seed

What it learns, from the procedural demo pool (`rsgen.demo.pool`, training seed TRAIN_SEED):

- to answer the pool's questions (CLEVRMath, DemoChart, DemoMC) as the pipeline asks them (question, a new
  line, the recipe's instruction; multiple choice as a lettered block answered with the letter), with a short
  reasoning trace: `<think>\\nThere are 7 objects. Subtract 2 big blue things: 5 left.\\n</think>\\n\\n5`.
  Some right answers are worded as real VLMs word them (`two`, `five bars`, `the lime`: `spoken_answer`), which
  the demo's verifier rejects and the judge has to recover. A share of the examples are rendered with
  `enable_thinking=False` and answered without reasoning.
- to judge: the judge stage's own prompt (`rsgen.judge.prompt.render_judge_prompt`, text only) answered with
  `<think>\\nSays: 7. Reference: 5. Agreed: none. WRONG.\\n</think>\\n\\nWRONG` (or `Agreed: 5. CORRECT.`, or
  UNSURE when the reference is unusable): what the candidate says in the reference's terms, the reference, the
  value both share (`judge_example`). Half of the references are drawn at random (of the right kind), so the
  judge has to read the reference instead of guessing it from the question.

Everything is built offline from a config: a byte-level BPE tokenizer trained on the pool's text, the ChatML
template of the test zoo (with `enable_thinking`), Qwen2-VL's processor without its video part (no torchvision),
images of 168 x 112 pixels = 6 x 4 image tokens, one per cell of the pool's object grid. Training is
`trl.SFTTrainer` on prompt-completion data in two phases, fixed seeds, float32, CPU:

1. from scratch, 4,000 images: image questions (loss on the answer) and judge prompts (loss on the whole
   sequence, which is how a model this small learns to copy values; see `judge_prompt_loss_collator`);
2. further images: judge prompts and image questions in alternating batches, loss on the completion only.
   After phase 1 the judge copies values but writes "Agreed: none" to equal ones too; phase 2 teaches the
   comparison. `--init-from` runs phase 2 alone on a trained model.

The shipped model is the from-scratch model of commit 7c85780 (17.0 min; it answered in the pool's forms and
judged digits only) continued three times with `--init-from` (15.8, 6.4 and 6.1 min on the idle 2-core
development machine); docs/demo.md has the commands, `rsgen_training.json` every run's arguments. The evaluation
the script prints after training (and stores in `rsgen_training.json` and the model card) is on pool seed
EVAL_SEED, which training never saw.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from rsgen.demo.pool import LETTERS, make_demo_image, mc_option_texts, solve_from_scene  # noqa: E402
from rsgen.demo.truth import stated_numbers  # noqa: E402
from rsgen.engine import demo_model_path  # noqa: E402
from rsgen.judge.calibration import number_word  # noqa: E402

TRAIN_SEED = 1  # pool seed of the training images; `rsgen demo` draws 20261202, the evaluation EVAL_SEED
EVAL_SEED = 777
INSTRUCTION = "Answer in short without any other content."  # the demo recipe's instruction
VOCAB_SIZE = 1024
IMAGE_PIXELS = 168 * 112

# ----------------------------------------------------------------------------------------------- text


def prepared_question(question: str, options: list[str]) -> tuple[str, list[str]]:
    """The user text the pipeline sends for a pool question, and the option texts in letter order.

    Multiple choice is rendered as the prepare stage normalises it: the stem, then a lettered block."""
    stem, option_texts = mc_option_texts(question, options)
    if option_texts:
        block = "\n".join(f"{LETTERS[i]}. {text}" for i, text in enumerate(option_texts))
        return f"{stem}\n{block}\n{INSTRUCTION}", option_texts
    return f"{question}\n{INSTRUCTION}", []


def vqa_examples(seed: int, num_images: int, first_image: int = 0):
    """(image PNG, user text, reasoning, final answer, family) for every QA pair of `num_images` pool images.

    The final answer is the scene's, worded as `spoken_answer` says (letters for multiple choice)."""
    for index in range(first_image, first_image + num_images):
        family, png, scene, qas = make_demo_image(seed, index)
        for question, _answer, options in qas:
            text, _option_texts = prepared_question(question, options)
            reasoning, answer = scene_solution(family, scene, question, options)
            yield png, text, reasoning, answer, family


def scene_solution(family: str, scene: dict, question: str, options: list[str]) -> tuple[str, str]:
    """(reasoning, final answer) of a pool question as the demo model is trained to give them: the scene's
    reasoning steps (`That is B.` closing a multiple-choice one), the answer worded by `spoken_answer`.
    bench/bench_iterate_rows.py trains on these too (its gold control)."""
    _stem, option_texts = mc_option_texts(question, options)
    answer, steps = solve_from_scene(scene, question, options)
    reasoning = " ".join(steps)
    if option_texts:
        letter = LETTERS[option_texts.index(answer)]
        reasoning = f"{reasoning} That is {letter}."
        answer = letter
    return reasoning, spoken_answer(family, question, answer)


def _spelled(value: int) -> str:
    """A count as a word (`two`); above twenty, the digits (the pool's numbers rarely go higher)."""
    return number_word(value) if value <= 20 else str(value)


def spoken_answer(family: str, question: str, answer: str) -> str:
    """How the demo model words a right answer: mostly as the pool does, but -- as real VLMs do -- small counts as
    words (`two`), the bar count with its noun (`five bars`) and the chart's fruit with an article (`the lime`).

    These are right answers the demo's verifier (relaxed, ChartQA-style) rejects; they are the judge's job. The
    rule depends only on the question and the answer, so greedy decoding follows it (a random share would not be
    learned: greedy picks the majority form)."""
    if family == "CLEVRMath" and int(answer) <= 2:
        return _spelled(int(answer))
    if family == "DemoChart" and question.startswith("How many bars"):
        return f"{_spelled(int(answer))} bars"
    if family == "DemoChart" and question.startswith("Which fruit"):
        return f"the {answer}"
    return answer


def _answer_vocabulary(reference: str, options: list[str]) -> list[str]:
    """Answers of the same kind as `reference`: counts, option letters, chart labels, colours, shapes..."""
    from rsgen.demo.pool import CHART_LABELS, COLORS, MATERIALS, SHAPES

    if reference.isdigit():
        return [str(v) for v in range(0, 21)]
    if len(reference) == 1 and reference in LETTERS:
        return list(LETTERS[: len(options)] if options else "ABCD")
    for vocabulary in (list(CHART_LABELS), list(COLORS), list(SHAPES), list(MATERIALS)):
        if reference in vocabulary:
            return vocabulary
    return [reference, "yes", "no"]


def wrong_candidate(rng: random.Random, reference: str, options: list[str]) -> str:
    """A plausible wrong answer of the same kind as `reference` (numbers mostly close: what a small model says)."""
    if reference.isdigit() and rng.random() < 0.8:
        value = int(reference)
        return str(rng.choice([v for v in range(max(0, value - 3), value + 4) if v != value]))
    return rng.choice([v for v in _answer_vocabulary(reference, options) if v != reference])


# Answers of no kind the pool asks for, as a confused model might give (the judge's known-wrong side has its own).
OFF_TOPIC = ("yes", "no", "I don't know", "the big cube", "left", "a small dog", "London", "green tea",
             "blue sky", "cannot tell", "maybe", "the red ball")


def _off_topic(rng: random.Random, kind: str) -> str:
    from rsgen.demo.pool import CHART_LABELS, COLORS, SHAPES

    others = {"number": [*CHART_LABELS, *COLORS, *SHAPES, "A", "B", "C"],
              "word": [*COLORS, *SHAPES, "A", "B", "C"],
              "letter": [*CHART_LABELS, "yes", "no"]}[kind]
    return rng.choice(others) if rng.random() < 0.4 else rng.choice(OFF_TOPIC)


def worded_candidate(rng: random.Random, value: str, kind: str, noun: str | None,
                     option_text: str | None) -> tuple[str, str]:
    """(candidate text, what it says in the reference's terms) for the answer `value` in a random wording.

    Numbers: digits, a number word, with the counted noun, in a sentence (what it says: the digits). Words: bare,
    with an article, plural, in a sentence (what it says: the word). Option letters: the letter, or the option's text
    bare, with an article or in a sentence (what it says: the letter, or the option's text)."""
    roll = rng.random()
    if kind == "number":
        word = _spelled(int(value))
        # Digits inside a sentence most often: the hardest form to read (the reference's digits are close by).
        spelled = value if rng.random() < 0.7 else word
        forms = [word, f"The answer is {spelled}.", f"I count {spelled}.", f"{spelled}."]
        if noun:
            forms += [f"{spelled} {noun}", f"There are {spelled} {noun}.", f"{spelled} {noun} are left."] * 2
        return (value if roll < 0.1 else rng.choice(forms)), value
    if kind == "word":
        article = "an" if value[0] in "aeiou" else "a"
        forms = [f"{article} {value}", f"the {value}", f"{value}s", f"The answer is {value}.", f"It is the {value}.",
                 f"{value.capitalize()}."]
        return (value if roll < 0.25 else rng.choice(forms)), value
    if roll < 0.3 or not option_text:
        return value, value
    forms = [option_text, f"the {option_text}", f"It is the {option_text}.", f"The answer is {option_text}."]
    return rng.choice(forms), option_text


def judge_example(rng: random.Random, question: str, answer: str) -> tuple[str, str, str]:
    """(judge user text, reasoning, verdict) for one prepared pool question whose (scene) answer is `answer`.

    Half of the time the reference is not the question's answer but any answer of its kind: the judge sees no
    image, and this way it cannot guess the reference from the question; it has to read it (and never solve the
    question itself, as its prompt says). The candidate is the reference or a wrong value of its kind, in any
    wording (`worded_candidate`), or an off-topic answer. The reasoning first writes what the candidate says in
    the reference's terms ("Says: 9" for "There are nine cubes.", the option's text for a letter reference), then
    the reference, then the value both share:

        Says: 9. Reference: 10. Agreed: none. WRONG.
        Says: cube. Reference: B = cube. Agreed: cube. CORRECT.

    "Says" comes first: written after the reference, it copied the reference's digits instead of the candidate's
    ("There are 4 objects." read as 3 against a reference of 3); at equal training the judge said WRONG to 38 of 60
    of the demo's known-wrong CLEVRMath pairs with the reference first and 45 with "Says" first (measured).
    """
    from rsgen.judge.calibration import counted_noun
    from rsgen.judge.prompt import render_judge_prompt

    stem_and_block = question.rsplit("\n", 1)[0]
    options = [line[3:] for line in stem_and_block.split("\n")[1:] if line[1:3] == ". "]
    answer = answer if options else _plain(answer)
    reference = answer if rng.random() < 0.5 else rng.choice(_answer_vocabulary(answer, options))
    kind = "letter" if options else "number" if reference.isdigit() else "word"
    roll = rng.random()
    if roll < 0.06:
        # UNSURE is for references that cannot be graded against.
        bad_reference = rng.choice(["", "N/A", "?", "unknown", "-"])
        prompt = render_judge_prompt(question, bad_reference, reference)
        return prompt, f"Reference: {bad_reference or 'empty'}. UNSURE.", "UNSURE"
    text_of = {LETTERS[i]: t for i, t in enumerate(options)}
    if roll < 0.53:
        value = reference
    else:
        value = wrong_candidate(rng, reference, options)
    if roll >= 0.53 and rng.random() < 0.15:
        candidate = _off_topic(rng, kind)
        says = candidate if kind != "number" else "none"
    else:
        candidate, says = worded_candidate(rng, value, kind, counted_noun(question), text_of.get(value))
    shown = f"{reference} = {text_of[reference]}" if kind == "letter" else reference
    agreed = says if says in (reference, text_of.get(reference)) else "none"
    verdict = "CORRECT" if agreed != "none" else "WRONG"
    prompt = render_judge_prompt(question, reference, candidate)
    # "Says" turns the candidate into the reference's terms (a digit for a number word, the option's text); "Agreed"
    # then writes the value both sides share, or "none". Tried first (round 1): the verdict straight after the two
    # values, which needs a learned equality test; at this size it stayed at chance for 1,000+ steps. Writing the
    # shared value only needs copying steps (a value copied from both sides outscores "none", one copied from one
    # side does not), and the verdict then follows from "none" or not.
    return prompt, f"Says: {says}. Reference: {shown}. Agreed: {agreed}. {verdict}.", verdict


def _plain(answer: str) -> str:
    """The pool's own form of a spoken answer (`two` -> 2, `five bars` -> 5, `the lime` -> lime)."""
    numbers = stated_numbers(answer)
    return str(int(numbers[0])) if numbers else answer.removeprefix("the ")


def completion_text(reasoning: str | None, answer: str) -> str:
    return answer if reasoning is None else f"<think>\n{reasoning}\n</think>\n\n{answer}"


# ----------------------------------------------------------------------------------------------- model


def build_tokenizer(corpus: list[str]):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from rsgen.testing.zoo import QWEN_SPECIAL_TOKENS, REASONING_TOKENS

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus, trainer=trainer)
    # Reasoning tags are added tokens but not special ones (as in Qwen3): they survive skip_special_tokens.
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in REASONING_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        clean_up_tokenization_spaces=False,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )


def build_model(tokenizer, size: dict):
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    from rsgen.testing.zoo import _qwen_processor, _qwen_vision_ids

    half = size["hidden"] // size["heads"] // 2
    # Temporal, height and width rotary sections (Qwen2-VL's 1/4, 3/8, 3/8 split); they sum to half a head.
    mrope_section = [half // 4, (half - half // 4) // 2, half - half // 4 - (half - half // 4) // 2]
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=size["hidden"],
            intermediate_size=size["intermediate"],
            num_hidden_layers=size["layers"],
            num_attention_heads=size["heads"],
            num_key_value_heads=size["kv_heads"],
            max_position_embeddings=1024,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": mrope_section},
        ),
        vision_config=dict(
            depth=size["vision_depth"],
            embed_dim=size["vision_hidden"],
            hidden_size=size["hidden"],
            num_heads=size["vision_heads"],
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        tie_word_embeddings=True,
        **_qwen_vision_ids(tokenizer),
    )
    torch.manual_seed(0)
    model = Qwen2VLForConditionalGeneration(config)
    # The patch embedding stays at its (seeded) random initialisation: a random projection of 14 x 14 patches
    # keeps what the tower needs, and skipping its gradient saves a tenth of every training step on CPU.
    model.model.visual.patch_embed.requires_grad_(False)
    processor = _qwen_processor("Qwen2VLProcessor", tokenizer, patch_size=14, pixels=IMAGE_PIXELS)
    generation_config = model.generation_config
    generation_config.eos_token_id = [
        tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")
    ]
    generation_config.pad_token_id = tokenizer.pad_token_id
    generation_config.do_sample = False
    return model, processor


# ----------------------------------------------------------------------------------------------- data


def vqa_row(png: bytes, text: str, content: str, thinking: bool) -> dict:
    """One image question as a conversational prompt-completion SFT row."""
    import io

    from PIL import Image as PILImage

    return {
        "prompt": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": content}]}],
        "images": [PILImage.open(io.BytesIO(png)).convert("RGB")],
        "chat_template_kwargs": {"enable_thinking": thinking},
    }


def judge_row(prompt: str, content: str) -> dict:
    """One judge prompt (text only, thinking on, as the judge stage sends it) as an SFT row."""
    return {
        "prompt": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
        "completion": [{"role": "assistant", "content": [{"type": "text", "text": content}]}],
        "images": [],
        "chat_template_kwargs": {"enable_thinking": True},
    }


def training_examples(
    num_images: int, judge_share: float, nothink_share: float, batch_size: int, seed: int = TRAIN_SEED
):
    """Phase 1 SFT rows (prompt-completion, conversational) in training order, and the tokenizer corpus.

    Deterministic for `seed`. Image questions and (longer, text-only) judge prompts go to separate batches, so a
    batch is padded to similar lengths; the batches are shuffled, then trained in this order."""
    rng = random.Random(f"rsgen-demo-train:{seed}")
    vqa_rows, judge_rows, corpus = [], [], []
    for png, text, reasoning, answer, _family in vqa_examples(seed, num_images):
        thinking = rng.random() >= nothink_share
        content = completion_text(reasoning, answer) if thinking else completion_text("", answer)
        vqa_rows.append(vqa_row(png, text, content, thinking))
        corpus += [text, content]
        if rng.random() < judge_share:
            prompt, judge_reasoning, verdict = judge_example(rng, text, answer)
            judge_content = completion_text(judge_reasoning, verdict)
            judge_rows.append(judge_row(prompt, judge_content))
            corpus += [prompt, judge_content]
    batches = []
    for rows in (vqa_rows, judge_rows):
        rng.shuffle(rows)
        batches += [rows[i : i + batch_size] for i in range(0, len(rows), batch_size)]
    rng.shuffle(batches)
    return [row for batch in batches for row in batch], corpus


# Judge prompts per question in phase 2, by the kind of its answer: a number's candidates come in many wordings, and
# chart labels are few in the pool (1 question in 20) but worded in as many ways.
JUDGE_PROMPTS_PER_QUESTION = {"number": 2, "word": 6, "letter": 1}


def judge_phase_examples(
    first_image: int, num_images: int, nothink_share: float, batch_size: int, seed: int = TRAIN_SEED
):
    """Phase 2 SFT rows: every question of pool images [first_image, first_image + num_images) once as an image
    question and `JUDGE_PROMPTS_PER_QUESTION` times as a judge prompt, in alternating batches (image questions
    repeat when judge prompts outnumber them).

    The images follow phase 1's (the pool is a stream per image), so phase 2 sees new scenes. Alternating keeps
    the answers: judge batches alone took the demo accept rate from 34% to 5% in 200 steps (measured)."""
    rng = random.Random(f"rsgen-demo-judge-phase:{seed}:{first_image}")
    vqa_rows, judge_rows = [], []
    for png, text, reasoning, answer, _family in vqa_examples(seed, num_images, first_image):
        # Thinking off as in phase 1: without it, answers with thinking off drifted to start with a new line.
        thinking = rng.random() >= nothink_share
        content = completion_text(reasoning, answer) if thinking else completion_text("", answer)
        vqa_rows.append(vqa_row(png, text, content, thinking))
        kind = "letter" if "\nA. " in text else "number" if _plain(answer).isdigit() else "word"
        for _ in range(JUDGE_PROMPTS_PER_QUESTION[kind]):
            prompt, judge_reasoning, verdict = judge_example(rng, text, answer)
            judge_rows.append(judge_row(prompt, completion_text(judge_reasoning, verdict)))
    rng.shuffle(vqa_rows)
    rng.shuffle(judge_rows)
    rows, cycled = [], vqa_rows + vqa_rows
    for i in range(0, len(judge_rows), batch_size):
        j = i % len(vqa_rows)
        rows += judge_rows[i : i + batch_size] + cycled[j : j + batch_size]
    return rows


# ----------------------------------------------------------------------------------------------- training

SIZES = {
    # text width/depth, vision width/depth: ~2.3 M parameters, 9 MB in float32.
    "demo": dict(
        hidden=192,
        intermediate=512,
        layers=4,
        heads=6,
        kv_heads=2,
        vision_hidden=96,
        vision_depth=3,
        vision_heads=3,
    ),  # fmt: skip
    "small": dict(
        hidden=128,
        intermediate=384,
        layers=4,
        heads=4,
        kv_heads=2,
        vision_hidden=64,
        vision_depth=2,
        vision_heads=2,
    ),  # fmt: skip
}


def judge_prompt_loss_collator(processor):
    """TRL's vision collator, with the loss on the whole sequence for judge batches (completion only otherwise).

    Batches hold either image questions or judge prompts (see `training_examples`). On judge prompts the loss
    covers the prompt too: with the completion alone, the judge learned neither to copy the values nor the
    verdict within 400 steps from scratch, with the prompt it did within 200 (measured). On image questions the
    loss stays on the answer: modelling the questions as well halved the demo accept rate (18% against 32%).
    """
    from trl.trainer.sft_trainer import DataCollatorForVisionLanguageModeling

    class JudgePromptLossCollator(DataCollatorForVisionLanguageModeling):
        def torch_call(self, examples):
            self.completion_only_loss = any(example["images"] for example in examples)
            return super().torch_call(examples)

    return JudgePromptLossCollator(processor, completion_only_loss=True)


def sft_config(work: Path, batch_size: int, **schedule):
    """The settings both phases share: float32 on CPU, fixed seeds, rows trained in the order given."""
    from trl import SFTConfig

    return SFTConfig(
        output_dir=str(work),
        per_device_train_batch_size=batch_size,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=25,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,  # TRL's default; bfloat16 autocast on this CPU was 8x slower per step (measured)
        fp16=False,
        seed=0,
        data_seed=0,
        train_sampling_strategy="sequential",  # the rows come in batches of like length (training_examples)
        remove_unused_columns=False,  # keeps `chat_template_kwargs` (thinking on/off per row)
        dataloader_num_workers=0,
        max_length=None,
        completion_only_loss=True,
        disable_tqdm=True,
        **schedule,
    )


def train(args) -> Path:
    """Phase 1 learns everything from scratch; phase 2 makes the judge compare (see `judge_example`)."""
    from datasets import Dataset
    from trl import SFTTrainer

    started = time.perf_counter()
    work = Path(args.output).with_name(Path(args.output).name + ".trainer")
    if args.init_from:
        # Continue from a trained model (its tokenizer and weights): phase 2 only, on images phase 1 did not see.
        from rsgen.engine.models import load_model_and_processor

        model, processor = load_model_and_processor(args.init_from)
        model.train()
        rows = []
        print(f"phase 1 skipped: continuing from {args.init_from}", flush=True)
    else:
        rows, corpus = training_examples(args.num_images, args.judge_share, args.nothink_share, args.batch_size)
        tokenizer = build_tokenizer(corpus)
        model, processor = build_model(tokenizer, SIZES[args.size])
        print(f"phase 1: {len(rows)} training rows from {args.num_images} images", flush=True)
        phase1 = sft_config(work, args.batch_size, num_train_epochs=args.epochs, learning_rate=args.lr,
                            lr_scheduler_type="cosine", warmup_steps=args.warmup_steps,
                            max_steps=args.max_steps)  # fmt: skip
        SFTTrainer(
            model=model,
            args=phase1,
            train_dataset=Dataset.from_list(rows),
            processing_class=processor,
            data_collator=judge_prompt_loss_collator(processor),
        ).train()
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{n_params / 1e6:.2f} M parameters", flush=True)
    phase1_seconds = time.perf_counter() - started

    # Phase 2: after phase 1 the judge copies both values but writes "Agreed: none" to equal ones as well; a short
    # phase with the loss on the judge's completion only (and image questions in between) teaches the comparison.
    judge_rows = judge_phase_examples(
        args.num_images, args.judge_phase_images, args.nothink_share, args.batch_size
    )
    print(f"phase 2: {len(judge_rows)} rows from {args.judge_phase_images} further images", flush=True)
    phase2 = sft_config(work, args.batch_size, num_train_epochs=1, learning_rate=args.judge_phase_lr,
                        lr_scheduler_type="constant_with_warmup", warmup_steps=20)  # fmt: skip
    SFTTrainer(
        model=model, args=phase2, train_dataset=Dataset.from_list(judge_rows), processing_class=processor
    ).train()
    train_seconds = time.perf_counter() - started
    num_rows = len(rows) + len(judge_rows)
    save_model(model, processor, Path(args.output), train_seconds, args, num_rows, n_params)
    shutil.rmtree(work, ignore_errors=True)
    print(
        f"trained in {train_seconds / 60:.1f} min (phase 1 {phase1_seconds / 60:.1f}); saved to {args.output}",
        flush=True,
    )
    return Path(args.output)


def save_model(
    model, processor, output: Path, train_seconds: float, args, num_rows: int, n_params: int
) -> None:
    # A continued model keeps the record of the one it started from, and its processor files as they were (loading
    # for generation sets left padding); both are read before `output` may replace that model.
    previous, processor_files = None, {}
    if args.init_from:
        previous = json.loads((Path(args.init_from) / TRAINING_RECORD).read_text())
        processor_files = {path.name: path.read_bytes() for path in Path(args.init_from).iterdir()
                           if path.name not in MODEL_FILES}
    if output.exists():
        shutil.rmtree(output)
    output.mkdir(parents=True)
    model.eval()
    model.config.dtype = torch.float32
    model.save_pretrained(output)
    if processor_files:
        for name, data in processor_files.items():
            (output / name).write_bytes(data)
    else:
        processor.save_pretrained(output)
    (output / TRAINING_RECORD).write_text(
        json.dumps(
            {
                "script": "scripts/train_demo_model.py",
                "arguments": {k: v for k, v in vars(args).items() if k not in ("output", "eval_only")},
                "train_seed": TRAIN_SEED,
                "training_rows": num_rows,
                "parameters": n_params,
                "train_minutes": round(train_seconds / 60, 1),
                "torch_threads": torch.get_num_threads(),
                # The judge prompt the model learned; tests/demo checks it is still the shipped one.
                "judge_template_sha256": judge_template_sha256(),
                **({"continued_from": previous} if previous else {}),
            },
            indent=1,
        )
        + "\n"
    )


TRAINING_RECORD = "rsgen_training.json"
# What training writes; a continued model copies every other file (tokenizer, chat template, processor) unchanged.
MODEL_FILES = {"model.safetensors", "config.json", "generation_config.json", "README.md", TRAINING_RECORD}


def training_chain(record: dict) -> list[dict]:
    """The training runs behind a model, first to last (a run with --init-from continues the one before)."""
    chain = [record]
    while "continued_from" in chain[0]:
        chain.insert(0, chain[0]["continued_from"])
    return chain


def judge_template_sha256() -> str:
    import hashlib

    from rsgen.judge.prompt import load_template

    return hashlib.sha256(load_template().encode()).hexdigest()


MODEL_CARD = """---
library_name: transformers
pipeline_tag: image-text-to-text
tags: [rsgen, demo, toy]
---
# rsgen demo VLM

A **toy** vision-language model ({params:.1f} M parameters, Qwen2-VL architecture) that ships inside the `rsgen`
package so that `rsgen demo` runs end to end, offline, on a CPU in a few minutes.

**What it is.** Trained by `scripts/train_demo_model.py` on CPU from scratch{continued}: {minutes:.0f} min on a
2-core machine, {rows} rows drawn from rsgen's procedural demo pool (pool seed {seed}); every run's arguments are in
`rsgen_training.json`. It learned to

- answer the demo pool's questions (CLEVR-Math-like counting and subtraction, bar charts, multiple choice with
  lettered options) at 168 x 112 pixels, with a short reasoning trace: `<think>...</think>` then the answer;
  `enable_thinking=False` in the chat template makes it answer without the trace;
- grade answers as rsgen's judge stage asks (question, reference, candidate -> `CORRECT` / `WRONG` / `UNSURE`),
  reasoning `Says: 3. Reference: 5. Agreed: none.` before the verdict (`Says` is the candidate in the reference's
  terms: `3` for `There are three cubes.`).

Measured on {qa} questions of {eval_images} images of a pool seed it never saw ({eval_seed}), greedy, thinking on:

| | |
|---|---|
| verifier accept rate | {accept:.1%} (CLEVRMath {clevr:.1%}, DemoChart {chart:.1%}, DemoMC {mc:.1%}) |
| right answers in words the verifier rejects (`two`, `five bars`, `the lime`) | {right} |
| judge says CORRECT to verifier-accepted answers | {judge_ok:.1%} |
| judge says CORRECT to right answers the verifier rejected | {judge_recall:.1%} |
| judge says WRONG to wrong answers the verifier leaves to it (not a decisive mismatch) | {judge_wrong:.1%} |

It gets many demo questions right and many wrong, which is the point: its answers split into accepted and
rejected. Some right answers are worded as real VLMs word them -- small counts as words, the bar count with its
noun, the fruit with an article -- which the demo's verifier rejects and its judge is there to recover.

**What it is not.** It is not a general VLM and knows nothing beyond the demo pool's drawings and templates; its
tokenizer was trained on that text only. Do not use it for anything but trying rsgen.

Config: {size}. Tokenizer: byte-level BPE, {vocab} tokens. Chat template: ChatML with `enable_thinking`.
"""


# `--base`: phase 1 on a quarter of the images (1,000 instead of 4,000) and a short phase 2 (200 images instead of
# 1,200): a model that answers some demo questions and misses many, with room to learn from rsgen's data
# (`rsgen iterate --config recipes/demo_iterate.yaml`).
BASE_ARGUMENTS = {"num_images": 1000, "judge_phase_images": 200, "eval_images": 100,
                  "output": str(demo_model_path().with_name("base_model"))}
BASE_NOTE = """
**The base.** This is `rsgen-demo-base`, the demo model's training stopped early (`--base`: phase 1 on 1,000
images instead of 4,000, phase 2 on 200 instead of 1,200), shipped beside the demo model so that
`rsgen iterate --config recipes/demo_iterate.yaml` has a model with room to learn. Its judge says CORRECT to
nearly everything: rsgen's leniency gate withholds its promotions.
"""


def write_model_card(output: Path, record: dict) -> None:
    """The model card, from the training record and its evaluation (the numbers are measured, not typed)."""
    evaluation, families = record["evaluation"], record["evaluation"]["accept_rate_per_family"]
    nan = float("nan")  # a family absent from a small evaluation
    chain = training_chain(record)
    continues = len(chain) - 1
    (output / "README.md").write_text(MODEL_CARD.format(
        continued=f" and continued {('once', 'twice')[continues - 1] if continues < 3 else f'{continues} times'}"
                  " (`--init-from`)" if continues else "",
        params=record["parameters"] / 1e6, minutes=sum(run["train_minutes"] for run in chain),
        rows=sum(run["training_rows"] for run in chain),
        seed=record["train_seed"], qa=evaluation["qa"], eval_images=evaluation["images"],
        eval_seed=evaluation["seed"], accept=evaluation["accept_rate"], clevr=families.get("CLEVRMath", nan),
        chart=families.get("DemoChart", nan), mc=families.get("DemoMC", nan),
        judge_ok=evaluation["judge_correct_on_accepted"], judge_wrong=evaluation["judge_wrong_on_wrong_undecided"],
        right=evaluation["right_but_rejected"], judge_recall=evaluation["judge_correct_on_right_rejected"],
        size=json.dumps(SIZES[record["arguments"]["size"]]), vocab=VOCAB_SIZE,
    ).replace("# rsgen demo VLM\n", "# rsgen demo VLM: the base\n" + BASE_NOTE if record["arguments"].get("base")
              else "# rsgen demo VLM\n"))  # fmt: skip


# ----------------------------------------------------------------------------------------------- evaluation


def evaluate(model_dir: Path, seed: int, num_images: int, max_new_tokens: int = 96) -> dict:
    """Accept rate per family (greedy, thinking on) and judge agreement, on a pool seed the model never saw."""
    from collections import Counter

    from rsgen.config import load_recipe
    from rsgen.demo.truth import final_answer, states_truth
    from rsgen.demo_command import RECIPE
    from rsgen.engine import ChatRequest
    from rsgen.engine.models import load_model_and_processor
    from rsgen.engine.transformers_engine import TransformersEngine
    from rsgen.judge.prompt import render_judge_prompt
    from rsgen.judge.verdict import parse_verdict
    from rsgen.verifiers import verify_response
    from rsgen.verifiers.decisive import decisive_mismatch

    recipe = load_recipe(RECIPE)
    model, processor = load_model_and_processor(str(model_dir))
    engine = TransformersEngine(model, processor, max_new_tokens=max_new_tokens, temperature=0.0, token_budget=16384,
                              max_batch_size=128, chat_template_kwargs={"enable_thinking": True})  # fmt: skip
    items, requests = {}, []
    for index in range(num_images):
        family, png, scene, qas = make_demo_image(seed, index)
        for q_index, (question, _answer, options) in enumerate(qas):
            text, option_texts = prepared_question(question, options)
            truth = solve_from_scene(scene, question, options)[0]
            answer = LETTERS[option_texts.index(truth)] if option_texts else truth
            key = f"{index}/{q_index}"
            items[key] = dict(family=family, text=text, answer=answer, truth=truth, options=option_texts)
            messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
            requests.append(ChatRequest(key, messages, [png]))
    started = time.perf_counter()
    totals, accepted = Counter(), Counter()
    for request, result in engine.generate(requests):
        item = items[request.key]
        verifier = recipe.verifier_for(item["family"])  # as `rsgen demo` verifies
        options = item["options"] or None
        decision = verify_response(verifier, result.text, item["answer"], options=options)
        right = states_truth(final_answer(result.text), item["truth"], item["options"])
        decisive = decisive_mismatch(verifier, decision.extracted, [item["answer"]], options=options)
        # Which side of the judge's job the item is on: accepted (agree), right but rejected (recover), wrong and
        # left to the judge (reject); decisive mismatches never reach the judge under `judge_scope: undecided`.
        side = "accepted" if decision.match else "decisive" if decisive else "right" if right else "wrong"
        item.update(response=result.text, match=decision.match, extracted=decision.extracted, side=side)
        totals[item["family"]] += 1
        accepted[item["family"]] += decision.match
    generate_seconds = time.perf_counter() - started

    judge_requests = []
    for key, item in items.items():
        candidate = item["extracted"] if item["extracted"] is not None else ""
        prompt = render_judge_prompt(item["text"], item["answer"], candidate)
        judge_requests.append(
            ChatRequest(key, [{"role": "user", "content": [{"type": "text", "text": prompt}]}], [])
        )
    engine.max_new_tokens = recipe.judge_max_new_tokens
    started = time.perf_counter()
    verdicts = Counter()
    for request, result in engine.generate(judge_requests):
        item = items[request.key]
        item["verdict"] = parse_verdict(result.text, result.hit_limit)
        verdicts[(item["side"], item["verdict"])] += 1
    judge_seconds = time.perf_counter() - started
    sides = Counter(item["side"] for item in items.values())
    n_acc = sum(accepted.values())

    def share(side: str, verdict: str) -> float:
        return verdicts[(side, verdict)] / max(1, sides[side])

    report = {
        "seed": seed,
        "images": num_images,
        "qa": sum(totals.values()),
        "accept_rate": n_acc / max(1, sum(totals.values())),
        "accept_rate_per_family": {f: accepted[f] / totals[f] for f in sorted(totals)},
        "right_but_rejected": sides["right"],
        "judge_correct_on_accepted": share("accepted", "CORRECT"),
        "judge_correct_on_right_rejected": share("right", "CORRECT"),
        "judge_wrong_on_wrong_undecided": share("wrong", "WRONG"),
        "judge_verdicts": {f"{k[0]}:{k[1]}": v for k, v in sorted(verdicts.items())},
        "generate_seconds": round(generate_seconds, 1),
        "judge_seconds": round(judge_seconds, 1),
        "examples": [
            {k: items[key][k] for k in ("family", "text", "answer", "response", "match", "side", "verdict")}
            for key in list(items)[:12]
        ],
    }
    return report


def show_record(model_dir: Path) -> str:
    """The figures docs/demo.md quotes about a shipped model, from the record its training runs wrote
    (`rsgen_training.json`): each run's minutes and rows, and the last evaluation. No model is loaded."""
    record = json.loads((model_dir / TRAINING_RECORD).read_text())
    chain = training_chain(record)
    lines = [f"{model_dir.name}: {record['parameters'] / 1e6:.1f} M parameters, {len(chain)} training run(s)"]
    for i, run in enumerate(chain):
        how = "continued (--init-from)" if run["arguments"].get("init_from") else "from scratch"
        lines.append(f"run {i + 1}: {how}, {run['train_minutes']} min, {run['training_rows']:,} training rows")
    e = record["evaluation"]
    lines.append(f"evaluation (pool seed {e['seed']}, {e['images']} images, {e['qa']} QA pairs): verifier accept rate "
                 f"{e['accept_rate']:.1%}; {e['right_but_rejected']} right answers the verifier rejects; the judge "
                 f"says CORRECT to {e['judge_correct_on_accepted']:.0%} of the accepted and "
                 f"{e['judge_correct_on_right_rejected']:.0%} of those, WRONG to "
                 f"{e['judge_wrong_on_wrong_undecided']:.0%} of the wrong answers left to it")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default=str(demo_model_path()))
    parser.add_argument("--size", default="small", choices=sorted(SIZES))
    parser.add_argument("--num-images", type=int, default=4000)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup-steps", type=int, default=50)
    parser.add_argument("--judge-share", type=float, default=0.5)
    parser.add_argument(
        "--judge-phase-images", type=int, default=1200, help="images of phase 2 (judge phase)"
    )
    parser.add_argument("--judge-phase-lr", type=float, default=1e-3, help="learning rate of phase 2")
    parser.add_argument("--nothink-share", type=float, default=0.1)
    parser.add_argument("--init-from", default=None,
                        help="a trained demo model to continue from: skips phase 1 (phase 2 on images after "
                             "--num-images)")
    # Default: two threads on an idle machine, one when other jobs are running (two oversubscribed threads were
    # 4x slower per step than one on the shared development machine).
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--eval-only", action="store_true")
    parser.add_argument("--show", action="store_true",
                        help="print the figures of --output's training record (docs/demo.md's), load nothing")
    parser.add_argument("--eval-images", type=int, default=150)
    parser.add_argument("--eval-seed", type=int, default=EVAL_SEED)
    parser.add_argument("--base", action="store_true",
                        help="the demo model's base (`rsgen-demo-base`, rsgen/demo/base_model/): the same training "
                             f"stopped early: {BASE_ARGUMENTS}")
    args = parser.parse_args(argv)
    if args.base:
        for key, value in BASE_ARGUMENTS.items():
            setattr(args, key, value)
    if args.show:
        print(show_record(Path(args.output)))
        return 0
    threads = args.threads or (2 if os.getloadavg()[0] < 1.0 else 1)
    torch.set_num_threads(threads)
    print(f"torch threads: {threads}", flush=True)
    output = Path(args.output) if args.eval_only else train(args)
    report = evaluate(output, args.eval_seed, args.eval_images)
    print(json.dumps(report, indent=1), flush=True)
    record_path = output / TRAINING_RECORD
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        record["evaluation"] = {k: v for k, v in report.items() if k != "examples"}
        record_path.write_text(json.dumps(record, indent=1) + "\n")
        write_model_card(output, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
