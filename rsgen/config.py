"""Recipes: flat YAML files parsed into dataclasses, with `--key value` overrides from the command line.

The shape follows TRL scripts (`--config recipe.yaml` plus overrides), but the parser is small and strict:
an unknown key is an error that names the key and the closest known ones, so a typo never runs a week-long
job with a default.

Longer than most modules (~620 lines) on purpose: every recipe key is one field here with its help, stage, pins
and readers on one line (the docs' key tables and `--help` are generated from it), next to the checks of the
values; split, a key's declaration and its check would live apart.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEMO_MODEL = "rsgen-demo"
# The demo model's base: the same procedure stopped early (scripts/train_demo_model.py), with room to learn:
# `rsgen iterate --config recipes/demo_iterate.yaml` starts from it.
DEMO_BASE_MODEL = "rsgen-demo-base"
"""Sentinel for the small VLM shipped inside the package (`rsgen.engine.demo_model_path()` resolves it)."""
DEMO_DATASET = "rsgen-demo"
"""`dataset_name` of a source that draws the procedural demo pool (rsgen.demo.pool) instead of reading data."""


class RecipeError(ValueError):
    """A recipe or override that cannot be used; the message names the bad key or value and the fix."""


@dataclass
class SourceConfig:
    """One pool of VQA data (an entry of the recipe's `sources:` list). Each becomes (part of) a family."""

    # Where the rows come from: a Hub dataset, local files, or an image folder.
    dataset_name: str | None = field(default=None, metadata={"help": "Hub dataset id (or `rsgen-demo` for the procedural demo pool)"})
    dataset_config: str | None = field(default=None, metadata={"help": "config (subset) name of the Hub dataset"})
    data_files: list[str] | None = field(default=None, metadata={"help": "local parquet/json/csv files instead of a Hub dataset"})
    data_dir: str | None = field(default=None, metadata={"help": "image folder (`imagefolder` with a metadata file)"})
    split: str = field(default="train", metadata={"help": "split to read"})
    streaming: bool = field(default=False, metadata={"help": "stream the source instead of downloading it whole"})
    max_rows: int | None = field(default=None, metadata={"help": "read at most this many source rows (smoke runs)"})

    # Row layout.
    format: str = field(default="flat", metadata={"help": "row layout: flat (one QA per row), cauldron (images + texts) or llava (image + conversations)"})
    image_column: str = field(default="image", metadata={"help": "flat: column holding the image"})
    question_column: str = field(default="question", metadata={"help": "flat: column holding the question"})
    answer_column: str = field(default="answer", metadata={"help": "flat: column holding the answer (may be a list of acceptable answers)"})
    options_column: str | None = field(default=None, metadata={"help": "column of multiple-choice options (list of strings)"})
    answer_index_base: int | None = field(default=None, metadata={"help": "multiple choice: answers written as digits are option indices counted from this (0 = ScienceQA style, 1); null = answers are option texts or letters"})
    source_id_column: str | None = field(default=None, metadata={"help": "the source's own row id, recorded in clean_meta"})
    image_ref_column: str | None = field(default=None, metadata={"help": "recorded image reference (file name) checked by provenance"})
    conversation_column: str | None = field(default=None, metadata={"help": "cauldron / llava: the list of turns (null = texts / conversations)"})
    family: str | None = field(default=None, metadata={"help": "family name of every row (names the output configs)"})
    family_column: str | None = field(default=None, metadata={"help": "column naming each row's family (instead of `family`)"})

    # Text handling.
    question_template: str = field(default="{question}", metadata={"help": "format of the question; the instruction is appended after it on a new line"})
    answer_normalization: list[str] = field(default_factory=list, metadata={"help": "answer clean-ups, e.g. [strip_answer_prefix, strip_trailing_period]"})

    # Task purity: keep only QA pairs matching these (empty = keep all).
    keep_question_patterns: list[str] = field(default_factory=list, metadata={"help": "regexes; a question matching any is kept (empty = keep all)"})
    source_allowlist: list[str] | None = field(default=None, metadata={"help": "allowed values of source_id_column's dataset prefix"})

    # `dataset_name: rsgen-demo` draws the procedural demo pool instead of reading data.
    demo_num_images: int = field(default=300, metadata={"help": "demo pool: images drawn"})
    demo_seed: int = field(default=1234, metadata={"help": "demo pool: seed of the draw"})


KEY_GROUPS = {
    "run": "where the run lives",
    "model": "the model that answers",
    "prepare": "cleaning the pool into prepared/ (the pools themselves: `sources:`, see below)",
    "generate": "answering every question",
    "verify": "checking answers against the official ones",
    "explore": "sampling beyond the greedy answer: pass rates, on-policy DPO pairs, a GRPO view",
    "judge": "the text-only second look at rejections",
    "blind": "asking the accepted pairs again without the image",
    "emit": "the dataset, its card and the upload",
    "iterate": "`rsgen iterate`: rounds of rejection sampling and fine-tuning on what was accepted",
}
"""The `stage` of every RecipeConfig key: `rsgen run --help` and the key tables of docs/recipes.md group keys under these."""

# Values of the field metadata `read_by` (which stages read a key; default: the stage its `stage` names) and `pin`.
EVERY_STAGE = "*"
MODEL_STAGES = ("generate", "explore", "judge", "blind")  # the stages that load a model (rsgen.engine.build_engine)
# The verifier keys are read by the verify stage, which decides the stored responses again whenever they change (no
# pin of its own: its work is redone, not refused). They pin the explore work: explore decides its samples as they
# land and stops sampling a question on those decisions (`explore_stop: paired`), so other settings would need
# other samples.
VERIFY_PIN = "explore"


@dataclass
class RecipeConfig:
    """Everything a run needs. Every key can be set in the YAML file or overridden as `--key value`.

    Each field carries its description in `metadata`, read by everything that needs it (so a new key is
    documented, and pinned, where it is declared):
    - `stage`: the group it is listed under (`KEY_GROUPS`): `rsgen run --help` and the key tables of docs/recipes.md;
    - `help`: one line;
    - `read_by`: the stages that read it (default: the one `stage` names; `EVERY_STAGE`): each stage's `--help`;
    - `pin`: the key is pinned with that stage's work (True: the stage `stage` names): a rerun that changes it
      while the stage has work on disk is refused (`rsgen.pipeline`), and prepare's fingerprint is made of
      prepare's pins. Keys that change speed, not results (`token_budget`, `checkpoint_every_items`, ...) have none.
    """

    output_dir: str = field(default="runs/demo", metadata={"stage": "run", "read_by": EVERY_STAGE, "help": "everything of a run lives here"})

    model_name_or_path: str = field(default=DEMO_MODEL, metadata={"stage": "model", "pin": "generate", "read_by": (*MODEL_STAGES, "emit"), "help": "Hub id or local directory of an image-text-to-text model; required unless every source is the demo pool; `rsgen-demo` = the shipped 1.1M-parameter demo model (its card says so)"})
    engine: str = field(default="transformers", metadata={"stage": "model", "pin": "generate", "read_by": (*MODEL_STAGES, "emit"), "help": "transformers = load the model here and batch `model.generate`; openai = send requests to OpenAI-compatible servers (vLLM, SGLang, `transformers serve`, hosted APIs; docs/engines.md)"})
    engine_base_url: list[str] = field(default_factory=lambda: ["http://127.0.0.1:8000/v1"], metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — the server's API root, or a list of servers (a key always goes to the same one)"})
    engine_judge_base_url: list[str] | None = field(default=None, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — the judge's server(s); null = engine_base_url"})
    engine_api_key_env: str | None = field(default=None, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — the NAME of the environment variable holding the API key (the key itself is never written anywhere)"})
    engine_max_concurrency: int | str = field(default=64, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — requests in flight per process; auto = found while running: more while throughput grows, half on a 429 or a timeout (the server's knee)"})
    engine_requests_per_minute: float | None = field(default=None, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — most requests a minute per process, evenly spaced (a hosted API's rate limit); null = no limit"})
    engine_tokens_per_minute: float | None = field(default=None, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — most prompt + completion tokens a minute per process (as `usage` counts them); null = no limit"})
    engine_timeout_seconds: float = field(default=600.0, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — most seconds one request may take"})
    engine_max_retries: int = field(default=5, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "engine: openai — retries of a request (backoff) on connection errors, 429 (Retry-After) and 5xx before the run stops"})
    engine_server: str | None = field(default=None, metadata={"stage": "model", "pin": "generate", "read_by": MODEL_STAGES, "help": "engine: openai — vllm, sglang or transformers: rsgen starts that server for the model at engine_base_url on each machine and stops it at the end (log: OUTPUT_DIR/work/server.log); null = use the servers as given"})
    engine_server_args: list[str] = field(default_factory=list, metadata={"stage": "model", "pin": "generate", "read_by": MODEL_STAGES, "help": "engine: openai — extra command-line flags of the server rsgen starts, e.g. [--data-parallel-size, '8']"})
    engine_server_command: list[str] | None = field(default=None, metadata={"stage": "model", "pin": "generate", "read_by": MODEL_STAGES, "help": "engine: openai — the command that starts engine_server, for a server that is not on PATH: a vLLM in its own virtual environment, a container, srun; a list with the placeholders {model} (local path or Hub id), {served_name} (the name requests ask for; without it they ask for {model}), {host} and {port}, e.g. [/opt/vllm-env/bin/vllm, serve, '{model}', --host, '{host}', --port, '{port}', --generation-config, vllm]. null = the built-in command of engine_server"})
    engine_price_prompt_per_million: float | None = field(default=None, metadata={"stage": "model", "read_by": ("emit",), "help": "engine: openai — price of a million prompt tokens (as the server's `usage` counts them), for the cost per stage in stats.json and on the card; null = no cost shown"})
    engine_price_completion_per_million: float | None = field(default=None, metadata={"stage": "model", "read_by": ("emit",), "help": "engine: openai — price of a million completion tokens; null = no cost shown"})
    model_revision: str | None = field(default=None, metadata={"stage": "model", "pin": "generate", "read_by": (*MODEL_STAGES, "emit"), "help": "pin a Hub commit of the model"})
    torch_dtype: str = field(default="auto", metadata={"stage": "model", "pin": "generate", "read_by": MODEL_STAGES, "help": "auto = the dtype the checkpoint was saved in; or bfloat16, float16, float32"})
    attn_implementation: str = field(default="auto", metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "auto = flash_attention_2 when flash_attn imports and CUDA is present, else sdpa"})
    trust_remote_code: bool = field(default=False, metadata={"stage": "model", "read_by": MODEL_STAGES, "help": "allow model code from the Hub repository"})

    sources: list[SourceConfig] = field(default_factory=list, metadata={"stage": "prepare", "pin": True, "read_by": ("prepare", "emit"), "help": "list of pools (YAML mappings of the source keys below)"})
    instruction: str = field(default="Answer in short without any other content.", metadata={"stage": "prepare", "pin": True, "read_by": ("prepare", "emit"), "help": "appended to every question on a new line"})
    max_image_pixels: int = field(default=89_478_485, metadata={"stage": "prepare", "pin": True, "help": "larger images are dropped (PIL's decompression-bomb limit)"})
    max_aspect_ratio: float = field(default=200.0, metadata={"stage": "prepare", "pin": True, "help": "images more elongated than this are dropped"})
    decontaminate: list[SourceConfig] = field(default_factory=list, metadata={"stage": "prepare", "pin": True, "help": "evaluation sets, in the form of `sources` (family not needed): pool images that copy one of their images and pool questions that share half their word 8-grams with one of their questions are dropped (docs/decontamination.md)"})
    blind_check: str = field(default="off", metadata={"stage": "blind", "read_by": ("blind", "emit"), "help": "off | flag | drop: ask every accepted pair again without its image; a pair whose blind answer verifies is blind-solvable: flag counts it (stats, card), drop also removes it from the RS splits and views (reason blind_solvable)"})
    prepare_num_proc: int = field(default=2, metadata={"stage": "prepare", "help": "processes cleaning the pool"})

    enable_thinking: bool = field(default=True, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "explore", "emit", "blind"), "help": "reasoning on: passed to the chat template as enable_thinking"})
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "explore", "emit", "blind"), "help": "more keyword arguments for the chat template"})
    max_new_tokens: int = field(default=2048, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "explore", "emit", "blind"), "help": "most tokens generated per answer"})
    temperature: float = field(default=0.0, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "emit", "blind"), "help": "0 = greedy"})
    top_p: float = field(default=1.0, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "emit", "blind"), "help": "nucleus sampling (with temperature > 0)"})
    num_samples: int = field(default=1, metadata={"stage": "generate", "pin": True, "read_by": ("generate", "verify", "judge", "emit"), "help": "answers per question (> 1 needs temperature > 0)"})
    seed: int = field(default=0, metadata={"stage": "generate", "pin": True, "read_by": MODEL_STAGES, "help": "sampling seed"})
    token_budget: int = field(default=32768, metadata={"stage": "generate", "read_by": MODEL_STAGES, "help": "padded prompt+generation tokens per batch"})
    max_batch_size: int = field(default=256, metadata={"stage": "generate", "read_by": MODEL_STAGES, "help": "most rows per batch"})
    checkpoint_every_items: int = field(default=256, metadata={"stage": "generate", "read_by": (*MODEL_STAGES, "verify"), "help": "write a checkpoint after this many answers"})
    checkpoint_every_seconds: float = field(default=60.0, metadata={"stage": "generate", "read_by": (*MODEL_STAGES, "verify"), "help": "... or after this many seconds"})

    explore_samples: int = field(default=0, metadata={"stage": "explore", "pin": True, "read_by": ("explore", "judge", "emit"), "help": "sampled responses per question beyond the greedy one, at most (0 = no explore pass)"})
    explore_temperature: float = field(default=1.0, metadata={"stage": "explore", "pin": True, "read_by": ("explore", "emit"), "help": "sampling temperature of the explore pass"})
    explore_top_p: float = field(default=1.0, metadata={"stage": "explore", "pin": True, "read_by": ("explore", "emit"), "help": "nucleus sampling of the explore pass"})
    explore_stop: str = field(default="paired", metadata={"stage": "explore", "pin": True, "read_by": ("explore", "emit"), "help": "paired = stop sampling a question once it has a verified-correct and a verified-wrong response; never = draw all explore_samples (exact pass rates)"})

    verifier: str | dict[str, str] = field(default="relaxed", metadata={"stage": "verify", "pin": VERIFY_PIN, "read_by": ("generate", "verify", "explore", "judge", "emit", "blind"), "help": "relaxed, exact, numeric, mc or math; or a mapping family -> verifier (`default:` for the rest). Under every verifier a row with options is checked as multiple choice, so relaxed serves a family mixing multiple choice and free form; mc is refused for a family with rows without options"})
    numeric_tolerance: float = field(default=1e-6, metadata={"stage": "verify", "pin": VERIFY_PIN, "read_by": ("generate", "verify", "explore", "judge", "emit", "blind"), "help": "relative tolerance of the numeric verifier"})
    math_timeout_seconds: float = field(default=5.0, metadata={"stage": "verify", "pin": VERIFY_PIN, "read_by": ("generate", "verify", "explore", "emit", "blind"), "help": "time limit of one math-verify comparison"})

    judge: bool = field(default=True, metadata={"stage": "judge", "read_by": ("judge", "explore", "emit", "blind"), "help": "give verifier rejections a second, text-only look"})
    judge_model_name_or_path: str | None = field(default=None, metadata={"stage": "judge", "pin": True, "read_by": ("judge", "emit"), "help": "null = the generation model; a VLM or a text-only chat LM"})
    judge_chat_template_kwargs: dict[str, Any] = field(default_factory=dict, metadata={"stage": "judge", "pin": True, "help": "chat template keyword arguments of the judge (not inherited from generation)"})
    judge_prompt_file: str | None = field(default=None, metadata={"stage": "judge", "pin": True, "help": "null = the template shipped in rsgen/judge/"})
    judge_max_new_tokens: int = field(default=1024, metadata={"stage": "judge", "pin": True, "help": "most tokens of one verdict"})
    judge_calibration_size: int = field(default=60, metadata={"stage": "judge", "pin": True, "help": "verifier-accepted pairs the judge is calibrated on, and known-wrong pairs per family"})
    judge_calibration_seed: int = field(default=0, metadata={"stage": "judge", "pin": True, "help": "seed drawing the calibration items"})
    judge_scope: str = field(default="undecided", metadata={"stage": "judge", "read_by": ("judge", "explore", "emit", "blind"), "help": "undecided: decisive mismatches (numbers outside the tolerance, different option letters) stay wrong_answer without the judge; all: judge them too"})
    judge_min_specificity: float = field(default=0.95, metadata={"stage": "judge", "read_by": ("judge", "emit", "blind"), "help": "leniency gate: in a family whose judge rejects fewer known-wrong pairs, its promotions are withheld (0 = off)"})
    judge_min_recall: float = field(default=0.5, metadata={"stage": "judge", "read_by": ("judge", "emit"), "help": "report-only: a family whose judge calls fewer known-right pairs CORRECT is reported as one where the judge adds little"})

    shard_size_mb: int = field(default=500, metadata={"stage": "emit", "read_by": ("prepare", "emit"), "help": "parquet shard size of prepared/ and dataset/"})
    views: list[str] | None = field(default=None, metadata={"stage": "emit", "help": "TRL views written next to the three splits, e.g. [sft] (null = all: sft, dpo, and with explore_samples > 0 dpo_onpolicy, grpo); each view stores its images again"})
    grpo_pass_rate_band: list[float] = field(default_factory=lambda: [0.0, 1.0], metadata={"stage": "emit", "help": "[low, high]: the `_grpo` view keeps the questions with low < pass rate < high (both strict; the default keeps every question the model sometimes gets right and sometimes wrong)"})
    sft_keep_reasoning: bool = field(default=True, metadata={"stage": "emit", "help": "`_sft` completion is the full response (true) or the answer alone (false)"})
    num_card_examples: int = field(default=3, metadata={"stage": "emit", "help": "examples shown per family in the card"})
    card_template: str | None = field(default=None, metadata={"stage": "emit", "help": "a Jinja card template of your own, rendered with huggingface_hub's DatasetCard.from_template and the figures of rsgen.emit.card.card_context (null = rsgen/emit/card_template.md)"})
    license: str = field(default="other", metadata={"stage": "emit", "help": "the card's license (a Hub license id)"})
    license_name: str | None = field(default=None, metadata={"stage": "emit", "help": "with license: other, its name on the card (null = derived-from-sources: the sources' and the model's terms)"})
    task_categories: list[str] = field(default_factory=lambda: ["visual-question-answering"], metadata={"stage": "emit", "help": "the card's task categories"})
    language: list[str] = field(default_factory=lambda: ["en"], metadata={"stage": "emit", "help": "the card's languages"})
    push_to_hub: bool = field(default=False, metadata={"stage": "emit", "help": "upload dataset/ at the end"})
    hub_dataset_id: str | None = field(default=None, metadata={"stage": "emit", "help": "USER/NAME of the dataset repository to upload to"})
    hub_progress_every_minutes: float = field(default=10.0, metadata={"stage": "emit", "help": "with push_to_hub, push the card's progress section (progress.json as a table) at most this often while the run lasts (0 = only the finished card)"})
    hub_private: bool = field(default=False, metadata={"stage": "emit", "help": "create the repository private"})
    demo: bool = field(default=False, metadata={"stage": "emit", "help": "the card says this is a demo dataset (it always does when the demo model answered or judged)"})

    iterate_rounds: int = field(default=2, metadata={"stage": "iterate", "help": "fine-tuning rounds: round k answers with model k (model 0 = model_name_or_path) and trains model k+1 on its accepted pairs; rounds 0..iterate_rounds are measured"})
    iterate_train: dict[str, Any] = field(default_factory=dict, metadata={"stage": "iterate", "pin": True, "help": "TRL SFTConfig arguments of each round's fine-tuning, e.g. {learning_rate: 2.0e-5, num_train_epochs: 1} (output_dir is rsgen's)"})
    iterate_from: str = field(default="previous", metadata={"stage": "iterate", "pin": True, "help": "previous = round k fine-tunes model k (STaR-style); base = every round fine-tunes model_name_or_path afresh (ReST-EM)"})
    iterate_sft_rows: str = field(default="accepted", metadata={"stage": "iterate", "pin": True, "help": "accepted = each round fine-tunes on its accepted greedy answers (the _sft view); explored = also, for each question whose greedy answer was not accepted, a sampled response of the explore pass the verifier accepted (the _dpo_onpolicy view's chosen side: needs explore_samples > 0), as ReST-EM keeps the right samples of questions the model usually misses"})
    iterate_dpo: dict[str, Any] | None = field(default=None, metadata={"stage": "iterate", "pin": True, "help": "TRL DPOConfig arguments of a DPO step after each round's SFT, on the round's _dpo_onpolicy pairs of the training slice (needs explore_samples > 0); null = SFT only"})
    iterate_eval_fraction: float = field(default=0.2, metadata={"stage": "iterate", "pin": True, "help": "share of each family's images held out: measured every round, never trained on"})
    iterate_stop_when_worse: bool = field(default=True, metadata={"stage": "iterate", "help": "stop when a round's held-out verifier accept rate falls below the round before"})

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


