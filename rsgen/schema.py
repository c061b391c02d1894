"""The written schema between stages: features of the prepared pool and of the emitted splits, and the fields of
the work records. A stage reads another stage's output only through what is defined here."""

from __future__ import annotations

from datasets import Features, Image, List, Value

POLICY_VERSION = "rsgen-clean-v1"

# One row per image of the cleaned pool (OUTPUT_DIR/prepared/*.parquet).
PREPARED_QA = {
    "id": Value("string"),  # stable across runs, process counts and machines
    "question": Value("string"),  # byte-identical to the user text the model receives (instruction included)
    "answers": List(Value("string")),  # official answer(s); answers[0] is the canonical `answer`
    "options": List(Value("string")),  # multiple-choice option texts in letter order, else empty
    "source_row_id": Value("string"),
}
CLEAN_META = {
    "source_dataset": Value("string"),
    "source_config": Value("string"),
    "source_split": Value("string"),
    "source_row_ids": List(Value("string")),
    "family": Value("string"),
    "policy_version": Value("string"),
    "steps": List(Value("string")),  # cleaning steps that admitted or changed the row, e.g. "mc_normalise"
}
PREPARED_FEATURES = Features(
    {
        "image": Image(),
        "image_sha256": Value("string"),
        "family": Value("string"),
        "qa": List(PREPARED_QA),
        "clean_meta": CLEAN_META,
    }
)

# Emitted splits add the model and verifier to clean_meta.
EMITTED_CLEAN_META = {**CLEAN_META, "model": Value("string"), "verifier": Value("string")}


def split_features(kind: str) -> Features:
    """Features of `{Family}_RS_think`, `{Family}_RS_nothink` and `{Family}_rejected` (kind = think|nothink|rejected)."""
    qa = {"question": Value("string"), "answer": Value("string")}
    if kind == "think":
        qa["response"] = Value("string")
    elif kind == "rejected":
        qa["wrong_vlm"] = Value("string")
        qa["reason"] = Value("string")
    elif kind != "nothink":
        raise ValueError(f"unknown split kind {kind!r}")
    return Features(
        {
            "image": Image(),
            "image_sha256": Value("string"),
            "qa": List(qa),
            "clean_meta": EMITTED_CLEAN_META,
        }
    )


# Work records (JSON Lines, rsgen.store.CheckpointStore). Every record has "key".
GENERATE_RECORD_FIELDS = (
    "key",  # QA id, or "{id}#{sample}" when num_samples > 1
    "id",
    "sample",
    "family",
    "question",  # the exact user text sent (checked against the emitted question)
    "response",  # raw model output, reasoning included
    "extracted",  # final answer after extraction, or None
    "match",  # verifier decision
    "reason",  # None when matched, else wrong_answer | no_answer | ...
    "verifier",
    "prompt_tokens",
    "generated_tokens",
    "hit_limit",  # generation stopped at max_new_tokens
    "model",
    "revision",
)
JUDGE_RECORD_FIELDS = (
    "key",  # "{id}" for a rejected pair, "calibration:{id}" for a calibration pair
    "id",
    "kind",  # rejected | calibration
    "reference",
    "candidate",
    "verdict",  # CORRECT | WRONG | UNSURE
    "response",  # raw judge output
    "prompt_tokens",
    "generated_tokens",
    "hit_limit",
    "model",
)
