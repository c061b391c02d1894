"""An offline zoo of tiny random vision-language models, for tests.

`build_tiny_vlm(arch, directory)` writes, in about a second and without network, a complete Hugging Face model
directory — config, safetensors weights, generation config, processor with a locally trained tokenizer and a
chat template that honours `enable_thinking` — that loads with `from_pretrained(local_files_only=True)`.

The models are random, but not degenerate: weights are drawn with a larger spread than the library's default,
so greedy output depends on the image and on the question (a default-initialised tiny model repeats one token
whatever it is shown). They are small enough (hidden size 64, two layers, a one- or two-layer vision tower,
a handful of image tokens) that a batch of greedy generations takes well under a second on a CPU.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tokenizers import AddedToken

from rsgen.testing.chat_templates import chatml_template, idefics3_template, llava_template
from rsgen.testing.tokenizer import train_tokenizer

ZOO_ARCHS = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "idefics3", "llava")

# Text tower shared by every architecture: small, but with grouped-query attention like the real models.
TEXT_HIDDEN = 64
TEXT_LAYERS = 2
TEXT_HEADS = 4
TEXT_KV_HEADS = 2
TEXT_INTERMEDIATE = 128
VISION_HIDDEN = 32
VISION_HEADS = 2
VOCAB_SIZE = 420
# Standard deviation of the re-initialised weights: large enough that logits vary with the input.
INIT_STD = 0.25

# Reasoning tags are added tokens but not special ones (as in Qwen3), so they survive skip_special_tokens.
REASONING_TOKENS = ("<think>", "</think>")

QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>",
)
IDEFICS3_SPECIAL_TOKENS = (
    "<|begin_of_text|>", "<|end_of_text|>", "<pad>", "<end_of_utterance>",
    "<fake_token_around_image>", "<image>", "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)
LLAVA_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<image>")


@dataclass(frozen=True)
class ZooModelInfo:
    """What a test may want to know about a zoo model without loading it."""

    processor_class: str  # the processor's class name, as saved in processor_config.json
    image_token: str  # the placeholder token images expand to
    image_tokens: int  # how many of them one square image expands to
    eos_token: str
    pad_token: str


ZOO_INFO = {
    # 84x84 pixels (any aspect ratio: about that many pixels) at patch 14 -> 6x6 patches, merged 2x2 -> 9.
    "qwen2_vl": ZooModelInfo("Qwen2VLProcessor", "<|image_pad|>", 9, "<|im_end|>", "<|endoftext|>"),
    "qwen2_5_vl": ZooModelInfo("Qwen2_5_VLProcessor", "<|image_pad|>", 9, "<|im_end|>", "<|endoftext|>"),
    # 64x64 pixels at patch 16 -> 4x4 patches, merged 2x2 -> 4.
    "qwen3_vl": ZooModelInfo("Qwen3VLProcessor", "<|image_pad|>", 4, "<|im_end|>", "<|endoftext|>"),
    # 32x32 pixels at patch 8 -> 16 patches, pixel-shuffled by 2 -> 4 (wrapped in 3 marker tokens).
    "idefics3": ZooModelInfo("Idefics3Processor", "<image>", 4, "<end_of_utterance>", "<pad>"),
    # 32x32 pixels (resized, centre-cropped) at patch 8 -> 16 patches; the CLS token is dropped.
    "llava": ZooModelInfo("LlavaProcessor", "<image>", 16, "</s>", "<pad>"),
}


def build_tiny_vlm(arch: str, directory: str | os.PathLike, seed: int = 0) -> str:
    """Build the tiny `arch` model with its processor and save both to `directory`; returns the path.

    Deterministic for a given `arch` and `seed`. The directory is created if needed; existing model files in it
    are overwritten.
    """
    if arch not in _BUILDERS:
        raise ValueError(f"unknown zoo architecture {arch!r}; choose one of {', '.join(ZOO_ARCHS)}")
    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    # The library's own initialisation draws from the global generator (e.g. LLaVA's class embedding):
    # seed it for determinism, inside fork_rng so the caller's random state is left as it was.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model, processor = _BUILDERS[arch](seed)
    with _progress_bars_off():
        model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


@contextlib.contextmanager
def _progress_bars_off():
    """Silence transformers' per-save "Writing model shards" bar, which would print once per zoo model."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


# ----------------------------------------------------------------------------------------------- tokenizers


def _make_tokenizer(special_tokens: tuple[str, ...], **token_roles):
    """A `TokenizersBackend` tokenizer over a freshly trained BPE; `token_roles` name bos/eos/pad/unk/extra tokens."""
    from transformers import PreTrainedTokenizerFast

    backend = train_tokenizer(list(special_tokens), vocab_size=VOCAB_SIZE)
    backend.add_tokens([AddedToken(token, special=False, normalized=False) for token in REASONING_TOKENS])
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **token_roles)


def _qwen_tokenizer():
    return _make_tokenizer(
        QWEN_SPECIAL_TOKENS,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={
            "image_token": "<|image_pad|>",
            "video_token": "<|video_pad|>",
            "vision_start_token": "<|vision_start|>",
            "vision_end_token": "<|vision_end|>",
        },
    )


