"""Test-wide setup: fully offline, a throwaway HF cache, and shared tiny models built once per session."""

import os
import tempfile
from pathlib import Path

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


# Tests of these folders run tiny models: one torch thread is faster for them, and on a busy 2-core machine much
# faster (two OpenMP threads spin against other processes); subprocesses get OMP_NUM_THREADS=1 for the same reason.
ONE_THREAD_FOLDERS = {"engine", "generate", "explore"}


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread(request):
    if Path(str(request.path)).parent.name not in ONE_THREAD_FOLDERS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    old_env = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(1)
    os.environ["OMP_NUM_THREADS"] = "1"
    yield
    torch.set_num_threads(before)
    if old_env is None:
        os.environ.pop("OMP_NUM_THREADS", None)
    else:
        os.environ["OMP_NUM_THREADS"] = old_env
