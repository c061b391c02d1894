"""The emitted `_sft` and `_dpo` configs train with TRL exactly as written: loaded with `load_dataset` and handed
to `trl.SFTTrainer` / `trl.DPOTrainer` with a real tiny VLM from the zoo, no reformatting."""

from __future__ import annotations

import math

import datasets
import pytest
import torch

from rsgen.engine.models import load_model_and_processor
from rsgen.layout import OutputLayout

# TRL's trainers: .ci/run runs these on the floors too
pytestmark = pytest.mark.floors


def _trainable_snapshot(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
@pytest.mark.parametrize("view", ["sft", "dpo"])
def test_trl_trains_on_the_emitted_view(view, emitted_run, zoo_model_path, tmp_path):
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    root, _recipe, _images = emitted_run
    dataset = datasets.load_dataset(str(OutputLayout(root).dataset), f"CLEVRMath_{view}", split="train",
                                    download_mode="force_redownload")
    model, processor = load_model_and_processor(zoo_model_path("qwen2_vl"), device="cpu")
    model.train()
    Trainer, Config = (SFTTrainer, SFTConfig) if view == "sft" else (DPOTrainer, DPOConfig)
    args = Config(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=2, use_cpu=True, bf16=False,
                  max_length=None, report_to="none", save_strategy="no", logging_steps=1, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=dataset, processing_class=processor)

    # The collator turns the rows into model inputs with the image inside the sequence.
    batch = trainer.data_collator([dataset[0], dataset[1]])
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert batch["pixel_values"].shape[0] > 0
    assert (batch["input_ids"] == image_token).sum() > 0
    if view == "sft":
        # Prompt-completion rows: only completion tokens carry loss (TRL's default), and they are the model's
        # response exactly.
        for row, ids, labels in zip((dataset[0], dataset[1]), batch["input_ids"], batch["labels"]):
            trained = processor.tokenizer.decode(ids[labels != -100])
            response = row["completion"][0]["content"][0]["text"]
            assert trained.startswith(response) and trained[len(response):].strip() in ("<|im_end|>", "")
            assert row["prompt"][0]["content"][1]["text"] not in trained
            assert (labels[ids == image_token] == -100).all()

    before = _trainable_snapshot(model)
    result = trainer.train()
    assert trainer.state.global_step == 2
    assert math.isfinite(result.training_loss)
    after = _trainable_snapshot(model)
    assert any(not torch.equal(before[n], after[n]) for n in before), "two optimiser steps changed nothing"
