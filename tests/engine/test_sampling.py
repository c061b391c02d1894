"""Reproducible sampling per request: the row-seeded Gumbel-max sampler alone (it samples the right distribution),
and inside the engine on a real tiny VLM (a response depends on (seed, key) only, not on its batch)."""

from __future__ import annotations

import pytest
import torch
from engine_helpers import image_requests

from rsgen.engine import ChatRequest
from rsgen.engine.models import load_model_and_processor
from rsgen.engine.sampling import RowSeededSampler, row_seed, uniform_noise
from rsgen.engine.transformers_engine import TransformersEngine
from rsgen.testing.zoo import ZOO_ARCHS

# transformers' model, processor, generate and cache APIs: .ci/run runs the slow ones on the floors too
pytestmark = pytest.mark.floors

# ---------------------------------------------------------------- the sampler alone


def test_noise_is_a_function_of_seed_step_and_token_only():
    seeds = [row_seed(0, f"k{i}") for i in range(6)]
    full = uniform_noise(seeds, step=3, vocab_size=50)
    # A row's noise is the same alone, in another order, or next to other rows.
    assert torch.equal(uniform_noise(seeds[2:3], 3, 50)[0], full[2])
    assert torch.equal(uniform_noise(seeds[::-1], 3, 50), full.flip(0))
    assert not torch.equal(uniform_noise(seeds, 4, 50), full)  # the next step draws fresh noise
    assert 0 < full.min() and full.max() < 1


def test_noise_is_uniform_and_uncorrelated():
    u = uniform_noise([row_seed(7, f"row{i}") for i in range(400)], step=0, vocab_size=500)
    assert u.mean().item() == pytest.approx(0.5, abs=0.005)
    assert u.var().item() == pytest.approx(1 / 12, abs=0.002)
    neighbours = torch.corrcoef(torch.stack([u[:, :-1].flatten(), u[:, 1:].flatten()]))[0, 1]
    rows = torch.corrcoef(torch.stack([u[:-1].flatten(), u[1:].flatten()]))[0, 1]
    assert abs(neighbours) < 0.01 and abs(rows) < 0.01


def test_samples_follow_softmax_with_temperature_and_top_p():
    """Frequencies over many keys match softmax(logits / T) (restricted and renormalised to the top-p nucleus)."""
    n = 20000
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    seeds = [row_seed(1, f"x{i}") for i in range(n)]
    for temperature, top_p in ((0.7, 1.0), (1.5, 1.0), (1.0, 0.8)):
        probs = torch.softmax(logits[0] / temperature, -1)
        if top_p < 1.0:  # the nucleus: the most likely tokens whose mass first reaches top_p
            keep = (probs.sort(descending=True).values.cumsum(0) - probs.sort(descending=True).values) < top_p
            probs = torch.where(probs >= probs.sort(descending=True).values[keep].min(), probs, 0.0)
            probs = probs / probs.sum()
        out = RowSeededSampler(seeds, 0, temperature, top_p)(torch.zeros(n, 0, dtype=torch.long), logits.expand(n, 5))
        assert torch.isfinite(out).sum(dim=1).eq(1).all()  # one token left per row
        freq = torch.bincount(out.argmax(-1), minlength=5) / n
        assert freq.tolist() == pytest.approx(probs.tolist(), abs=0.012), (temperature, top_p)
        assert freq[probs == 0].sum() == 0


def test_sampler_checks_its_rows_and_temperature():
    with pytest.raises(ValueError, match="temperature > 0"):
        RowSeededSampler([1], 0, 0.0)
    with pytest.raises(ValueError, match="3 rows of logits but 2 row seeds"):
        RowSeededSampler([1, 2], 0, 1.0)(torch.zeros(3, 1, dtype=torch.long), torch.zeros(3, 4))


# ---------------------------------------------------------------- inside the engine


@pytest.fixture(scope="module")
def vlm(zoo_model_path):
    return load_model_and_processor(zoo_model_path("qwen2_vl"))


def sample(vlm, requests, **kw) -> dict[str, str]:
    model, processor = vlm
    kw = {"max_new_tokens": 10, "temperature": 1.0, "seed": 3, "token_budget": 10**6, **kw}
    engine = TransformersEngine(model, processor, chat_template_kwargs={"enable_thinking": True}, **kw)
    out = {}
    for request, result in engine.generate(requests):
        key = result.sample_key or request.key
        assert key not in out
        out[key] = result.text
    return out


@pytest.mark.slow
def test_a_response_depends_on_its_key_not_its_batch(vlm):
    requests = image_requests(6, seed=4)
    together = sample(vlm, requests)
    assert sample(vlm, requests[::-1], max_batch_size=2) == together  # other batches, other order
    assert sample(vlm, [requests[3]]) == {requests[3].key: together[requests[3].key]}  # alone
    assert sample(vlm, requests, top_p=0.9) != together
    assert sample(vlm, requests, seed=4) != together
    # Different keys, same prompt: different draws.
    same_prompt = [ChatRequest(f"same#{i}", requests[0].messages, requests[0].images) for i in range(6)]
    assert len(set(sample(vlm, same_prompt).values())) > 2


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_shared_prompt_samples_equal_separate_requests(arch, zoo_model_path):
    """A request with sample keys (encoded and prefilled once, the cache repeated per sample) gives each key the
    response a separate request with that key gets — on every architecture (M-RoPE models included) and with
    left padding (prompts of different lengths in one batch)."""
    vlm = load_model_and_processor(zoo_model_path(arch))
    base = image_requests(4, seed=9)
    shared = [ChatRequest(r.key, r.messages, r.images, sample_keys=tuple(f"{r.key}#{s}" for s in range(1, 4)))
              for r in base]
    separate = [ChatRequest(f"{r.key}#{s}", r.messages, r.images) for r in base for s in range(1, 4)]
    got = sample(vlm, shared)
    assert got == sample(vlm, separate)
    assert len(got) == 12 and len(set(got.values())) > 4


@pytest.mark.slow
def test_sample_keys_need_sampling(vlm):
    model, processor = vlm
    engine = TransformersEngine(model, processor, max_new_tokens=4)
    request = image_requests(1)[0]
    request.sample_keys = ("a", "b")
    with pytest.raises(ValueError, match="asks for 2 samples but the engine decodes greedily"):
        list(engine.generate([request]))
