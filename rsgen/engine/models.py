"""Load a vision-language model and its processor the way every rsgen stage needs them.

`AutoModelForImageTextToText` + `AutoProcessor`, with rsgen's defaults: dtype from the checkpoint, the fastest
attention available (flash-attention 2 on CUDA when installed, else PyTorch SDPA), safetensors weights only,
no remote code unless asked, left padding (batched greedy output then equals one-by-one output), eval mode.
Processors that want a video processor load without it on machines without torchvision (see `processors.py`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

from rsgen.config import DEMO_BASE_MODEL, DEMO_MODEL, RecipeError
from rsgen.engine.processors import needs_video_processor, processor_class_without_video

logger = logging.getLogger(__name__)

_DTYPES = {
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
}
_HALF_DTYPES = (torch.float16, torch.bfloat16)


class ModelLoadError(RecipeError):
    """A model or processor rsgen cannot use; the message names the model and the fix. (A RecipeError: the
    command line prints it as one line.)"""


def demo_model_path() -> Path:
    """Directory of the demo VLM shipped inside the package (trained by `scripts/train_demo_model.py`)."""
    return Path(__file__).resolve().parent.parent / "demo" / "model"


def demo_base_model_path() -> Path:
    """Directory of the demo model's base shipped beside it (the same training, stopped early)."""
    return demo_model_path().with_name("base_model")


def resolve_model_path(name_or_path: str) -> str:
    """Where to load a recipe's model from: the demo models' sentinels (`rsgen-demo`, `rsgen-demo-base`) become
    their directories."""
    if name_or_path == DEMO_MODEL:
        return str(demo_model_path())
    if name_or_path == DEMO_BASE_MODEL:
        return str(demo_base_model_path())
    return name_or_path