# ----------------------------------------------------------------------------------------------- weights


def _reinitialise(model: torch.nn.Module, tokenizer, seed: int, eos_tokens: tuple[str, ...]) -> None:
    """Redraw every weight matrix with std INIT_STD and zero the biases, deterministically (norm weights and
    other vectors keep the library's initialisation, seeded by `build_tiny_vlm`).

    The output rows of tokens that do not decode to readable text (lone bytes of a multi-byte character,
    control characters, special tokens other than end-of-sequence) are zeroed, so generations are readable
    strings of corpus words instead of mojibake; the input embeddings (untied) keep every token distinct.
    """
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim >= 2:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
            elif name.endswith("bias"):
                param.zero_()
        output_rows = model.get_output_embeddings().weight
        output_rows[_unreadable_token_ids(tokenizer, eos_tokens)] = 0.0
    model.eval()


def _unreadable_token_ids(tokenizer, eos_tokens: tuple[str, ...]) -> list[int]:
    keep = {tokenizer.convert_tokens_to_ids(token) for token in eos_tokens}
    special = set(tokenizer.all_special_ids) | {
        token_id for token_id, added in tokenizer.added_tokens_decoder.items() if added.special
    }
    unreadable = []
    for token_id in range(len(tokenizer)):
        if token_id in keep:
            continue
        text = tokenizer.decode([token_id])
        readable = text.isascii() and all(char.isprintable() or char == "\n" for char in text)
        if token_id in special or not text or not readable:
            unreadable.append(token_id)
    return unreadable


def _text_kwargs(tokenizer, **extra) -> dict:
    return dict(
        vocab_size=len(tokenizer),
        hidden_size=TEXT_HIDDEN,
        intermediate_size=TEXT_INTERMEDIATE,
        num_hidden_layers=TEXT_LAYERS,
        num_attention_heads=TEXT_HEADS,
        num_key_value_heads=TEXT_KV_HEADS,
        max_position_embeddings=4096,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )


def _finish(model, tokenizer, seed: int, eos_tokens: tuple[str, ...]):
    """Re-initialise, tie the generation config to the tokenizer, and keep float32 (what `dtype=auto` restores)."""
    _reinitialise(model, tokenizer, seed, eos_tokens)
    model.to(torch.float32)
    model.config.dtype = torch.float32
    generation_config = model.generation_config
    generation_config.eos_token_id = [tokenizer.convert_tokens_to_ids(token) for token in eos_tokens]
    generation_config.pad_token_id = tokenizer.pad_token_id
    generation_config.bos_token_id = tokenizer.bos_token_id
    generation_config.do_sample = False
    return model


# ----------------------------------------------------------------------------------------------- Qwen family


def _qwen_vision_ids(tokenizer) -> dict:
    return dict(
        image_token_id=tokenizer.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tokenizer.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tokenizer.convert_tokens_to_ids("<|vision_end|>"),
    )


def _qwen_processor(processor_name: str, tokenizer, patch_size: int, pixels: int):
    import transformers
    from transformers import Qwen2VLImageProcessorPil

    from rsgen.engine.processors import processor_class_without_video

    image_processor = Qwen2VLImageProcessorPil(
        patch_size=patch_size,
        merge_size=2,
        temporal_patch_size=2,
        size={"shortest_edge": pixels, "longest_edge": pixels},
    )
    processor_class = processor_class_without_video(getattr(transformers, processor_name))
    return processor_class(
        image_processor=image_processor,
        tokenizer=tokenizer,
        chat_template=chatml_template("<|vision_start|><|image_pad|><|vision_end|>"),
    )


def _build_qwen(seed: int, family: str, *, patch_size: int, pixels: int, vision: dict, text: dict | None = None,
                rope: dict | None = None):
    """The tiny `family` model (`Qwen2VL`, `Qwen2_5_VL`, `Qwen3VL`: the prefix of its transformers classes) and its
    processor: what differs between the three is the vision tower's keys (`vision`), extra text-tower keys (`text`)
    and extra rope keys (`rope`)."""
    import transformers

    tokenizer = _qwen_tokenizer()
    config = getattr(transformers, f"{family}Config")(
        text_config=_text_kwargs(
            tokenizer,
            **(text or {}),
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], **(rope or {})},
        ),
        vision_config=dict(
            depth=2, num_heads=VISION_HEADS, patch_size=patch_size, spatial_merge_size=2, temporal_patch_size=2,
            **vision,
        ),
        tie_word_embeddings=False,
        **_qwen_vision_ids(tokenizer),
    )
    model_class = getattr(transformers, f"{family}ForConditionalGeneration")
    model = _finish(model_class(config), tokenizer, seed, ("<|im_end|>", "<|endoftext|>"))
    return model, _qwen_processor(f"{family}Processor", tokenizer, patch_size=patch_size, pixels=pixels)


def _vit_config(**extra) -> dict:
    """The vision tower keys Qwen2.5-VL and Qwen3-VL share (a ViT with its own width, projected to the text's)."""
    return dict(hidden_size=VISION_HIDDEN, intermediate_size=64, out_hidden_size=TEXT_HIDDEN, **extra)