def _unknown_key_error(key: str, cls, where: str, flag: bool = False, value: Any = None) -> RecipeError:
    """The error for a key `cls` does not have: where it came from (a recipe file, a `sources` entry, `--key` on the
    command line), the closest known keys, and for a source key given where recipe keys go, where it belongs.
    `flag`: the key was a command-line `--key` (with `value`)."""
    name = f"--{key}" if flag else repr(key)
    said = f"unknown key {name} {'on the command line' if flag else 'in ' + where}."
    if cls is RecipeConfig and key in _fields(SourceConfig):
        entry = {"dataset_name": DEMO_DATASET, "family_column": "family"} if key.startswith("demo_") else \
            {"data_files": ["pool.jsonl"], "family": "MyFamily"}
        entry[key] = value if value is not None else "..."
        example = yaml.safe_dump([entry], default_flow_style=True, sort_keys=False, width=1000).strip()
        return RecipeError(
            f"{said} {key!r} is a source key: it belongs inside an entry of `sources:` in the recipe file; on the "
            f"command line give the whole list (it replaces the recipe's): --sources '{example}'"
        )
    close = difflib.get_close_matches(key, sorted(_fields(cls)), n=3)
    prefix = "--" if flag else ""
    hint = f" Did you mean {', '.join(prefix + c if flag else repr(c) for c in close)}?" if close else ""
    listing = "`rsgen run --help` lists every recipe key" if cls is RecipeConfig else \
        "`rsgen run --help` lists every source key at its end"
    return RecipeError(f"{said}{hint} ({listing})")


