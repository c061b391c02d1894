"""The emitted `_sft` and `_dpo` configs train with TRL exactly as written: loaded with `load_dataset` and handed
to `trl.SFTTrainer` / `trl.DPOTrainer` with a real tiny VLM from the zoo, no reformatting."""

from __future__ import annotations

import math
import re
from pathlib import Path

import datasets
import pytest
import torch

from rsgen.engine.models import load_model_and_processor
from rsgen.layout import OutputLayout

OUTPUTS_DOC = Path(__file__).resolve().parents[2] / "docs" / "outputs.md"

# TRL's trainers: .ci/run runs these on the floors too
pytestmark = pytest.mark.floors


def readme_training_snippet() -> str:
    """docs/outputs.md's TRL snippet (the first code block of its training section), as a user copies it."""
    section = OUTPUTS_DOC.read_text().split("## Training on the outputs with TRL", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.DOTALL).group(1)


def _parameters(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_the_readme_snippet_trains_sft_and_dpo_on_the_emitted_views(emitted_run, zoo_model_path, tmp_path,
                                                                     monkeypatch):
    """docs/outputs.md's code, only its model id and dataset path replaced: a tiny Qwen2-VL from the zoo (whose
    processor needs torchvision through AutoProcessor) and an emitted dataset."""
    from transformers.utils import is_torchvision_available

    root, _recipe, _images = emitted_run
    model_path = zoo_model_path("qwen2_vl")
    code = readme_training_snippet()
    for line, value in (("model_id", model_path), ("dataset", str(OutputLayout(root).dataset))):
        code, n = re.subn(rf"^{line} = .*$", f"{line} = {value!r}", code, count=1, flags=re.MULTILINE)
        assert n == 1, f"the snippet no longer sets {line}"
    if not is_torchvision_available():  # the quickstart's environment: the snippet's loader is what makes it work
        from transformers import AutoProcessor

        with pytest.raises((ImportError, OSError, ValueError)):
            AutoProcessor.from_pretrained(model_path)
    monkeypatch.chdir(tmp_path)  # the snippet writes its output_dirs ("sft", "dpo") where it runs
    untrained, _ = load_model_and_processor(model_path, device="cpu")
    before = _parameters(untrained)
    namespace: dict = {}
    exec(compile(code, "docs/outputs.md (TRL snippet)", "exec"), namespace)

    for name in ("sft", "dpo"):
        trainer = namespace[name]
        assert trainer.state.global_step >= 1, name
        assert math.isfinite(trainer.state.log_history[-1]["train_loss"]), name
        after = _parameters(trainer.model)
        assert any(not torch.equal(before[n], after[n].cpu()) for n in before), f"{name}: training changed nothing"
    # The collator turns the emitted rows into model inputs with the image inside the sequence; for SFT only the
    # completion (the model's response, exactly) carries loss.
    sft, processor = namespace["sft"], namespace["processor"]
    dataset = sft.train_dataset
    rows = datasets.load_dataset(str(OutputLayout(root).dataset), "CLEVRMath_sft", split="train")
    batch = sft.data_collator([dataset[0], dataset[1]])
    image_token = processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert batch["pixel_values"].shape[0] > 0 and (batch["input_ids"] == image_token).sum() > 0
    for row, ids, labels in zip((rows[0], rows[1]), batch["input_ids"], batch["labels"]):
        trained = processor.tokenizer.decode(ids[labels != -100])
        response = row["completion"][0]["content"][0]["text"]
        assert trained.startswith(response) and trained[len(response):].strip() in ("<|im_end|>", "")
        assert row["prompt"][0]["content"][1]["text"] not in trained
        assert (labels[ids == image_token] == -100).all()
