"""Engine tests run tiny models: one torch thread is faster for them, and on a busy 2-core machine much faster
(two OpenMP threads spin against other processes); subprocesses get OMP_NUM_THREADS=1 for the same reason."""

import os

import pytest
import torch


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
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