# The keys that take one of a few words (SourceConfig's `format` included): their documented values. YAML 1.1
# (PyYAML, and so the command line's values too) reads off/no/false as False and on/yes/true as True, so
# `blind_check: off` arrives as a boolean: `_check_type` turns it back into the key's word.
ENUM_KEYS: dict[str, tuple[str, ...]] = {
    "format": ("flat", "cauldron", "llava"),
    "engine": ("transformers", "openai"),
    "engine_server": ("vllm", "sglang", "transformers"),  # or null
    "blind_check": ("off", "flag", "drop"),
    "explore_stop": ("paired", "never"),
    "judge_scope": ("undecided", "all"),
    "iterate_from": ("previous", "base"),
    "iterate_sft_rows": ("accepted", "explored"),
    # `verifier`: the names in rsgen.verifiers.VERIFIERS (none a YAML boolean), checked by validate_recipe
}
_YAML_BOOLEAN_WORDS = {False: ("off", "no", "false", "n"), True: ("on", "yes", "true", "y")}


def enum_word(name: str, value: bool, where: str) -> str:
    """The word of enum key `name` that YAML read as the boolean `value` (`off` for blind_check's False)."""
    choices = ENUM_KEYS[name]
    words = [word for word in choices if word in _YAML_BOOLEAN_WORDS[value]]
    if len(words) != 1:
        raise RecipeError(f"{where}: key {name!r} must be {_one_of(choices)}, got {str(value).lower()} (YAML reads "
                          f"{'/'.join(_YAML_BOOLEAN_WORDS[value][:3])} as {str(value).lower()}, a switch, not a word)")
    return words[0]


