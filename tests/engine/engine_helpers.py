"""Helpers for the engine tests: varied chat requests, the naive one-request-at-a-time reference, and model
wrappers for tests that are about the engine's control flow (named for what they fake)."""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from rsgen.engine import ChatRequest
from rsgen.engine.transformers_engine import decode_image

QUESTIONS = [
    "How many cubes are there?",
    "Subtract all big blue things. Subtract all large rubber objects. How many objects are left?",
    "What color is the sphere?\nAnswer in short without any other content.",
    "Is the cylinder left of the cube? Options: yes, no. Answer with the letter.",
    "Add 1 matte objects. How many objects exist? Think step by step, then answer in one word.",
]
SIZES = [(168, 112), (64, 64), (90, 200), (300, 80), (40, 40)]


def png_bytes(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def image_requests(n: int, seed: int = 0, sizes=SIZES) -> list[ChatRequest]:
    """`n` single-image requests with questions and image sizes of varied length; images as PNG bytes."""
    out = []
    for i in range(n):
        w, h = sizes[i % len(sizes)]
        question = QUESTIONS[(i * 3 + seed) % len(QUESTIONS)] + " Be brief." * (i % 4)
        messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]
        out.append(ChatRequest(f"q{i:03d}", messages, [png_bytes(w, h, seed * 1000 + i)]))
    return out


def text_requests(n: int) -> list[ChatRequest]:
    return [
        ChatRequest(f"t{i:03d}", [{"role": "user", "content": [{"type": "text", "text": QUESTIONS[i % 5] * (1 + i % 3)}]}], [])
        for i in range(n)
    ]


def eos_ids(model) -> list[int]:
    eos = model.generation_config.eos_token_id
    return [eos] if isinstance(eos, int) else list(eos)


def naive_generate(model, processor, request: ChatRequest, max_new_tokens: int, chat_template_kwargs=None) -> dict:
    """What most users write: one `apply_chat_template(tokenize=True)` + `model.generate` per question, greedy."""
    images = iter(decode_image(im) for im in request.images)
    messages = [
        {
            **m,
            "content": [
                {"type": "image", "image": next(images)} if part.get("type") == "image" else part
                for part in m["content"]
            ],
        }
        for m in request.messages
    ]
    inputs = processor.apply_chat_template(
        messages,
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
        return_tensors="pt",
        **(chat_template_kwargs or {}),
    )
    with torch.inference_mode():
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
    prompt_len = inputs["input_ids"].shape[1]
    new = out[0, prompt_len:].tolist()
    eos = eos_ids(model)
    end = next((i for i, t in enumerate(new) if t in eos), None)
    tokens = new if end is None else new[:end]
    return {
        "text": processor.tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False),
        "prompt_tokens": prompt_len,
        "generated_tokens": len(new) if end is None else end + 1,
        "hit_limit": end is None,
    }


def as_dict(result) -> dict:
    return {
        "text": result.text,
        "prompt_tokens": result.prompt_tokens,
        "generated_tokens": result.generated_tokens,
        "hit_limit": result.hit_limit,
    }


class _Wrapper:
    """Delegates everything but `generate` to the wrapped model."""

    def __init__(self, model):
        self._model = model

    def __getattr__(self, name):
        return getattr(self._model, name)


class OOMAboveBatchSizeModel(_Wrapper):
    """A real model whose `generate` raises CUDA out-of-memory for batches wider than `max_rows` (error injection)."""

    def __init__(self, model, max_rows: int):
        super().__init__(model)
        self.max_rows = max_rows
        self.batch_sizes: list[int] = []
        self.ooms = 0

    def generate(self, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        if rows > self.max_rows:
            self.ooms += 1
            raise torch.cuda.OutOfMemoryError(f"CUDA out of memory (injected: {rows} rows > {self.max_rows})")
        self.batch_sizes.append(rows)
        return self._model.generate(**kwargs)


class BatchRecordingModel(_Wrapper):
    """A real model that records the shape of every batch it is asked to generate."""

    def __init__(self, model):
        super().__init__(model)
        self.shapes: list[tuple[int, int]] = []

    def generate(self, **kwargs):
        self.shapes.append(tuple(kwargs["input_ids"].shape))
        return self._model.generate(**kwargs)


class ScriptedTokensModel(_Wrapper):
    """Returns the prompt followed by scripted new tokens (padded with `pad_id`), for tests of token counting and
    decoding; the wrapped real model only supplies config, device and dtype."""

    def __init__(self, model, scripts: dict[int, list[int]], pad_id: int):
        super().__init__(model)
        self.scripts = scripts  # prompt length of the row -> its new tokens
        self.pad_id = pad_id

    def generate(self, **kwargs):
        input_ids = kwargs["input_ids"]
        lengths = kwargs["attention_mask"].sum(dim=1).tolist()
        new = [self.scripts[n] for n in lengths]
        width = max(len(s) for s in new)
        rows = [s + [self.pad_id] * (width - len(s)) for s in new]
        return torch.cat([input_ids, torch.tensor(rows, dtype=input_ids.dtype)], dim=1)