def load_model_and_processor(
    name_or_path: str,
    revision: str | None = None,
    torch_dtype: str | torch.dtype = "auto",
    attn_implementation: str = "auto",
    trust_remote_code: bool = False,
    device: str | torch.device | None = None,
    allow_text_only: bool = False,
):
    """Return `(model, processor)` for the image-text-to-text model `name_or_path`, ready to generate.

    `device`: where the model goes (default: CUDA when available, else CPU); under `accelerate` pass the
    process's device. The model is in eval mode; `processor.tokenizer.padding_side == "left"`.
    `allow_text_only`: a text-only causal LM is accepted too (the judge reads text only); it comes back with its
    tokenizer in place of a processor.
    """
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    config = load_config(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    text_only = allow_text_only and is_text_causal_lm(config, trust_remote_code)
    if not text_only:
        check_image_text_to_text(name_or_path, config, trust_remote_code, allow_text_only)
    auto_class = AutoModelForCausalLM if text_only else AutoModelForImageTextToText

    device = torch.device(device) if device is not None else default_device()
    dtype = resolve_dtype(torch_dtype)
    attention = resolve_attn_implementation(attn_implementation, device, _checkpoint_dtype(config, dtype))
    model_kwargs = dict(
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        use_safetensors=True,
        **_revision_kwargs(revision),
    )
    if device.type != "cpu":
        model_kwargs["device_map"] = str(device)  # straight onto the accelerator, no full copy in host memory
    try:
        try:
            model = auto_class.from_pretrained(name_or_path, config=config, attn_implementation=attention, **model_kwargs)
        except ValueError as error:
            # "auto" asked for SDPA, which a few architectures do not implement: eager attention still works.
            if attn_implementation != "auto" or attention != "sdpa" or "sdpa" not in str(error).lower():
                raise
            logger.info("%s does not support SDPA attention; using eager attention", name_or_path)
            attention = "eager"
            model = auto_class.from_pretrained(name_or_path, config=config, attn_implementation=attention, **model_kwargs)
    except OSError as error:
        if "safetensors" in str(error).lower() or ".bin" in str(error):
            raise ModelLoadError(
                f"{name_or_path}: no safetensors weights found; rsgen loads safetensors only (pickled .bin "
                f"weights can run code). Use a revision of the model that ships model.safetensors, or convert "
                f"it once with `model.save_pretrained(dir)` and point model_name_or_path at dir. ({error})"
            ) from error
        raise ModelLoadError(f"{name_or_path}: could not load the model weights: {error}") from error
    model.to(device)
    model.eval()

    if text_only:
        processor = load_chat_tokenizer(name_or_path, revision=revision, trust_remote_code=trust_remote_code)
    else:
        processor = load_processor(name_or_path, config, revision=revision, trust_remote_code=trust_remote_code)
    logger.info(
        "loaded %s (%s, dtype %s, attention %s) on %s with %s",
        name_or_path,
        type(model).__name__,
        model.dtype,
        attention,
        device,
        type(processor).__name__,
    )
    return model, processor


def load_config(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The model's config, or a `ModelLoadError` that says whether the path is missing or the Hub unreachable."""
    from huggingface_hub import constants as hub_constants
    from transformers import AutoConfig

    expanded = os.path.expanduser(name_or_path)
    looks_local = os.path.isabs(expanded) or name_or_path.startswith((".", "~")) or os.path.exists(expanded)
    if looks_local and not os.path.isdir(expanded):
        raise ModelLoadError(
            f"model {name_or_path!r}: no such local directory. Point model_name_or_path at a directory holding "
            f"config.json, model.safetensors and the processor files, or at a Hub model id."
        )
    try:
        return AutoConfig.from_pretrained(
            expanded if looks_local else name_or_path,
            trust_remote_code=trust_remote_code,
            **_revision_kwargs(revision),
        )
    except OSError as error:
        offline = hub_constants.HF_HUB_OFFLINE or os.environ.get("TRANSFORMERS_OFFLINE", "").lower() in ("1", "true")
        if offline:
            fix = (
                "HF_HUB_OFFLINE is set and the model is not in the local cache: download it first where there "
                f"is network (`hf download {name_or_path}`), or point model_name_or_path at a local directory"
            )
        else:
            fix = "check the model id (and revision), your network and, for gated models, your Hub login"
        raise ModelLoadError(f"model {name_or_path!r} could not be found: {fix}. ({error})") from error


def check_model_config(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False,
                       allow_text_only: bool = False) -> None:
    """What `load_model_and_processor` checks before loading weights, alone: the model exists and is an
    image-text-to-text model (or, with `allow_text_only`, a text causal LM). Reads config.json only, so a run can
    refuse a wrong model in seconds, before any other work."""
    config = load_config(resolve_model_path(name_or_path), revision=revision, trust_remote_code=trust_remote_code)
    if not (allow_text_only and is_text_causal_lm(config, trust_remote_code)):
        check_image_text_to_text(name_or_path, config, trust_remote_code, allow_text_only)


def is_text_causal_lm(config, trust_remote_code: bool) -> bool:
    """Whether `AutoModelForCausalLM` builds a model from `config` (and it is not a vision-language model)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING,
    )

    if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return False
    remote = trust_remote_code and "AutoModelForCausalLM" in (getattr(config, "auto_map", None) or {})
    return type(config) in MODEL_FOR_CAUSAL_LM_MAPPING or remote


def check_image_text_to_text(name_or_path: str, config, trust_remote_code: bool, allow_text_only: bool = False) -> None:
    """Raise a `ModelLoadError` unless `AutoModelForImageTextToText` can build a model from `config`."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING

    if type(config) in MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING:
        return
    remote = "AutoModelForImageTextToText" in (getattr(config, "auto_map", None) or {})
    if remote and trust_remote_code:
        return
    if remote:
        raise ModelLoadError(
            f"model {name_or_path!r} is an image-text-to-text model implemented by code in its repository; "
            f"rsgen runs such code only when asked: set `trust_remote_code: true` in the recipe if you trust it."
        )
    if allow_text_only:
        raise ModelLoadError(
            f"judge model {name_or_path!r} (model_type {getattr(config, 'model_type', None)!r}) is neither an "
            f"image-text-to-text model nor a text causal LM: set judge_model_name_or_path to a chat model, e.g. "
            f"Qwen/Qwen3-8B, or leave it unset to judge with the generating model."
        )
    raise ModelLoadError(
        f"model {name_or_path!r} (model_type {getattr(config, 'model_type', None)!r}) is not an image-text-to-text "
        f"model: AutoModelForImageTextToText cannot load it. rsgen needs a vision-language model with a chat "
        f"template, e.g. Qwen/Qwen2.5-VL-7B-Instruct or HuggingFaceTB/SmolVLM-Instruct; set model_name_or_path "
        f"to one."
    )


def load_processor(name_or_path: str, config=None, revision: str | None = None, trust_remote_code: bool = False):
    """`AutoProcessor`, or, where it fails for want of torchvision, the same processor without its video part.

    The tokenizer pads on the left, and gets the end-of-sequence token as padding if it has no padding token.
    """
    from transformers import AutoProcessor
    from transformers.utils import is_torchvision_available

    kwargs = dict(trust_remote_code=trust_remote_code, **_revision_kwargs(revision))
    try:
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except (OSError, ImportError, ValueError) as error:
        base = _processor_class(config) if config is not None else None
        if base is None or is_torchvision_available() or not needs_video_processor(base):
            raise ModelLoadError(f"model {name_or_path!r}: could not load its processor: {error}") from error
        logger.info("torchvision is not installed: loading %s without its video processor", base.__name__)
        try:
            processor = processor_class_without_video(base).from_pretrained(name_or_path, **kwargs)
        except Exception as fallback_error:
            raise ModelLoadError(
                f"model {name_or_path!r}: could not load its processor: AutoProcessor failed ({error}); without "
                f"torchvision rsgen loads {base.__name__} without its video processor, which failed too "
                f"({fallback_error})."
            ) from fallback_error

    tokenizer = getattr(processor, "tokenizer", None)
    if tokenizer is None or getattr(processor, "image_processor", None) is None:
        raise ModelLoadError(
            f"model {name_or_path!r}: AutoProcessor gave a {type(processor).__name__}, not a processor with an "
            f"image processor and a tokenizer; rsgen needs an image-text-to-text model's processor."
        )
    if not (getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)):
        raise ModelLoadError(
            f"model {name_or_path!r} has no chat template; rsgen builds prompts with the chat template. Use the "
            f"instruction-tuned variant of the model, or add a chat_template.jinja to its directory."
        )
    _left_padded(tokenizer)
    return processor


def load_chat_tokenizer(name_or_path: str, revision: str | None = None, trust_remote_code: bool = False):
    """The tokenizer of a text-only chat model (the judge), left-padded; a `ModelLoadError` without a chat template."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code,
                                                  **_revision_kwargs(revision))
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"model {name_or_path!r}: could not load its tokenizer: {error}") from error
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(
            f"model {name_or_path!r} has no chat template; rsgen builds the judge prompt with the chat template. "
            f"Use the instruction-tuned variant of the model, or add a chat_template.jinja to its directory."
        )
    return _left_padded(tokenizer)


def _left_padded(tokenizer):
    tokenizer.padding_side = "left"  # batched greedy output then equals one-by-one output
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def default_device() -> torch.device:
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def resolve_dtype(torch_dtype: str | torch.dtype | None):
    """`"auto"` (the checkpoint's dtype), a `torch.dtype`, or a name such as `"bfloat16"`."""
    if torch_dtype is None or torch_dtype == "auto":
        return "auto"
    if isinstance(torch_dtype, torch.dtype):
        return torch_dtype
    name = str(torch_dtype).lower().removeprefix("torch.")
    if name not in _DTYPES:
        raise ModelLoadError(f"torch_dtype {torch_dtype!r} is not one of auto, {', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]


def flash_attn_available() -> bool:
    try:
        import flash_attn  # noqa: F401
    except Exception:  # a broken install (ABI mismatch) raises more than ImportError
        return False
    return True


def resolve_attn_implementation(requested: str, device: torch.device, dtype: torch.dtype | None) -> str:
    """`"auto"` -> flash_attention_2 on CUDA with flash_attn importable and a half-precision model, else sdpa."""
    if requested != "auto":
        return requested
    if device.type == "cuda" and torch.cuda.is_available() and dtype in _HALF_DTYPES and flash_attn_available():
        return "flash_attention_2"
    return "sdpa"


def _checkpoint_dtype(config, dtype) -> torch.dtype | None:
    """The dtype the model will load in: the requested one, else what the checkpoint's config records."""
    if isinstance(dtype, torch.dtype):
        return dtype
    for candidate in (config, getattr(config, "text_config", None)):
        recorded = getattr(candidate, "dtype", None) if candidate is not None else None
        if isinstance(recorded, str):
            recorded = _DTYPES.get(recorded.removeprefix("torch."))
        if isinstance(recorded, torch.dtype):
            return recorded
    return None


def _processor_class(config):
    """The processor class `AutoProcessor` maps this config to, or None."""
    from transformers.models.auto.processing_auto import PROCESSOR_MAPPING

    try:
        return PROCESSOR_MAPPING[type(config)]
    except KeyError:
        return None


def _revision_kwargs(revision: str | None) -> dict:
    return {"revision": revision} if revision else {}