def _one_of(choices: tuple[str, ...]) -> str:
    return ", ".join(choices[:-1]) + " or " + choices[-1]


def _check_type(name: str, value: Any, f: dataclasses.Field, where: str) -> Any:
    """Light type check with a message that names the key; YAML already gives us Python types."""
    t = str(f.type)
    if isinstance(value, bool) and name in ENUM_KEYS:
        return enum_word(name, value, where)
    if value is None:
        if "None" in t:
            return None
        raise RecipeError(f"{where}: key {name!r} may not be null (expected {t})")
    if t.startswith("bool"):
        if not isinstance(value, bool):
            raise RecipeError(f"{where}: key {name!r} must be true or false, got {value!r}")
    elif t.startswith("int | str"):  # a number or a word (engine_max_concurrency: auto)
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        elif isinstance(value, bool) or not isinstance(value, (int, str)):
            raise RecipeError(f"{where}: key {name!r} must be an integer or a word, got {value!r}")
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


def source_from_dict(raw: dict[str, Any], index: int = 0, listed_in: str = "sources") -> SourceConfig:
    """An entry of `sources` (or, listed_in="decontaminate", an evaluation set: no family needed)."""
    where = f"{listed_in}[{index}]"
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
    if listed_in == "decontaminate" and not (src.family or src.family_column):
        src.family = "evaluation"  # an evaluation set is read, never emitted: its family names nothing
    if not (src.family or src.family_column):
        raise RecipeError(f"{where}: set `family: NAME` or `family_column: COLUMN`")
    return src


