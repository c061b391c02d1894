"""Reproducible sampling per request: each sampled row's random stream is fixed by (seed, its key) alone.

`torch.manual_seed` + `model.generate(do_sample=True)` draws from one stream shared by the whole batch, so a
row's sample depends on which rows it was batched with — and a resumed run re-batches. Here each row gets its
own stream: Gumbel-max sampling (argmax of logits / temperature + Gumbel noise is an exact sample of
softmax(logits / temperature)), with the noise of token `v` at generated step `t` of a row computed by a
counter-based hash of (the row's seed, t, v). No generator state is carried: the same key gives the same noise
whatever the batch, its order, the process count, a restart or an out-of-memory split.

`RowSeededSampler` is a `transformers` LogitsProcessor. It applies temperature and top-p (the library's own
warpers, which treat rows independently), adds the noise and leaves a single finite logit per row — the sample —
so the greedy selection `generate` runs after it picks exactly that token.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch
from transformers import LogitsProcessor, TemperatureLogitsWarper, TopPLogitsWarper

_MASK32 = 0xFFFF_FFFF


def row_seed(seed: int, key: str) -> int:
    """The 64-bit seed of the row keyed `key` under the run's `seed` (sha256: stable across Python runs)."""
    digest = hashlib.sha256(f"{seed}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little")


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), in int64 without overflow (split c into 16-bit halves)."""
    low, high = c & 0xFFFF, c >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finaliser ("lowbias32"): every input bit flips each output bit with probability ~1/2."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform_noise(seeds: Sequence[int], step: int, vocab_size: int, device=None) -> torch.Tensor:
    """(rows, vocab) uniforms in (0, 1), float64: a hash of (row seed, step, token id). Pure function of its
    arguments, identical on every device."""
    # The 64-bit seed as two 32-bit halves (a tensor of Python ints above 2**63 cannot be built directly).
    lo = torch.tensor([s & _MASK32 for s in seeds], dtype=torch.int64)
    hi = torch.tensor([(s >> 32) & _MASK32 for s in seeds], dtype=torch.int64)
    state = _mix32(lo ^ _mix32(hi ^ _mix32(torch.full_like(lo, step & _MASK32) ^ 0x9E3779B9)))
    state = state.to(device)
    tokens = _mix32(torch.arange(vocab_size, dtype=torch.int64, device=device) ^ 0x85EBCA6B)
    bits = _mix32(_mix32(state[:, None] ^ tokens[None, :]) ^ state[:, None])
    return (bits.to(torch.float64) + 0.5) / 2.0**32


def gumbel_noise(seeds: Sequence[int], step: int, vocab_size: int, device=None) -> torch.Tensor:
    u = uniform_noise(seeds, step, vocab_size, device)
    return -torch.log(-torch.log(u))


class RowSeededSampler(LogitsProcessor):
    """Samples each row from softmax(logits / temperature) restricted to top-p, with its own seed.

    `seeds[i]` is row i's seed (`row_seed(seed, key)`); `prompt_length` is the padded prompt length of the batch
    (the generated step is `input_ids.shape[1] - prompt_length`, the same for a row whatever its padding).
    """

    def __init__(self, seeds: Sequence[int], prompt_length: int, temperature: float, top_p: float = 1.0):
        if temperature <= 0:
            raise ValueError(f"sampling needs temperature > 0, got {temperature}")
        self.seeds = list(seeds)
        self.prompt_length = prompt_length
        self.temperature = TemperatureLogitsWarper(temperature)
        self.top_p = TopPLogitsWarper(top_p) if top_p < 1.0 else None

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.seeds):
            raise ValueError(f"{scores.shape[0]} rows of logits but {len(self.seeds)} row seeds")
        step = input_ids.shape[1] - self.prompt_length
        scores = self.temperature(input_ids, scores.float())
        if self.top_p is not None:
            scores = self.top_p(input_ids, scores)
        noise = gumbel_noise(self.seeds, step, scores.shape[1], scores.device)
        choice = (scores.double() + noise).argmax(dim=-1)
        out = torch.full_like(scores, -float("inf"))
        out[torch.arange(scores.shape[0], device=scores.device), choice] = 0.0
        return out
