"""What every engine takes and gives: chat requests in, (request, result) pairs out, plus counters.

A new engine (continuous batching, a vLLM or SGLang server) implements `Engine` in one module of this package
and adds one line to `rsgen.engine.ENGINES`; the stages do not change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from rsgen.records import HIT_TOKEN_LIMIT, NO_CONTENT, REQUEST_FAILED, REQUEST_REFUSED, Name


class Role(Name):
    """What an engine is built for: the model and decoding of one recipe role. A `str` (its value is the word the
    recipe keys, logs and work records use), compared as a member: `spec.role is Role.JUDGE`."""

    GENERATE = "generate"
    EXPLORE = "explore"  # the generating model, sampling at explore's temperature
    JUDGE = "judge"  # the judge model (a VLM or a text-only LM), greedy


@dataclass
class ChatRequest:
    """One conversation to continue. `messages` in Hugging Face chat format; user content parts like
    `[{"type": "image"}, {"type": "text", "text": question}]`; `images` (PIL images or encoded bytes) in the order
    of the image parts."""

    key: str
    messages: list[dict]
    images: list = field(default_factory=list)
    meta: Any = None  # the stage's own item, handed back untouched with the result (engines never read it)
    # Sampling only: one response per sample key, all from this one prompt (encoded and prefilled once), each
    # drawn with the random stream of (engine seed, that key). Empty: one response, the stream of `key`.
    sample_keys: tuple[str, ...] = ()

    @property
    def num_responses(self) -> int:
        return max(1, len(self.sample_keys))


@dataclass
class GenerationResult:
    text: str  # the generated text, special tokens removed except reasoning/answer tags, EOS excluded; starts
    # with the opening reasoning tag when the chat template ended the prompt with one
    prompt_tokens: int  # real prompt tokens (image tokens included, padding excluded)
    generated_tokens: int  # new tokens up to and including the first EOS
    hit_limit: bool  # no EOS within max_new_tokens
    sample_key: str | None = None  # which of the request's `sample_keys` this response is (None without them)
    refused: str | None = None  # a server engine's refusal of this request (its message): no text, a counted drop
    failed: str | None = None  # a server engine's last message after every retry failed: no text, a counted drop
    no_content: bool = False  # the server answered `content: null` with no reasoning: no text, a counted drop

    @property
    def drop_reason(self) -> str | None:
        """Why this response is never verified (rsgen.records.RESPONSE_REASONS), or None when it is an answer.
        A response cut at the token limit is never accepted, whatever engine made it and whatever it says."""
        if self.refused:
            return REQUEST_REFUSED
        if self.failed:
            return REQUEST_FAILED
        if self.no_content:
            return NO_CONTENT
        if self.hit_limit:
            return HIT_TOKEN_LIMIT
        return None


@dataclass
class EngineStats:
    """Counters over every batch the engine ran (the benchmark and the progress bar read them)."""

    requests: int = 0
    batches: int = 0
    prompt_tokens: int = 0  # real
    padded_prompt_tokens: int = 0  # rows x padded prompt length
    generated_tokens: int = 0  # real, up to EOS
    padded_generated_tokens: int = 0  # rows x decoding steps of the batch
    generate_seconds: float = 0.0  # inside model.generate
    wait_seconds: float = 0.0  # main thread waiting for a batch to be prepared
    oom_splits: int = 0
    retries: int = 0  # server engines: requests asked again (connection errors, timeouts, 429, 5xx, malformed)
    retries_by_cause: dict[str, int] = field(default_factory=dict)  # the same, by cause (RETRY_CAUSES)
    refused: int = 0  # server engines: requests the server refused (recorded as drops)
    failed: int = 0  # server engines: requests that failed every retry (recorded as drops, asked again next run)
    no_content: int = 0  # server engines: answers with `content: null` (recorded as drops)
    in_flight_peak: int = 0  # server engines: most requests in flight at once

    @property
    def padding_efficiency(self) -> float:
        """Real tokens / tokens the model computed (prompt padding and finished rows waiting both count)."""
        padded = self.padded_prompt_tokens + self.padded_generated_tokens
        return (self.prompt_tokens + self.generated_tokens) / padded if padded else 1.0

    @property
    def prompt_padding_efficiency(self) -> float:
        return self.prompt_tokens / self.padded_prompt_tokens if self.padded_prompt_tokens else 1.0


class EngineUnavailable(RuntimeError):
    """The engine cannot go on (a server gone, after its retries): the stage stops with this one-line message;
    every finished record is already on disk, and rerunning the same command continues."""


class Engine(Protocol):
    """A loaded model that answers chat requests. `generate` yields one `(request, result)` pair per response
    (one per request, or one per sample key), in any order (the request object is the one passed in, `meta`
    included). With temperature > 0 a response depends on (seed, its key) only, never on its batch."""

    stats: EngineStats
    revision: str | None  # the commit the weights came from, when known (recorded with every result)

    def generate(self, requests: Iterable[ChatRequest]) -> Iterator[tuple[ChatRequest, GenerationResult]]: ...