def recipe_from_dict(raw: dict[str, Any], where: str = "recipe", flags: frozenset[str] = frozenset()) -> RecipeConfig:
    """`flags`: the keys that came from the command line (their errors say so)."""
    fields = _fields(RecipeConfig)
    kwargs: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            raise _unknown_key_error(key, RecipeConfig, where, flag=key in flags, value=value)
        if key in ("sources", "decontaminate"):
            if not isinstance(value, list):
                raise RecipeError(f"{where}: `{key}` must be a list of source mappings")
            kwargs[key] = [v if isinstance(v, SourceConfig) else source_from_dict(v, i, key)
                           for i, v in enumerate(value)]
        else:
            kwargs[key] = _check_type(key, value, fields[key], where)
    recipe = RecipeConfig(**kwargs)
    if "model_name_or_path" not in raw and any(s.dataset_name != DEMO_DATASET for s in recipe.sources):
        # The default is the demo model, right for the demo pool only: a real pool must not get it silently.
        raise RecipeError(
            f"{where}: model_name_or_path is not set. Set it to the model that answers, a Hub id or a local "
            "directory of an image-text-to-text model with a chat template (e.g. Qwen/Qwen2.5-VL-7B-Instruct), or "
            f"to `{DEMO_MODEL}` to run the 1.1M-parameter demo model on purpose (its dataset card says it is a demo)"
        )
    validate_recipe(recipe)
    return recipe


