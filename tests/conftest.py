"""Test-wide setup: fully offline, a throwaway HF cache, and shared tiny models built once per session."""

import os
import tempfile

# Set before anything imports huggingface_hub / datasets / evaluate.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="rsgen-hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
