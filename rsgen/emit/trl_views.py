"""TRL-ready views of the splits: `{Family}_sft` (conversational language modelling) and `{Family}_dpo`
(conversational preference pairs), in the vision formats TRL 1.16 trains on as they are.

Format (what `trl.SFTTrainer` / `trl.DPOTrainer` with a vision-language model expect):
- messages are `{"role", "content"}` with content as a list of parts `{"type": "image"|"text", "text": ...}`;
  an image part is a placeholder (TRL's collators fill it from the `images` column, one image per placeholder);
- `images` is a list holding the row's image.

SFT: one conversation per image; the first user turn carries the image placeholder, later turns are text only
(one placeholder per image — TRL checks that counts match). DPO: the prompt is the user turn (image + question),
`chosen` the official answer, `rejected` what the model answered instead.
"""

from __future__ import annotations

from typing import Any

from datasets import Features, Image, List, Value

CONTENT_PART = {"type": Value("string"), "text": Value("string")}
MESSAGE = {"role": Value("string"), "content": List(CONTENT_PART)}

SFT_FEATURES = Features({"messages": List(MESSAGE), "images": List(Image())})
DPO_FEATURES = Features(
    {"prompt": List(MESSAGE), "chosen": List(MESSAGE), "rejected": List(MESSAGE), "images": List(Image())}
)


def _user(question: str, with_image: bool) -> dict[str, Any]:
    parts = [{"type": "image", "text": None}] if with_image else []
    parts.append({"type": "text", "text": question})
    return {"role": "user", "content": parts}


def _assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": text}]}


def sft_row(image: dict[str, Any], think_qa: list[dict[str, Any]], keep_reasoning: bool) -> dict[str, Any]:
    """One conversation over the accepted pairs of an image (`think_qa` is the row's RS_think `qa` list)."""
    messages = []
    for turn, qa in enumerate(think_qa):
        messages.append(_user(qa["question"], with_image=turn == 0))
        messages.append(_assistant(qa["response"] if keep_reasoning else qa["answer"]))
    return {"messages": messages, "images": [image]}


def dpo_rows(image: dict[str, Any], rejected_qa: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One preference pair per rejected pair with an extractable wrong answer that differs from the official one.

    Returns the rows and the counts of pairs left out, by why (`no_answer`: nothing to prefer against;
    `same_as_answer`: the model's text equals the official answer, e.g. an MC letter the verifier found ambiguous
    — a pair with chosen == rejected teaches nothing)."""
    rows, skipped = [], {"no_answer": 0, "same_as_answer": 0}
    for qa in rejected_qa:
        wrong = qa["wrong_vlm"]
        if wrong is None or not wrong.strip():
            skipped["no_answer"] += 1
            continue
        if wrong == qa["answer"]:
            skipped["same_as_answer"] += 1
            continue
        rows.append(
            {
                "prompt": [_user(qa["question"], with_image=True)],
                "chosen": [_assistant(qa["answer"])],
                "rejected": [_assistant(wrong)],
                "images": [image],
            }
        )
    return rows, skipped
