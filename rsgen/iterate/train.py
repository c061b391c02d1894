"""One round's fine-tuning: TRL's `SFTTrainer` on the accepted `_sft` rows of the training slice, then, with
`iterate_dpo` (and an explore pass), TRL's `DPOTrainer` on the round's `_dpo_onpolicy` rows of the training slice.

The rows are the round's own emitted configs as they are (`_sft`: prompt-completion, the completion being the
model's accepted response; `_dpo_onpolicy`: a verified-correct and a verified-wrong response of the model), less
the held-out images. Training goes through the Trainer's `accelerate`, so `accelerate launch -m rsgen iterate`
trains data-parallel on every process; it checkpoints into OUTPUT_DIR/rounds/k/training/ (training_dpo/) and a
rerun resumes from the last complete checkpoint (`resume_from_checkpoint`).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, RecipeError

logger = logging.getLogger(__name__)

# rsgen's defaults under the recipe's `iterate_train` (which overrides any of them):
#   max_length None: truncating a VLM sequence can cut image tokens out, which the model cannot process;
#   save_total_limit 2: resuming needs the last checkpoint only (two, in case a kill lands inside a save);
#   on a machine without CUDA: the CPU, in float32 (TRL would ask for bf16, which the CPU trains slowly or not).
RSGEN_DEFAULTS = {"max_length": None, "save_total_limit": 2, "report_to": "none"}
CPU_DEFAULTS = {"use_cpu": True, "bf16": False}
RESERVED = ("output_dir",)  # rsgen's: each round trains into its own folder


@dataclasses.dataclass(frozen=True)
class TrainingKind:
    name: str  # "sft" | "dpo": the record in iterate.json
    key: str  # the recipe key holding the TRL config's arguments
    config: str  # the TRL config class
    trainer: str  # the TRL trainer class
    view: str  # the suffix of the dataset configs it trains on


SFT = TrainingKind("sft", "iterate_train", "SFTConfig", "SFTTrainer", "_sft")
DPO = TrainingKind("dpo", "iterate_dpo", "DPOConfig", "DPOTrainer", "_dpo_onpolicy")


def train_arguments(recipe: RecipeConfig, kind: TrainingKind, output_dir: str | os.PathLike) -> dict[str, Any]:
    """The TRL config's keyword arguments of a round: rsgen's defaults, then the recipe's `iterate_train` /
    `iterate_dpo`."""
    import torch

    given = getattr(recipe, kind.key) or {}
    reserved = [key for key in RESERVED if key in given]
    if reserved:
        raise RecipeError(f"{kind.key}: {', '.join(reserved)} is set by rsgen (each round trains into "
                          f"OUTPUT_DIR/rounds/K/); remove it from {kind.key}")
    defaults = {**RSGEN_DEFAULTS, "seed": recipe.seed, **({} if torch.cuda.is_available() else CPU_DEFAULTS)}
    return {**defaults, **given, "output_dir": str(output_dir)}


def train_config(recipe: RecipeConfig, kind: TrainingKind, output_dir: str | os.PathLike):
    """`trl.SFTConfig` / `trl.DPOConfig` of a round; a key it does not have, or a value it refuses, is a
    RecipeError."""
    import trl

    config_class = getattr(trl, kind.config)
    arguments = train_arguments(recipe, kind, output_dir)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(arguments) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(known), n=3)
        hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
        raise RecipeError(f"{kind.key}: {', '.join(map(repr, unknown))} is not an argument of trl.{kind.config}.{hint} "
                          f"{kind.key} takes {kind.config}'s arguments (learning_rate, num_train_epochs, ...)")
    try:
        return config_class(**arguments)
    except (ValueError, TypeError) as err:
        raise RecipeError(f"{kind.key} {getattr(recipe, kind.key)!r}: trl.{kind.config} refused it: "
                          f"{' '.join(str(err).split())}") from None


def image_sha256s(row: dict[str, Any]) -> list[str]:
    """The sha256 of every image of a row (`images` undecoded: the bytes as stored, as `image_sha256` hashes them)."""
    return [hashlib.sha256(image["bytes"]).hexdigest() for image in row["images"]]


def training_rows(dataset_dir: Path, held_out: set[str], kind: TrainingKind = SFT):
    """The round's `{Family}_sft` (`_dpo_onpolicy`) rows (every family, in config order) none of whose images is
    held out (every image of a row is compared by content hash, not only the first); None when the round wrote no
    such config."""
    import datasets
    from datasets import Image, List

    configs = sorted(p.name for p in (dataset_dir / "data").iterdir() if p.name.endswith(kind.view))
    if not configs:
        return None
    files = [str(f) for config in configs for f in sorted((dataset_dir / "data" / config).glob("*.parquet"))]
    rows = datasets.load_dataset("parquet", data_files=files, split="train")
    raw = rows.cast_column("images", List(Image(decode=False)))
    kept = raw.filter(lambda row: held_out.isdisjoint(image_sha256s(row)))
    return kept.cast_column("images", List(Image()))


def _prompt_key(row: dict[str, Any]) -> tuple[tuple[str, ...], str]:
    """A training row's question: its images' sha256s and the text of its prompt."""
    text = " ".join(part["text"] or "" for message in row["prompt"] for part in message["content"])
    return tuple(image_sha256s(row)), text


def sft_training_rows(dataset_dir: Path, held_out: set[str], sft_rows: str = "accepted"):
    """The SFT rows of a round (`iterate_sft_rows`): `accepted`, the `_sft` view (the accepted greedy answers);
    `explored`, those plus, for each question whose greedy answer is not among them, the explore pass's sampled
    response the verifier accepted (the `_dpo_onpolicy` view's chosen side), as prompt-completion rows. ReST-EM and
    M-STaR train on such samples: the greedy answers hold only what the model already gets right, a right sample of
    a question it usually misses is what it can learn from. None when there is no row at all."""
    accepted = training_rows(dataset_dir, held_out, SFT)
    if sft_rows == "accepted":
        return accepted
    import datasets

    explored = training_rows(dataset_dir, held_out, DPO)
    if explored is None or len(explored) == 0:
        return accepted
    known = set() if accepted is None else {_prompt_key(row) for row in accepted.cast_column(
        "images", datasets.List(datasets.Image(decode=False)))}
    raw = explored.cast_column("images", datasets.List(datasets.Image(decode=False)))
    missed = raw.filter(lambda row: _prompt_key(row) not in known)
    added = missed.select_columns(["prompt", "chosen", "images"]).rename_column("chosen", "completion")
    added = added.cast_column("images", datasets.List(datasets.Image()))
    logger.info("iterate: %d accepted greedy answers and %d sampled right answers of questions the greedy answer "
                "missed", 0 if accepted is None else len(accepted), len(added))
    if accepted is None:
        return added
    return datasets.concatenate_datasets([accepted, added.cast(accepted.features)])


def last_checkpoint(output_dir: Path) -> str | None:
    """The newest complete TRL checkpoint in `output_dir`, or None. The Trainer writes trainer_state.json last into
    a checkpoint folder, so a kill inside a save leaves the newest folder without it (or with it cut short):
    transformers' `get_last_checkpoint` would pick that one and the resume would fail; the one before is whole."""
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    found = []
    for path in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*") if output_dir.is_dir() else ():
        step = path.name.rpartition("-")[2]
        if step.isdigit() and path.is_dir():
            found.append((int(step), path))
    for _step, path in sorted(found, reverse=True):
        try:
            json.loads((path / "trainer_state.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            logger.warning("iterate: %s is incomplete (killed while it was saved?): not resuming from it", path)
            continue
        return str(path)
    return None


def train_round(recipe: RecipeConfig, kind: TrainingKind, start_model: str, rows, output_dir: Path, model_out: Path,
                state) -> dict:
    """Fine-tune `start_model` on `rows` with TRL's trainer of `kind`, resuming from the last checkpoint in `output_dir`; save the result to
    `model_out` (written beside it and renamed, so `model_out` is always a complete model). Returns the
    training record of iterate.json: rows, steps, per-step loss, where it resumed from."""
    import trl

    from rsgen.engine.models import load_model_and_processor, resolve_model_path

    args = train_config(recipe, kind, output_dir)
    model, processor = load_model_and_processor(resolve_model_path(start_model), torch_dtype=recipe.torch_dtype,
                                                attn_implementation=recipe.attn_implementation,
                                                trust_remote_code=recipe.trust_remote_code, device="cpu")
    # DPO's reference model is the start model as loaded (TRL copies it when ref_model is None).
    trainer = getattr(trl, kind.trainer)(model=model, args=args, train_dataset=rows, processing_class=processor)
    resume = last_checkpoint(output_dir)
    if resume:
        logger.info("iterate: resuming the %s training from %s", kind.name, resume)
    result = trainer.train(resume_from_checkpoint=resume)
    partial = model_out.with_name(model_out.name + ".partial")
    if state.is_main_process:
        shutil.rmtree(partial, ignore_errors=True)
    state.wait_for_everyone()
    trainer.save_model(str(partial))  # every rank calls it; the main process writes
    if state.is_main_process:
        processor.save_pretrained(str(partial))
        shutil.rmtree(model_out, ignore_errors=True)
        partial.replace(model_out)
        # The model is saved: its checkpoints (optimizer state, the size of the model again or more) are spent.
        for checkpoint in output_dir.glob("checkpoint-*"):
            shutil.rmtree(checkpoint, ignore_errors=True)
    state.wait_for_everyone()
    losses = [(h["step"], h["loss"]) for h in trainer.state.log_history if "loss" in h]
    return {
        "rows": len(rows),
        "processes": trainer.args.world_size,  # the Trainer's accelerate: every process of the launch trains
        "steps": trainer.state.global_step,
        "train_loss": result.training_loss,
        "losses": losses,
        "resumed_from": Path(resume).name if resume else None,
    }