def validate_recipe(recipe: RecipeConfig) -> None:
    if recipe.blind_check not in ("off", "flag", "drop"):
        raise RecipeError(f"blind_check must be off, flag or drop, got {recipe.blind_check!r}")
    if recipe.max_new_tokens < 1:
        raise RecipeError(f"max_new_tokens must be >= 1, got {recipe.max_new_tokens}")
    if recipe.num_samples < 1:
        raise RecipeError(f"num_samples must be >= 1, got {recipe.num_samples}")
    if recipe.num_samples > 1 and recipe.temperature == 0:
        raise RecipeError("num_samples > 1 needs sampling: set temperature > 0 (greedy gives the same answer each time)")
    if recipe.judge_scope not in ("undecided", "all"):
        raise RecipeError(f"judge_scope must be undecided or all, got {recipe.judge_scope!r}")
    if not 0 <= recipe.judge_min_specificity <= 1:
        raise RecipeError(f"judge_min_specificity must be between 0 and 1 (0 turns the gate off), "
                          f"got {recipe.judge_min_specificity!r}")
    if recipe.judge_calibration_size < 0:
        raise RecipeError(f"judge_calibration_size must be >= 0, got {recipe.judge_calibration_size}")
    if recipe.judge and recipe.judge_calibration_size == 0 and recipe.judge_min_specificity > 0:
        raise RecipeError("judge_calibration_size: 0 with judge: true leaves the leniency gate nothing to measure, so "
                          "no promotion could ever count; set judge_calibration_size > 0 (default 60), or "
                          "judge_min_specificity: 0 to turn the gate off, or judge: false")
    if not 0 <= recipe.judge_min_recall <= 1:
        raise RecipeError(f"judge_min_recall must be between 0 and 1, got {recipe.judge_min_recall!r}")
    if recipe.explore_samples < 0:
        raise RecipeError(f"explore_samples must be >= 0 (0 = no explore pass), got {recipe.explore_samples}")
    if recipe.explore_samples and recipe.num_samples > 1:
        raise RecipeError("explore_samples > 0 samples beyond ONE greedy answer: set num_samples: 1 (explore "
                          "replaces drawing num_samples per question)")
    if recipe.explore_samples and recipe.explore_temperature <= 0:
        raise RecipeError(f"explore_temperature must be > 0 to sample, got {recipe.explore_temperature}")
    if not 0 < recipe.explore_top_p <= 1:
        raise RecipeError(f"explore_top_p must be in (0, 1], got {recipe.explore_top_p}")
    if recipe.explore_stop not in ("paired", "never"):
        raise RecipeError(f"explore_stop must be paired or never, got {recipe.explore_stop!r}")
    _validate_pass_rate_band(recipe.grpo_pass_rate_band)
    _validate_engine(recipe)
    if recipe.iterate_rounds < 0:
        raise RecipeError(f"iterate_rounds must be >= 0 (0 = measure the base model only), got {recipe.iterate_rounds}")
    if recipe.iterate_from not in ("previous", "base"):
        raise RecipeError(f"iterate_from must be previous or base, got {recipe.iterate_from!r}")
    if recipe.iterate_sft_rows not in ("accepted", "explored"):
        raise RecipeError(f"iterate_sft_rows must be accepted or explored, got {recipe.iterate_sft_rows!r}")
    if not 0 < recipe.iterate_eval_fraction < 1:
        raise RecipeError(f"iterate_eval_fraction must be between 0 and 1 (exclusive), got {recipe.iterate_eval_fraction!r}")
    if recipe.hub_progress_every_minutes < 0:
        raise RecipeError(f"hub_progress_every_minutes must be >= 0 (0 = no progress pushes), got "
                          f"{recipe.hub_progress_every_minutes}")
    if recipe.push_to_hub and not recipe.hub_dataset_id:
        raise RecipeError("push_to_hub: true needs hub_dataset_id: USER/NAME")
    from rsgen.verifiers import VERIFIERS  # late import: verify imports nothing from config

    names = [recipe.verifier] if isinstance(recipe.verifier, str) else list(recipe.verifier.values())
    for name in names:
        if name not in VERIFIERS:
            raise RecipeError(f"unknown verifier {name!r}; choose one of {', '.join(sorted(VERIFIERS))}")
    from rsgen.verifiers.frame import check_settings

    try:  # the verifiers' own check, at load time rather than at the first verified response
        check_settings(recipe.numeric_tolerance, recipe.math_timeout_seconds)
    except ValueError as e:
        raise RecipeError(f"recipe keys numeric_tolerance / math_timeout_seconds: {e}") from None


