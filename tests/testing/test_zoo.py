"""The offline model zoo: every tiny VLM builds deterministically, is small, reloads from disk with
`local_files_only=True`, and has a tokenizer and chat template that behave like the real model's."""

import json
import os

import pytest
import transformers
from transformers import AutoConfig, AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

from rsgen.engine.processors import needs_video_processor, processor_class_without_video
from rsgen.testing.images import make_test_image
from rsgen.testing.zoo import REASONING_TOKENS, ZOO_ARCHS, ZOO_INFO, build_tiny_vlm

MAX_MODEL_BYTES = 1_200_000
THINK_OFF_BLOCK = "<think>\n\n</think>\n\n"


def _directory_bytes(path):
    return sum(os.path.getsize(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names)


def _load_processor_offline(arch, path):
    """The saved processor, read with `local_files_only=True` (without video where torchvision is missing)."""
    base = getattr(transformers, ZOO_INFO[arch].processor_class)
    if needs_video_processor(base) and not transformers.utils.is_torchvision_available():
        return processor_class_without_video(base).from_pretrained(path, local_files_only=True)
    return AutoProcessor.from_pretrained(path, local_files_only=True)


def _user_turn(question, with_image=True):
    content = ([{"type": "image"}] if with_image else []) + [{"type": "text", "text": question}]
    return {"role": "user", "content": content}


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_build_is_small_complete_and_deterministic(arch, tiny_vlm_factory, tmp_path):
    path = tiny_vlm_factory(arch)
    names = set(os.listdir(path))
    assert {"config.json", "model.safetensors", "generation_config.json", "processor_config.json",
            "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= names
    assert not any(name.endswith(".bin") for name in names)
    assert _directory_bytes(path) < MAX_MODEL_BYTES

    again = build_tiny_vlm(arch, tmp_path / "again", seed=0)
    other_seed = build_tiny_vlm(arch, tmp_path / "seed1", seed=1)
    weights = [open(os.path.join(p, "model.safetensors"), "rb").read() for p in (path, again, other_seed)]
    assert weights[0] == weights[1]
    assert weights[0] != weights[2]


def test_unknown_arch_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="unknown zoo architecture 'gpt2'.*qwen2_vl"):
        build_tiny_vlm("gpt2", tmp_path)


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_reloads_with_local_files_only(arch, tiny_vlm_factory):
    path = tiny_vlm_factory(arch)
    info = ZOO_INFO[arch]
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    model = AutoModelForImageTextToText.from_pretrained(path, local_files_only=True, use_safetensors=True)
    processor = _load_processor_offline(arch, path)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)

    assert config.model_type == arch
    assert type(processor).__name__ == info.processor_class
    assert model.get_input_embeddings().num_embeddings == len(tokenizer)
    image_token_id = getattr(config, "image_token_id", None) or config.image_token_index
    assert image_token_id == tokenizer.convert_tokens_to_ids(info.image_token)
    assert tokenizer.convert_tokens_to_ids(info.eos_token) in model.generation_config.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.convert_tokens_to_ids(info.pad_token)
    assert model.generation_config.do_sample is False
    with open(os.path.join(path, "processor_config.json"), encoding="utf-8") as handle:
        assert json.load(handle)["processor_class"] == info.processor_class


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_chat_template_switches_thinking(arch, tiny_vlm_factory):
    processor = _load_processor_offline(arch, tiny_vlm_factory(arch))
    messages = [_user_turn("How many objects are left?")]

    def render(conversation, **kwargs):
        return processor.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False, **kwargs)

    thinking_default = render(messages)
    thinking_on = render(messages, enable_thinking=True)
    thinking_off = render(messages, enable_thinking=False)
    # Qwen3's convention: thinking on leaves the model free to open <think>; off closes an empty block.
    assert thinking_on == thinking_default
    assert "<think>" not in thinking_on
    assert thinking_off == thinking_on + THINK_OFF_BLOCK
    assert "How many objects are left?" in thinking_on
    assert thinking_on.count(ZOO_INFO[arch].image_token) == 1

    # Assistant turns (reasoning included) are rendered verbatim; string content and system turns work.
    answer = "<think>\nThere are 3 cubes.\n</think>\n\n3"
    conversation = [
        {"role": "system", "content": "You are a helpful assistant."},
        _user_turn("How many cubes?"),
        {"role": "assistant", "content": [{"type": "text", "text": answer}]},
        {"role": "user", "content": "And spheres?"},
    ]
    rendered = render(conversation, enable_thinking=False)
    assert answer in rendered and "You are a helpful assistant." in rendered and "And spheres?" in rendered
    assert rendered.endswith(THINK_OFF_BLOCK)
    assert rendered.count(ZOO_INFO[arch].image_token) == 1


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_assistant_mask_covers_the_answer(arch, tiny_vlm_factory):
    """The template's {% generation %} markers let TRL train on assistant tokens only."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_factory(arch), local_files_only=True)
    answer = "<think>\nCount them.\n</think>\n\n7"
    conversation = [_user_turn("How many objects exist?", with_image=False), {"role": "assistant", "content": answer}]
    encoded = tokenizer.apply_chat_template(
        conversation, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    masked = [token for token, keep in zip(encoded["input_ids"], encoded["assistant_masks"]) if keep]
    assert answer in tokenizer.decode(masked)
    assert "How many objects exist?" not in tokenizer.decode(masked)


@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_image_expands_to_the_documented_number_of_tokens(arch, tiny_vlm_factory):
    processor = _load_processor_offline(arch, tiny_vlm_factory(arch))
    info = ZOO_INFO[arch]
    prompt = processor.apply_chat_template([_user_turn("Count.")], add_generation_prompt=True, tokenize=False)
    encoded = processor(text=[prompt], images=[[make_test_image(0, size=(64, 64))]], return_tensors="pt")
    image_token_id = processor.tokenizer.convert_tokens_to_ids(info.image_token)
    assert int((encoded["input_ids"][0] == image_token_id).sum()) == info.image_tokens


@pytest.mark.parametrize("arch", ["qwen3_vl", "idefics3", "llava"])
def test_tokenizer_round_trips_and_keeps_reasoning_tags(arch, tiny_vlm_factory):
    tokenizer = AutoTokenizer.from_pretrained(tiny_vlm_factory(arch), local_files_only=True)
    text = (
        "<think>\nSubtract all big blue things. 10 - 3 = 7 (café, 数)\n</think>\n\n"
        "7 CORRECT WRONG UNSURE"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == text  # byte-level: nothing is unknown
    for tag in REASONING_TOKENS:
        assert len(tokenizer(tag, add_special_tokens=False)["input_ids"]) == 1
        assert tag not in tokenizer.all_special_tokens
    # The corpus made common words single tokens, so prompts stay short.
    assert len(tokenizer("How many objects are left?", add_special_tokens=False)["input_ids"]) <= 8
