"""Recipes: flat YAML files parsed into dataclasses, with `--key value` overrides from the command line.

The shape follows TRL scripts (`--config recipe.yaml` plus overrides), but the parser is small and strict:
an unknown key is an error that names the key and the closest known ones, so a typo never runs a week-long
job with a default.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEMO_MODEL = "rsgen-demo"
"""Sentinel for the small VLM shipped inside the package (`rsgen.engine.demo_model_path()` resolves it)."""


class RecipeError(ValueError):
    """A recipe or override that cannot be used; the message names the bad key or value and the fix."""


@dataclass
class SourceConfig:
    """One pool of VQA data. Each becomes (part of) a family."""

    # Where the rows come from: a Hub dataset, local files, or an image folder.
    dataset_name: str | None = None
    dataset_config: str | None = None
    data_files: list[str] | None = None
    data_dir: str | None = None  # image folder (`imagefolder` with a metadata file)
    split: str = "train"
    streaming: bool = False
    max_rows: int | None = None  # read at most this many source rows (smoke runs)

    # Row layout: "flat" (one QA per row, column mapping below), "cauldron" (images + texts[{user, assistant}])
    # or "llava" (image + conversations[{from, value}] with an <image> placeholder).
    format: str = "flat"
    image_column: str = "image"
    question_column: str = "question"
    answer_column: str = "answer"  # may hold a list of acceptable answers
    options_column: str | None = None  # multiple-choice options (list of strings)
    source_id_column: str | None = None  # the source's own row id, recorded in clean_meta
    image_ref_column: str | None = None  # recorded image reference (file name) checked by provenance
    conversation_column: str | None = None  # cauldron / llava: the list of turns (default: texts / conversations)
    family: str | None = None
    family_column: str | None = None

    # Text handling.
    question_template: str = "{question}"  # the instruction is appended after this, on a new line
    answer_normalization: list[str] = field(default_factory=list)  # e.g. [strip_answer_prefix, strip_trailing_period]

    # Task purity: keep only QA pairs matching these (empty = keep all).
    keep_question_patterns: list[str] = field(default_factory=list)  # regexes, any match keeps
    source_allowlist: list[str] | None = None  # allowed values of source_id_column's dataset prefix

    # `dataset_name: rsgen-demo` draws the procedural demo pool instead of reading data.
    demo_num_images: int = 300
    demo_seed: int = 1234


@dataclass
class RecipeConfig:
    """Everything a run needs. Every key can be set in the YAML file or overridden as `--key value`."""

    # Model.
    model_name_or_path: str = DEMO_MODEL
    engine: str = "transformers"  # the engine implementation (rsgen.engine.ENGINES)
    model_revision: str | None = None
    torch_dtype: str = "auto"
    attn_implementation: str = "auto"  # auto = flash_attention_2 when flash_attn imports and CUDA is present, else sdpa
    trust_remote_code: bool = False

    # Data.
    output_dir: str = "runs/demo"
    sources: list[SourceConfig] = field(default_factory=list)
    instruction: str = "Answer in short without any other content."
    max_image_pixels: int = 89_478_485  # PIL's decompression-bomb limit; larger images are dropped
    max_aspect_ratio: float = 200.0
    prepare_num_proc: int = 2

    # Generation.
    enable_thinking: bool = True
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    max_new_tokens: int = 2048
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    num_samples: int = 1
    seed: int = 0
    token_budget: int = 32768  # padded prompt+generation tokens per batch
    max_batch_size: int = 256
    checkpoint_every_items: int = 256
    checkpoint_every_seconds: float = 60.0

    # Verification.
    verifier: str | dict[str, str] = "relaxed"  # a name, or a mapping family -> name
    numeric_tolerance: float = 1e-6
    math_timeout_seconds: float = 5.0

    # Judge.
    judge: bool = True
    judge_model_name_or_path: str | None = None  # None = the generation model; a VLM or a text-only chat LM
    judge_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)  # not inherited from generation
    judge_prompt_file: str | None = None  # None = the template shipped in rsgen/judge/
    judge_max_new_tokens: int = 1024
    judge_calibration_size: int = 60
    judge_calibration_seed: int = 0

    # Emit.
    shard_size_mb: int = 500
    sft_keep_reasoning: bool = True
    num_card_examples: int = 3
    license: str = "other"
    task_categories: list[str] = field(default_factory=lambda: ["visual-question-answering"])
    language: list[str] = field(default_factory=lambda: ["en"])
    push_to_hub: bool = False
    hub_dataset_id: str | None = None
    hub_private: bool = False
    demo: bool = False  # the card says this is a demo dataset

    # ------------------------------------------------------------------ helpers

    def verifier_for(self, family: str) -> str:
        if isinstance(self.verifier, str):
            return self.verifier
        if family in self.verifier:
            return self.verifier[family]
        if "default" in self.verifier:
            return self.verifier["default"]
        raise RecipeError(
            f"verifier mapping has no entry for family {family!r} (has {sorted(self.verifier)}); "
            f"add `{family}: relaxed` (or another verifier) or a `default:` entry"
        )

    def generation_chat_template_kwargs(self) -> dict[str, Any]:
        return {"enable_thinking": self.enable_thinking, **self.chat_template_kwargs}

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------------- parsing


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _unknown_key_error(key: str, cls, where: str) -> RecipeError:
    known = sorted(_fields(cls))
    close = difflib.get_close_matches(key, known, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return RecipeError(f"unknown key {key!r} in {where}.{hint} Known keys: {', '.join(known)}")


def _check_type(name: str, value: Any, f: dataclasses.Field, where: str) -> Any:
    """Light type check with a message that names the key; YAML already gives us Python types."""
    t = str(f.type)
    if value is None:
        if "None" in t:
            return None
        raise RecipeError(f"{where}: key {name!r} may not be null (expected {t})")
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise RecipeError(f"{where}: key {name!r} must be true or false, got {value!r}")
    elif t.startswith("int"):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RecipeError(f"{where}: key {name!r} must be an integer, got {value!r}")
    elif t.startswith("float"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RecipeError(f"{where}: key {name!r} must be a number, got {value!r}")
        value = float(value)
    elif t.startswith("list"):
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            raise RecipeError(f"{where}: key {name!r} must be a list, got {value!r}")
    elif t.startswith("dict"):
        if not isinstance(value, dict):
            raise RecipeError(f"{where}: key {name!r} must be a mapping, got {value!r}")
    elif t.startswith("str | dict"):
        if not isinstance(value, (str, dict)):
            raise RecipeError(f"{where}: key {name!r} must be a name or a mapping, got {value!r}")
    elif t.startswith("str"):
        if not isinstance(value, str):
            value = str(value)
    return value


def source_from_dict(raw: dict[str, Any], index: int = 0) -> SourceConfig:
    where = f"sources[{index}]"
    if not isinstance(raw, dict):
        raise RecipeError(f"{where} must be a mapping of source keys, got {raw!r}")
    fields = _fields(SourceConfig)
    kwargs = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown_key_error(key, SourceConfig, where)
        kwargs[key] = _check_type(key, value, fields[key], where)
    src = SourceConfig(**kwargs)
    if src.format not in ("flat", "cauldron", "llava"):
        raise RecipeError(f"{where}: format {src.format!r} is not one of flat, cauldron, llava")
    if not (src.dataset_name or src.data_files or src.data_dir):
        raise RecipeError(f"{where}: set one of dataset_name (Hub), data_files (local files) or data_dir (image folder)")
    if not (src.family or src.family_column):
        raise RecipeError(f"{where}: set `family: NAME` or `family_column: COLUMN`")
    return src


def recipe_from_dict(raw: dict[str, Any], where: str = "recipe") -> RecipeConfig:
    fields = _fields(RecipeConfig)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown_key_error(key, RecipeConfig, where)
        if key == "sources":
            if not isinstance(value, list):
                raise RecipeError(f"{where}: `sources` must be a list of source mappings")
            kwargs[key] = [v if isinstance(v, SourceConfig) else source_from_dict(v, i) for i, v in enumerate(value)]
        else:
            kwargs[key] = _check_type(key, value, fields[key], where)
    recipe = RecipeConfig(**kwargs)
    validate_recipe(recipe)
    return recipe


def validate_recipe(recipe: RecipeConfig) -> None:
    if recipe.max_new_tokens < 1:
        raise RecipeError(f"max_new_tokens must be >= 1, got {recipe.max_new_tokens}")
    if recipe.num_samples < 1:
        raise RecipeError(f"num_samples must be >= 1, got {recipe.num_samples}")
    if recipe.num_samples > 1 and recipe.temperature == 0:
        raise RecipeError("num_samples > 1 needs sampling: set temperature > 0 (greedy gives the same answer each time)")
    if recipe.push_to_hub and not recipe.hub_dataset_id:
        raise RecipeError("push_to_hub: true needs hub_dataset_id: USER/NAME")
    from rsgen.verify import VERIFIERS  # late import: verify imports nothing from config

    names = [recipe.verifier] if isinstance(recipe.verifier, str) else list(recipe.verifier.values())
    for name in names:
        if name not in VERIFIERS:
            raise RecipeError(f"unknown verifier {name!r}; choose one of {', '.join(sorted(VERIFIERS))}")


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """`--key value` / `--key=value` pairs; values are parsed as YAML (`--judge false`, `--sources '[...]'`)."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise RecipeError(f"unexpected argument {arg!r}: overrides look like `--key value`")
        key = arg[2:]
        if "=" in key:
            key, text = key.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise RecipeError(f"override --{key} has no value")
            text = args[i + 1]
            i += 2
        key = key.replace("-", "_")
        out[key] = yaml.safe_load(text) if text != "" else ""
    return out


def load_recipe(path: str | os.PathLike | None, overrides: dict[str, Any] | list[str] | None = None) -> RecipeConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise RecipeError(f"recipe file {str(p)!r} does not exist")
        raw = yaml.safe_load(p.read_text()) or {}
        if not isinstance(raw, dict):
            raise RecipeError(f"recipe {str(p)!r} must be a YAML mapping of keys to values")
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    raw.update(overrides or {})
    return recipe_from_dict(raw, where=str(path) if path else "command line")
