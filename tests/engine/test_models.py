"""The product model loader on every zoo model: it loads, generates, batches exactly, and fails clearly."""

import inspect
import json
import os
import shutil

import pytest
import torch
import transformers
from safetensors.torch import load_file

from rsgen.engine.models import (
    ModelLoadError,
    load_model_and_processor,
    resolve_attn_implementation,
    resolve_dtype,
)
from rsgen.engine.processors import needs_video_processor, processor_class_without_video
from rsgen.testing.images import make_test_image
from rsgen.testing.zoo import ZOO_ARCHS, ZOO_INFO

# transformers' model, processor, generate and cache APIs: .ci/run runs the slow ones on the floors too
pytestmark = pytest.mark.floors

MAX_NEW_TOKENS = 10
# Different sizes (so Qwen models get different numbers of image tokens) and questions of different lengths,
# so the batch is really left-padded.
IMAGE_SIZES = [(96, 72), (64, 64), (120, 60), (50, 80)]
QUESTIONS = [
    "How many objects are left?",
    "Subtract all big blue cubes. Subtract all small rubber spheres. How many objects are left? "
    "Answer in short without any other content.",
    "Count.",
    "Add 1 matte spheres. How many objects exist?",
]


@pytest.fixture(scope="module")
def loaded(tiny_vlm_factory):
    """Each zoo model loaded once through the product loader."""
    cache = {}

    def load(arch):
        if arch not in cache:
            cache[arch] = load_model_and_processor(tiny_vlm_factory(arch))
        return cache[arch]

    return load