def _validate_pass_rate_band(band: Any) -> None:
    fix = "give two numbers low < high within [0, 1], e.g. grpo_pass_rate_band: [0.2, 0.8] (default [0, 1])"
    if not isinstance(band, (list, tuple)) or len(band) != 2 or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in band):
        raise RecipeError(f"grpo_pass_rate_band must be [low, high], got {band!r}; {fix}")
    low, high = band
    if not (0 <= low <= 1 and 0 <= high <= 1):
        raise RecipeError(f"grpo_pass_rate_band {list(band)!r} is outside [0, 1] (pass rates are shares); {fix}")
    if low >= high:
        raise RecipeError(f"grpo_pass_rate_band {list(band)!r} has low >= high, so no question could be inside; {fix}")


ENGINE_NAMES = ("transformers", "openai")
ENGINE_SERVERS = ("vllm", "sglang", "transformers")
SERVER_COMMAND_PLACEHOLDERS = ("model", "served_name", "host", "port")


def _validate_engine(recipe: RecipeConfig) -> None:
    if recipe.engine not in ENGINE_NAMES:
        raise RecipeError(f"unknown engine {recipe.engine!r}; choose one of {', '.join(ENGINE_NAMES)}")
    if recipe.engine_server is not None and recipe.engine_server not in ENGINE_SERVERS:
        raise RecipeError(f"engine_server must be one of {', '.join(ENGINE_SERVERS)} or null, got "
                          f"{recipe.engine_server!r}")
    if recipe.engine_server and recipe.engine != "openai":
        raise RecipeError(f"engine_server: {recipe.engine_server} starts a server for engine: openai; set "
                          "engine: openai (or engine_server: null)")
    command = recipe.engine_server_command
    if command is not None:
        if not recipe.engine_server:
            raise RecipeError("engine_server_command starts the server of engine_server; set engine_server to the kind "
                              "it starts (vllm, sglang or transformers), or remove engine_server_command")
        if (not isinstance(command, list) or not command or not all(isinstance(a, (str, int, float)) for a in command)
                or (len(command) == 1 and len(str(command[0]).split()) > 1)):  # one string: not split by a shell
            raise RecipeError(f"engine_server_command must be a non-empty list of arguments, got {command!r}; e.g. "
                              "[/opt/vllm-env/bin/vllm, serve, '{model}', --host, '{host}', --port, '{port}']")
        for arg in command:
            unknown = set(re.findall(r"{([^{}]*)}", str(arg))) - set(SERVER_COMMAND_PLACEHOLDERS)
            if unknown:
                raise RecipeError(f"engine_server_command: {arg!r} has the placeholder {{{sorted(unknown)[0]}}}; "
                                  f"the placeholders are {', '.join('{' + k + '}' for k in SERVER_COMMAND_PLACEHOLDERS)}")
    for key in ("engine_price_prompt_per_million", "engine_price_completion_per_million"):
        price = getattr(recipe, key)
        if price is not None and (isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0):
            raise RecipeError(f"{key} must be a price >= 0 per million tokens (or null), got {price!r}")
    for key in ("engine_base_url", "engine_judge_base_url"):
        urls = getattr(recipe, key)
        if urls is None:
            continue
        if not urls:
            raise RecipeError(f"{key} is an empty list; give a server URL such as http://127.0.0.1:8000/v1")
        for url in urls:
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise RecipeError(f"{key}: {url!r} is not an http(s) URL; give the API root, e.g. "
                                  "http://127.0.0.1:8000/v1")
    concurrency = recipe.engine_max_concurrency
    if concurrency != "auto" and (isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1):
        raise RecipeError(f"engine_max_concurrency must be an integer >= 1 or auto, got {concurrency!r}")
    for key in ("engine_requests_per_minute", "engine_tokens_per_minute"):
        rate = getattr(recipe, key)
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, (int, float)) or rate <= 0):
            raise RecipeError(f"{key} must be a number > 0 (or null for no limit), got {rate!r}")
    if recipe.engine_max_retries < 0:
        raise RecipeError(f"engine_max_retries must be >= 0, got {recipe.engine_max_retries}")
    if recipe.engine_timeout_seconds <= 0:
        raise RecipeError(f"engine_timeout_seconds must be > 0, got {recipe.engine_timeout_seconds}")
    key_env = recipe.engine_api_key_env
    if key_env is not None and not key_env.replace("_", "").isalnum():
        # A key pasted where its variable's name belongs would land in run.json: refuse it, without echoing it.
        raise RecipeError("engine_api_key_env must be the NAME of an environment variable (letters, digits, _), "
                          "not the key itself: `export MY_KEY=...` and set engine_api_key_env: MY_KEY")


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
        out[key.replace("-", "_")] = parse_override_value(text)
    return out