def _build_qwen2_vl(seed: int):
    # The merger projects straight into the text width (hidden_size is the text's; embed_dim the tower's).
    vision = dict(embed_dim=VISION_HIDDEN, hidden_size=TEXT_HIDDEN, mlp_ratio=2)
    return _build_qwen(seed, "Qwen2VL", patch_size=14, pixels=84 * 84, vision=vision)


def _build_qwen2_5_vl(seed: int):
    # 2x2 merged tokens per window, so windowed attention is exercised.
    vision = _vit_config(window_size=56, fullatt_block_indexes=[1])
    return _build_qwen(seed, "Qwen2_5_VL", patch_size=14, pixels=84 * 84, vision=vision)


def _build_qwen3_vl(seed: int):
    # An 8x8 learned position grid, interpolated to the image's patches; one deepstack layer.
    vision = _vit_config(num_position_embeddings=64, deepstack_visual_indexes=[0])
    return _build_qwen(seed, "Qwen3VL", patch_size=16, pixels=64 * 64, vision=vision,
                       text={"head_dim": TEXT_HIDDEN // TEXT_HEADS}, rope={"mrope_interleaved": True})


# ----------------------------------------------------------------------------------------------- Idefics3


def _square_vision_config(layers: int, image_size: int, patch_size: int, **extra) -> dict:
    """The vision tower keys Idefics3 (SigLIP) and LLaVA (CLIP) share: a ViT over a fixed square image."""
    return dict(
        hidden_size=VISION_HIDDEN,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=VISION_HEADS,
        image_size=image_size,
        patch_size=patch_size,
        **extra,
    )


def _build_idefics3(seed: int):
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
    )

    tokenizer = _make_tokenizer(
        IDEFICS3_SPECIAL_TOKENS,
        bos_token="<|begin_of_text|>",
        eos_token="<end_of_utterance>",
        pad_token="<pad>",
        extra_special_tokens={
            "image_token": "<image>",
            "fake_image_token": "<fake_token_around_image>",
            "global_image_token": "<global-img>",
            "end_of_utterance_token": "<end_of_utterance>",
        },
    )
    image_size, patch_size, scale_factor = 32, 8, 2
    image_tokens = (image_size // patch_size) ** 2 // scale_factor**2
    config = Idefics3Config(
        text_config=dict(_text_kwargs(tokenizer), model_type="llama"),
        vision_config=_square_vision_config(layers=1, image_size=image_size, patch_size=patch_size),
        scale_factor=scale_factor,
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"),
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = _finish(
        Idefics3ForConditionalGeneration(config), tokenizer, seed, ("<end_of_utterance>", "<|end_of_text|>")
    )
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False,  # one global tile per image keeps prompts short
        size={"longest_edge": image_size},
        max_image_size={"longest_edge": image_size},
    )
    processor = Idefics3Processor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        image_seq_len=image_tokens,
        chat_template=idefics3_template(),
    )
    return model, processor


# ----------------------------------------------------------------------------------------------- LLaVA


def _build_llava(seed: int):
    from transformers import (
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaImageProcessorPil,
        LlavaProcessor,
    )

    tokenizer = _make_tokenizer(
        LLAVA_SPECIAL_TOKENS,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        extra_special_tokens={"image_token": "<image>"},
    )
    image_size, patch_size = 32, 8
    config = LlavaConfig(
        text_config=dict(_text_kwargs(tokenizer), model_type="llama"),
        vision_config=_square_vision_config(
            layers=2, image_size=image_size, patch_size=patch_size,
            model_type="clip_vision_model", projection_dim=VISION_HIDDEN,
        ),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"),
        image_seq_length=(image_size // patch_size) ** 2,
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = _finish(LlavaForConditionalGeneration(config), tokenizer, seed, ("</s>",))
    image_processor = LlavaImageProcessorPil(
        size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=patch_size,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
        chat_template=llava_template(),
    )
    return model, processor


_BUILDERS: dict[str, Callable] = {
    "qwen2_vl": _build_qwen2_vl,
    "qwen2_5_vl": _build_qwen2_5_vl,
    "qwen3_vl": _build_qwen3_vl,
    "idefics3": _build_idefics3,
    "llava": _build_llava,
}



def build_tiny_text_lm(directory: str | os.PathLike, seed: int = 0) -> str:
    """A tiny random text-only chat model (Qwen2 architecture, ChatML template with `enable_thinking`), saved with
    its tokenizer to `directory`: what a separate text-only judge looks like. Returns the path."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = os.fspath(directory)
    os.makedirs(path, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tokenizer = _qwen_tokenizer()
        tokenizer.chat_template = chatml_template("<|vision_start|><|image_pad|><|vision_end|>")  # never used: text only
        config = Qwen2Config(**_text_kwargs(tokenizer), tie_word_embeddings=False)
        model = _finish(Qwen2ForCausalLM(config), tokenizer, seed, ("<|im_end|>", "<|endoftext|>"))
    with _progress_bars_off():
        model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