def _generate(model, processor, questions, images):
    """Greedy answers for (question, image) pairs in one left-padded batch."""
    prompts = [
        processor.apply_chat_template(
            [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}],
            add_generation_prompt=True,
            tokenize=False,
            enable_thinking=False,
        )
        for question in questions
    ]
    inputs = processor(text=prompts, images=[[image] for image in images], padding=True, return_tensors="pt")
    inputs = inputs.to(model.device)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return processor.batch_decode(output[:, inputs["input_ids"].shape[1]:], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_every_zoo_model_loads_and_generates(arch, loaded):
    model, processor = loaded(arch)
    assert not model.training
    assert model.device.type == "cpu"
    assert model.dtype == torch.float32  # dtype "auto" keeps the checkpoint's
    assert model.config._attn_implementation == "sdpa"
    assert processor.tokenizer.padding_side == "left"
    assert type(processor).__name__ == ZOO_INFO[arch].processor_class

    [answer] = _generate(model, processor, QUESTIONS[:1], [make_test_image(0)])
    assert answer.strip()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_batched_greedy_output_equals_one_by_one(arch, loaded):
    model, processor = loaded(arch)
    images = [make_test_image(seed, size) for seed, size in enumerate(IMAGE_SIZES)]
    batched = _generate(model, processor, QUESTIONS, images)
    one_by_one = [_generate(model, processor, [q], [image])[0] for q, image in zip(QUESTIONS, images)]
    assert batched == one_by_one
    assert len(set(batched)) == len(batched)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_output_depends_on_image_and_question(arch, loaded):
    model, processor = loaded(arch)
    images = [make_test_image(seed, (64, 64)) for seed in range(4)]
    same_question = _generate(model, processor, [QUESTIONS[0]] * 4, images)
    assert len(set(same_question)) == 4, same_question
    same_image = _generate(model, processor, QUESTIONS, [images[0]] * 4)
    assert len(set(same_image)) == 4, same_image


def test_fallback_processor_keeps_the_base_class_name(tiny_vlm_factory, tmp_path):
    source = tiny_vlm_factory("qwen2_vl")
    copy = shutil.copytree(source, tmp_path / "qwen2_vl")
    model, processor = load_model_and_processor(str(copy))
    assert type(processor).__name__ == "Qwen2VLProcessor"
    assert isinstance(processor, transformers.Qwen2VLProcessor)

    processor.save_pretrained(copy)
    with open(copy / "processor_config.json", encoding="utf-8") as handle:
        saved = json.load(handle)
    with open(copy / "tokenizer_config.json", encoding="utf-8") as handle:
        assert json.load(handle)["processor_class"] == "Qwen2VLProcessor"
    assert saved["processor_class"] == "Qwen2VLProcessor"
    # A video entry is kept, so AutoProcessor on a machine with torchvision finds a video processor config.
    assert saved["video_processor"]["patch_size"] == saved["image_processor"]["patch_size"]
    assert "image_processor_type" not in saved["video_processor"]  # the class comes from config.json

    _, reloaded = load_model_and_processor(str(copy))
    assert type(reloaded).__name__ == "Qwen2VLProcessor"
    assert reloaded.saved_video_processor_config == saved["video_processor"]
    if not transformers.utils.is_torchvision_available():
        # Why the fallback exists: plain AutoProcessor cannot build the video processor here.
        with pytest.raises((OSError, ImportError, ValueError)):
            transformers.AutoProcessor.from_pretrained(copy)


@pytest.mark.parametrize(
    "base", [transformers.Qwen2VLProcessor, transformers.Qwen2_5_VLProcessor, transformers.Qwen3VLProcessor,
             transformers.SmolVLMProcessor]
)
def test_fallback_class_drops_only_the_video_processor(base):
    fallback = processor_class_without_video(base)
    assert needs_video_processor(base) and not needs_video_processor(fallback)
    assert fallback.__name__ == fallback.__qualname__ == base.__name__
    assert issubclass(fallback, base)
    assert fallback.get_attributes() == [a for a in base.get_attributes() if a != "video_processor"]
    expected = [name for name in inspect.signature(base.__init__).parameters if name != "video_processor"]
    assert list(inspect.signature(fallback.__init__).parameters) == expected  # e.g. SmolVLM's image_seq_len
    assert processor_class_without_video(base) is fallback


def test_processors_without_video_are_used_as_they_are():
    assert processor_class_without_video(transformers.LlavaProcessor) is transformers.LlavaProcessor
    assert processor_class_without_video(transformers.Idefics3Processor) is transformers.Idefics3Processor


def test_explicit_dtype_and_device(tiny_vlm_factory):
    model, processor = load_model_and_processor(
        tiny_vlm_factory("llava"), torch_dtype="bfloat16", attn_implementation="eager", device="cpu"
    )
    assert model.dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    assert processor.tokenizer.padding_side == "left"


def test_missing_local_directory_is_a_clear_error(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ModelLoadError, match="no-such-model.*no such local directory"):
        load_model_and_processor(str(missing))


def test_hub_id_not_available_offline_is_a_clear_error(monkeypatch):
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(ModelLoadError, match="rsgen-tests/not-a-cached-model.*HF_HUB_OFFLINE.*hf download"):
        load_model_and_processor("rsgen-tests/not-a-cached-model")


def test_text_only_model_is_a_clear_error(tmp_path):
    config = transformers.LlamaConfig(
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
    )
    config.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=r"model_type 'llama'.*not an image-text-to-text model"):
        load_model_and_processor(str(tmp_path))


def test_pickled_weights_are_refused(tiny_vlm_factory, tmp_path):
    copy = shutil.copytree(tiny_vlm_factory("idefics3"), tmp_path / "pickled")
    torch.save(load_file(copy / "model.safetensors"), copy / "pytorch_model.bin")
    os.remove(copy / "model.safetensors")
    with pytest.raises(ModelLoadError, match="safetensors only"):
        load_model_and_processor(str(copy))


def test_attention_auto_resolution(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_attn_implementation("auto", cpu, torch.bfloat16) == "sdpa"
    assert resolve_attn_implementation("eager", cpu, None) == "eager"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("rsgen.engine.models.flash_attn_available", lambda: True)
    assert resolve_attn_implementation("auto", cuda, torch.bfloat16) == "flash_attention_2"
    assert resolve_attn_implementation("auto", cuda, torch.float32) == "sdpa"  # flash-attn needs half precision
    monkeypatch.setattr("rsgen.engine.models.flash_attn_available", lambda: False)
    assert resolve_attn_implementation("auto", cuda, torch.bfloat16) == "sdpa"


def test_dtype_names():
    assert resolve_dtype("auto") == "auto"
    assert resolve_dtype("bf16") is torch.bfloat16
    assert resolve_dtype("torch.float16") is torch.float16
    with pytest.raises(ModelLoadError, match="float8"):
        resolve_dtype("float8")
