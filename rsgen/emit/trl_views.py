"""TRL-ready views of the splits: `{Family}_sft` (conversational prompt-completion) and `{Family}_dpo`
(conversational preference pairs), in the vision formats `trl.SFTTrainer` and `trl.DPOTrainer` train on as they are;
with an explore pass also `{Family}_dpo_onpolicy` (the model's own right and wrong responses) and `{Family}_grpo`
(prompts whose pass rate lies inside `grpo_pass_rate_band`, default 0 < pass rate < 1, for `trl.GRPOTrainer`).

Format:
- messages are `{"role", "content"}` with content as a list of parts `{"type": "image"|"text", "text": ...}`;
  an image part is a placeholder (TRL's collators fill it from the `images` column, one image per placeholder);
- `images` is a list holding the row's image.

SFT: one accepted QA pair per row, `prompt` the user turn (image + question) and `completion` the assistant turn,
so TRL computes the loss on the completion only (its default for prompt-completion data), every question is seen
alone with its image as at inference, and a chat template that strips reasoning from earlier assistant turns
has none to strip. DPO: the prompt is the user turn, `chosen` the official answer, `rejected` what the model
answered instead.

A new view is one entry in `VIEWS`: its features and a function from (image, the image's split rows) to its rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from datasets import Features, Image, List, Value

CONTENT_PART = {"type": Value("string"), "text": Value("string")}
MESSAGE = {"role": Value("string"), "content": List(CONTENT_PART)}

SFT_FEATURES = Features({"prompt": List(MESSAGE), "completion": List(MESSAGE), "images": List(Image())})
DPO_FEATURES = Features(
    {"prompt": List(MESSAGE), "chosen": List(MESSAGE), "rejected": List(MESSAGE), "images": List(Image())}
)


def _user(question: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "image", "text": None}, {"type": "text", "text": question}]}


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def sft_rows(image: dict[str, Any], think_qa: list[dict[str, Any]], keep_reasoning: bool) -> list[dict[str, Any]]:
    """One prompt-completion row per accepted pair (`think_qa` is the image's RS_think `qa` list); the completion
    is the model's response byte for byte (reasoning included), or the official answer without reasoning."""
    return [
        {"prompt": [_user(qa["question"])],
         "completion": [_assistant(qa["response"] if keep_reasoning else qa["answer"])],
         "images": [image]}
        for qa in think_qa
    ]


def dpo_rows(image: dict[str, Any], rejected_qa: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One preference pair per rejected pair with an extractable wrong answer that differs from the official one.

    Returns the rows and the counts of pairs left out, by why (`no_answer`: nothing to prefer against;
    `bad_input`: the official answer is one the verifier could not use, so it cannot be the preferred side;
    `same_as_answer`: the model's text equals the official answer, e.g. an MC letter the verifier found ambiguous
    — a pair with chosen == rejected teaches nothing)."""
    rows, skipped = [], {"no_answer": 0, "bad_input": 0, "same_as_answer": 0}
    for qa in rejected_qa:
        wrong = qa["wrong_vlm"]
        if qa["reason"] == "bad_input":
            skipped["bad_input"] += 1
            continue
        if wrong is None or not wrong.strip():
            skipped["no_answer"] += 1
            continue
        if wrong == qa["answer"]:
            skipped["same_as_answer"] += 1
            continue
        rows.append(
            {
                "prompt": [_user(qa["question"])],
                "chosen": [_assistant(qa["answer"])],
                "rejected": [_assistant(wrong)],
                "images": [image],
            }
        )
    return rows, skipped


DPO_ONPOLICY_FEATURES = Features(
    {"prompt": List(MESSAGE), "chosen": List(MESSAGE), "rejected": List(MESSAGE), "images": List(Image()),
     "answer": Value("string"), "pass_rate": Value("float64")}
)
GRPO_FEATURES = Features(
    {"prompt": List(MESSAGE), "images": List(Image()), "solution": Value("string"), "options": List(Value("string")),
     "pass_rate": Value("float64")}
)


def dpo_onpolicy_rows(image: dict[str, Any], explored_qa: list[dict[str, Any]]
                      ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One preference pair per explored question with a verified-correct and a verified-wrong response of the
    model itself (reasoning included): `chosen` one the verifier accepted, `rejected` one routed `wrong_answer`.
    Left out, by why: `no_correct_response`, `no_wrong_response`."""
    rows, skipped = [], {"no_correct_response": 0, "no_wrong_response": 0}
    for qa in explored_qa:
        if qa["chosen"] is None:
            skipped["no_correct_response"] += 1
        elif qa["rejected"] is None:
            skipped["no_wrong_response"] += 1
        else:
            rows.append({"prompt": [_user(qa["question"])], "chosen": [_assistant(qa["chosen"])],
                         "rejected": [_assistant(qa["rejected"])], "images": [image], "answer": qa["answer"],
                         "pass_rate": qa["pass_rate"]})
    return rows, skipped


def grpo_rows(image: dict[str, Any], explored_qa: list[dict[str, Any]], band: tuple[float, float] = (0.0, 1.0)
              ) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One prompt per explored question whose pass rate lies strictly inside `band` (recipe key
    `grpo_pass_rate_band`, default (0, 1): the questions the model sometimes gets right and sometimes wrong, whose
    sampled rewards still differ, so a GRPO group has an advantage to learn from; both ends strict, as OpenRLHF's
    `--dynamic_filtering_reward_range`). `solution` is the official answer that `rsgen.verifiers.rewards.<verifier>`
    reads. Left out: `below_band` (pass rate <= low), `above_band` (pass rate >= high)."""
    low, high = band
    rows, skipped = [], {"below_band": 0, "above_band": 0}
    for qa in explored_qa:
        if qa["pass_rate"] <= low:
            skipped["below_band"] += 1
        elif qa["pass_rate"] >= high:
            skipped["above_band"] += 1
        else:
            rows.append({"prompt": [_user(qa["question"])], "images": [image], "solution": qa["answer"],
                         "options": list(qa["options"]), "pass_rate": qa["pass_rate"]})
    return rows, skipped


@dataclass(frozen=True)
class View:
    features: Features
    reads: str  # the split kind whose `qa` list the view is made from
    rows: Callable[..., tuple[list[dict[str, Any]], dict[str, int]]]  # (image, qa, recipe) -> rows, left out by why


VIEWS: dict[str, View] = {
    "sft": View(SFT_FEATURES, "RS_think",
                lambda image, qa, recipe: (sft_rows(image, qa, recipe.sft_keep_reasoning), {})),
    "dpo": View(DPO_FEATURES, "rejected", lambda image, qa, recipe: dpo_rows(image, qa)),
    # With an explore pass (explore_samples > 0); "explored" is every QA pair with its samples' outcome.
    "dpo_onpolicy": View(DPO_ONPOLICY_FEATURES, "explored", lambda image, qa, recipe: dpo_onpolicy_rows(image, qa)),
    "grpo": View(GRPO_FEATURES, "explored",
                 lambda image, qa, recipe: grpo_rows(image, qa, tuple(recipe.grpo_pass_rate_band))),
}
"""Emit's table of views: name -> how to build it. The recipe key `views` picks which are written."""
