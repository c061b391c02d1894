"""The written schema between stages: features of the prepared pool and of the emitted splits, the fields of the
work records, and how to read the prepared pool. A stage reads another stage's output only through what is
defined here."""

from __future__ import annotations

import os
from pathlib import Path

from datasets import Features, Image, List, Value

from rsgen.layout import OutputLayout
from rsgen.shards import shard_glob

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

PREPARED_SHARD_PREFIX = "data"  # OUTPUT_DIR/prepared/data-00000-of-00003.parquet


def prepared_shards(output_dir: str | os.PathLike) -> list[Path]:
    """The prepared pool's shard files, in order."""
    return sorted(OutputLayout(output_dir).prepared.glob(shard_glob(PREPARED_SHARD_PREFIX)))


def load_prepared(output_dir: str | os.PathLike):
    """The prepared pool as a `datasets.Dataset`, rows in shard order (sorted by family, then image sha256)."""
    import datasets
    import pyarrow.parquet as pq

    files = [str(p) for p in prepared_shards(output_dir)]
    if not files:
        prepared = OutputLayout(output_dir).prepared
        raise FileNotFoundError(f"no prepared pool in {str(prepared)!r}: run `rsgen prepare --config RECIPE` first")
    if sum(pq.ParquetFile(f).metadata.num_rows for f in files) == 0:
        # The parquet builder refuses a split with no rows; an empty pool is still a valid (empty) dataset.
        return datasets.Dataset(PREPARED_FEATURES.arrow_schema.empty_table())
    return datasets.load_dataset("parquet", data_files=files, split="train", features=PREPARED_FEATURES)


def user_turn(question: str) -> list[dict]:
    """The conversation the model is asked: one user turn, the image then the question (byte-identical to the
    emitted `question`). Generation sends it; the TRL views store it as `prompt`."""
    return [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": question}]}]


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