def parse_override_value(text: str) -> Any:
    """A command-line value is YAML: `false` is a bool, `128` an int, `{A: exact}` a mapping, `""` the empty string."""
    return yaml.safe_load(text) if text != "" else ""


def load_recipe(path: str | os.PathLike | None, overrides: dict[str, Any] | list[str] | None = None) -> RecipeConfig:
    raw: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise RecipeError(f"recipe file {str(p)!r} does not exist")
        try:
            raw = yaml.safe_load(p.read_text()) or {}
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
            problem = " ".join(str(getattr(err, "problem", None) or err).split())
            raise RecipeError(f"{where}: YAML syntax error ({problem}); fix that line of the recipe") from err
        if not isinstance(raw, dict):
            raise RecipeError(f"recipe {str(p)!r} must be a YAML mapping of keys to values")
    if isinstance(overrides, list):
        overrides = parse_overrides(overrides)
    raw.update(overrides or {})
    return recipe_from_dict(raw, where=str(path) if path else "command line", flags=frozenset(overrides or ()))


# ---------------------------------------------------------------------- what the field metadata says


def recipe_fields() -> tuple[dataclasses.Field, ...]:
    """RecipeConfig's fields in declaration order (everything that reads the metadata goes through here)."""
    return dataclasses.fields(RecipeConfig)


def pinned_by(f: dataclasses.Field) -> str | None:
    """The stage whose work key `f`'s value is pinned with, or None."""
    pin = f.metadata.get("pin")
    return f.metadata["stage"] if pin is True else pin or None


def readers(f: dataclasses.Field) -> tuple[str, ...] | str:
    """The stages that read key `f` (or EVERY_STAGE)."""
    return f.metadata.get("read_by", (f.metadata["stage"],))


def pinned_keys(stage: str) -> tuple[str, ...]:
    """The recipe keys pinned with `stage`'s work, in declaration order."""
    return tuple(f.name for f in recipe_fields() if pinned_by(f) == stage)


def keys_read_by(stage: str) -> tuple[str, ...]:
    """The recipe keys `stage` reads, in declaration order."""
    return tuple(f.name for f in recipe_fields() if readers(f) == EVERY_STAGE or stage in readers(f))


def recipe_keys_by_stage() -> dict[str, list[dataclasses.Field]]:
    """RecipeConfig's fields grouped by their `stage` metadata, stages in KEY_GROUPS order, fields in declaration order."""
    groups: dict[str, list[dataclasses.Field]] = {stage: [] for stage in KEY_GROUPS}
    for f in recipe_fields():
        groups[f.metadata["stage"]].append(f)
    return groups


def default_of(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def default_text(f: dataclasses.Field) -> str:
    """The default as it would be written in YAML (`null`, `false`, `[]`)."""
    value = default_of(f)
    if value is None:
        return "null"
    if isinstance(value, (list, dict)) and not value:
        return "[]" if isinstance(value, list) else "{}"
    return yaml.safe_dump(value, default_flow_style=True, width=1000).strip().removesuffix("...").strip()


def keys_markdown() -> str:
    """The key tables of docs/recipes.md, generated from the field metadata (scripts/update_readme_keys.py writes them):
    per key its default, the stages that read it (the one whose work it is pinned with in bold) and its help."""

    def default_cell(f):
        default = default_text(f)
        return f"`{default}`" if default else ""

    def read_by(f):
        if readers(f) == EVERY_STAGE:
            return "every stage"
        return ", ".join(f"**{stage}**" if stage == pinned_by(f) else stage for stage in readers(f))

    lines = []
    for stage, fields in recipe_keys_by_stage().items():
        lines += [f"**{stage}**: {KEY_GROUPS[stage]}", "", "| key | default | read by (**pinned**) | |",
                  "| --- | --- | --- | --- |"]
        lines += [f"| `{f.name}` | {default_cell(f)} | {read_by(f)} | {f.metadata['help']} |" for f in fields] + [""]
    lines += ["**sources**: each entry of `sources:`", "", "| key | default | |", "| --- | --- | --- |"]
    lines += [f"| `{f.name}` | {default_cell(f)} | {f.metadata['help']} |" for f in dataclasses.fields(SourceConfig)]
    return "\n".join(lines) + "\n"

