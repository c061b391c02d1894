"""Test-wide setup: fully offline, a throwaway HF cache, and shared tiny models built once per session."""

import os
import tempfile

import pytest

# Set before anything imports huggingface_hub / datasets / evaluate.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HOME", tempfile.mkdtemp(prefix="rsgen-hf-home-"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def tiny_vlm_factory(tmp_path_factory):
    """`factory(arch, seed=0) -> path`: a zoo model (see `rsgen.testing.zoo`), built once per session.

    Shared by every test of the session: treat the directory as read-only (copy it to change files).
    """
    from rsgen.testing.zoo import build_tiny_vlm

    built: dict[tuple[str, int], str] = {}

    def factory(arch: str, seed: int = 0) -> str:
        if (arch, seed) not in built:
            built[arch, seed] = build_tiny_vlm(arch, tmp_path_factory.mktemp(f"zoo-{arch}-{seed}"), seed=seed)
        return built[arch, seed]

    return factory


@pytest.fixture(scope="session")
def zoo_model_path(tiny_vlm_factory):
    """Alias of `tiny_vlm_factory`: `zoo_model_path("qwen2_vl")` is the path of that zoo model."""
    return tiny_vlm_factory


@pytest.fixture(scope="session")
def tiny_vlm_path(tiny_vlm_factory):
    """Alias of `tiny_vlm_factory`: `tiny_vlm_path("qwen2_vl")` is the path of that zoo model."""
    return tiny_vlm_factory
