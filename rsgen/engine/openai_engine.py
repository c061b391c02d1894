"""The `openai` engine: chat requests sent to OpenAI-compatible servers (`vllm serve`, SGLang, `transformers serve`,
hosted APIs), many in flight at once, so that a serving engine with continuous batching stays busy.

How a request travels:

- One HTTP request per response: a `ChatRequest` with `sample_keys` becomes one request per sample key, each with
  a `seed` derived from (recipe seed, that key) (`rsgen.engine.sampling.row_seed`), so a rerun asks for exactly
  what the first run asked for. Decoding is the request's alone, as in the transformers engine: greedy is
  temperature 0, sampling is temperature and top-p, and every other sampling and penalty setting is pinned to
  "off" in the fields the server kind takes (a model's `generation_config.json` must not decide them, as it does on
  the server side by default).
- Images go as data URIs in `image_url` parts, in the order of the image parts; text parts byte-identical.
  `chat_template_kwargs` travel in the body only when non-empty (hosted APIs refuse unknown fields).
- Keys are spread over the servers of `engine_base_url` by a hash of the request key: a key always goes to the same
  server (a question's samples share that server's prefix cache).
- Reasoning the server returns apart (`reasoning_content`, or `reasoning` when that is absent or empty) is put back
  as `<think>…</think>answer`, so responses read the same as from the transformers engine. A content given as a
  list of text parts is read as their text. `finish_reason == "length"` is `hit_limit` (never accepted: reason
  `hit_token_limit`); `content: null` with no reasoning is `no_content` (a drop of its own, with a warning);
  `usage` gives the token counts.
- Connection errors, timeouts, 429 (honouring `Retry-After`), 5xx and malformed answers (not JSON, not a chat
  completion, a field of the wrong type) are retried with exponential backoff, up to `max_retries`, and logged
  (a line a minute, counts by cause). A request that fails every try while the server answers others is a counted
  drop (`failed`: the server's last message; the next run asks it again); a server nothing listens at any more, or
  `FAILED_IN_A_ROW` such failures with no answer between them, mean the server is gone: `EngineUnavailable` ends the stage with one line (every finished
  record is on disk already). A request the server refuses (400 or 413: a prompt longer than its context, an
  image it cannot read) is not retried: its result carries the server's message in `refused`, a counted drop.
- Every message of a server is scrubbed of the API key (and of any `Bearer` token) before it is logged, raised or
  stored: a server that echoes the request's headers leaks nothing.

The HTTP client is `aiohttp` on an event loop in a process of its own (`rsgen.engine.client_process`, forked, fed
request bodies through a pipe), so that it never waits on the stage's work for a GIL: `bench/bench_server.py`
measured it at several thousand requests/s against a stub that answers at once, an order of magnitude above the
`openai` SDK's client, so the client is never what limits a server.

Longer than most modules (~900 lines) on purpose: everything above is one path a request takes — body, server,
pacing, concurrency, retries, the parse of the answer, the scrubbing of the key — and every step reads the same
`OpenAIEngine` state (its servers, key, counters by cause, the client process). The pure helpers at the top
(`request_body`, `parse_completion`, `server_message`, `backoff_seconds`) are the seam a split would take; split
today, the retry and refusal rules would live apart from the request whose fate they decide.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import operator
import os
import random
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from PIL import Image

from rsgen.config import RecipeError
from rsgen.engine.base import ChatRequest, EngineStats, EngineUnavailable, GenerationResult
from rsgen.engine.client_process import ClientProcess

logger = logging.getLogger(__name__)

# Statuses that mean "this request, as sent, will never be answered": recorded as a refusal, not retried.
REFUSED_STATUSES = (400, 413)
# Statuses worth asking again: rate limits and server-side failures (a restarting server answers 502/503).
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
BACKOFF_BASE_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 30.0
RETRY_AFTER_MAX_SECONDS = 300.0
# A server that refuses this many requests before answering any refuses them all (a field it does not take, a
# model that cannot read images): one error instead of a dataset of drops.
REFUSALS_BEFORE_ANY_ANSWER = 16
# Requests that failed every retry one after the other, with no answer between them: the server is gone, not one
# request bad. Fewer are drops of their own (asked again by the next run).
FAILED_IN_A_ROW = 8
# Requests handed to the client process beyond those in flight, as a multiple of the concurrency: ready to start
# the moment a slot frees, whatever this process is doing then (descheduled on a loaded machine, waiting on a
# checkpoint's fsync). They are handed over when half the concurrency's worth is free: a pipe write (and a wake-up
# of the client) per 32 requests at 64 in flight, not per 8. Each waiting request holds its body (its images as
# base64) in the client and its request here: beyond the concurrency's worth, requests wait only while their bodies
# together stay under AHEAD_BYTES (demo-sized bodies, ~2 KB: never reached; 3 MB images: ~20 waiting).
AHEAD = 4
AHEAD_BYTES = 64 * 1024**2
RETRY_LOG_SECONDS = 60.0  # at most one log line a minute about retries (counts by cause)
# Servers that take sampling fields beyond the OpenAI schema (and read defaults from the model's
# generation_config.json unless told otherwise): every request pins these too. Detected from `owned_by` of
# GET /v1/models.
EXTENDED_SAMPLING_SERVERS = ("vllm", "sglang")
EXTENDED_SAMPLING_PINS = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0}
# `transformers serve` (detected by the `status` of its model list) samples only when the model's own
# generation_config says do_sample, and then with its top_k (50 by default): a sampling request pins both through
# its `generation_config` field (the transformers engine samples from temperature and top-p alone).
TRANSFORMERS_SERVE = "transformers"
TRANSFORMERS_SAMPLING_PINS = {"do_sample": True, "top_k": 0}

OPEN_TAG = "<think>"
CLOSE_TAG = "</think>"
_CLOSE_TAG_RE = re.compile(r"</(think|thinking|thought|reasoning)>")
_OPEN_TAG_RE = re.compile(r"<(think|thinking|thought|reasoning)>")

_IMAGE_MIME = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF8", "image/gif"),
               (b"RIFF", "image/webp"), (b"BM", "image/bmp"))


# ---------------------------------------------------------------------- request building


_last_uri: tuple[bytes, str] = (b"", "")  # (image bytes, data URI) of the last call: the next QA pair's image mostly


def image_data_uri(image) -> str:
    """A data URI for encoded image bytes (sent as they are, their format sniffed) or a PIL image (as PNG)."""
    global _last_uri
    if isinstance(image, (bytes, bytearray, memoryview)):
        data = bytes(image)
        # The QA pairs of one image come one after another: its URI is made once, not base64-encoded per question
        # (a byte comparison, far cheaper than the encoding).
        last = _last_uri
        if data == last[0] and data:
            return last[1]
        mime = next((m for magic, m in _IMAGE_MIME if data.startswith(magic)), None)
        if mime is None:  # an uncommon format: re-encode rather than send a type the server may not know
            with Image.open(io.BytesIO(data)) as im:
                return image_data_uri(im.convert("RGB"))
    else:
        if not isinstance(image, Image.Image):
            raise TypeError(f"request images must be PIL images or encoded bytes, got {type(image).__name__}")
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        data, mime = buf.getvalue(), "image/png"
    uri = f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
    if not isinstance(image, Image.Image):  # bytes sent as they are (a PIL image is encoded anew every time)
        _last_uri = (data, uri)
    return uri


def openai_messages(request: ChatRequest) -> list[dict]:
    """Hugging Face chat messages -> Chat Completions messages: image parts become `image_url` parts holding the
    request's images in order; a content of text parts only is sent as one string (text-only servers and hosted
    APIs take it), text byte-identical."""
    return [{"role": role, "content": content} for role, content, _ in _message_contents(
        request, lambda image: {"type": "image_url", "image_url": {"url": image_data_uri(image)}},
        lambda text: {"type": "text", "text": text})]


_encode = json.JSONEncoder(ensure_ascii=False).encode  # json.dumps(x, ensure_ascii=False), the encoder made once
_last_part: tuple[str, str] = ("", "")  # (data URI, JSON of its image_url part) of the last call


def _image_part_json(image) -> str:
    """The JSON of an image's `image_url` part. `image_data_uri` hands back the very same string for the same bytes
    in a row (its own one-image cache), so that string's identity tells that the part is the last one again: the
    QA pairs of one image come one after another, and its part is encoded once."""
    global _last_part
    uri = image_data_uri(image)
    last = _last_part  # read once: a (uri, part) pair is never seen half replaced
    if uri is last[0]:
        return last[1]
    text = '{"type": "image_url", "image_url": {"url": ' + _encode(uri) + "}}"
    _last_part = (uri, text)
    return text


def messages_json(request: ChatRequest) -> str:
    """`json.dumps(openai_messages(request), ensure_ascii=False)`, byte for byte, written part by part: an image's
    part (a data URI of kilobytes) is encoded once for the QA pairs of that image in a row, and no message dicts
    are made (the body of every request of the generate stage; ~3x faster in bench_server's stage part)."""
    messages = []
    for role, content, is_parts in _message_contents(
            request, _image_part_json, lambda text: '{"type": "text", "text": ' + _encode(text) + "}"):
        content = "[" + ", ".join(content) + "]" if is_parts else _encode(content)
        messages.append('{"role": ' + _encode(role) + ', "content": ' + content + "}")
    return "[" + ", ".join(messages) + "]"


def _message_contents(request: ChatRequest, image_part: Callable[[Any], Any], text_part: Callable[[str], Any]
                      ) -> list[tuple[Any, Any, bool]]:
    """(role, content, whether content is a list of parts) per message: a list content's image parts made by
    `image_part(image)` from the request's images in order, its text parts by `text_part(text)`; one string when
    every part is text; any other content as it is."""
    images = iter(request.images)
    n_parts = 0
    out = []
    for message in request.messages:
        content = message.get("content")
        is_parts = isinstance(content, list)
        if is_parts:
            parts = []
            texts = []  # the text of every part, while every part is text
            for part in content:
                kind = part.get("type")
                if kind == "image":
                    n_parts += 1
                    image = next(images, None)
                    if image is None:
                        break
                    parts.append(image_part(image))
                    texts = None
                elif kind == "text":
                    parts.append(text_part(part["text"]))
                    if texts is not None:
                        texts.append(part["text"])
                else:
                    raise ValueError(f"request {request.key!r}: content part of type {kind!r} is neither text nor "
                                     "image")
            is_parts = texts is None
            content = parts if is_parts else "".join(texts)
        out.append((message["role"], content, is_parts))
    if n_parts != len(request.images):
        raise ValueError(f"request {request.key!r} has {n_parts} image part(s) in its messages but "
                         f"{len(request.images)} image(s)")
    return out


@dataclass(frozen=True)
class Decoding:
    """What every request of an engine asks for, besides its messages."""

    model: str  # the served model's name
    max_new_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()
    server_kind: str = ""  # "vllm", "sglang", "transformers" (serve) or "" (another server, a hosted API)


def request_seed(seed: int, key: str) -> int:
    """The `seed` field of the request for sample `key`: `row_seed` in 63 bits (servers take a signed int64)."""
    from rsgen.engine.sampling import row_seed

    return row_seed(seed, key) & (2**63 - 1)


def request_body(messages: list[dict], decoding: Decoding, sample_key: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": decoding.model,
        "messages": messages,
        "max_tokens": decoding.max_new_tokens,
        "temperature": decoding.temperature,
        "top_p": decoding.top_p if decoding.temperature > 0 else 1.0,
        # `transformers serve` turns frequency_penalty into repetition_penalty 1 + x: 0 pins the model's own to off.
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "stream": False,
    }
    if decoding.server_kind in EXTENDED_SAMPLING_SERVERS:
        body.update(EXTENDED_SAMPLING_PINS)
    if decoding.temperature > 0:
        body["seed"] = request_seed(decoding.seed, sample_key)
        if decoding.server_kind == TRANSFORMERS_SERVE:
            body["generation_config"] = json.dumps(TRANSFORMERS_SAMPLING_PINS)
    if decoding.chat_template_kwargs:
        body["chat_template_kwargs"] = dict(decoding.chat_template_kwargs)
    return body


def server_for(key: str, servers: tuple[str, ...]) -> str:
    """The server of a request key: a stable hash, the same in every process and every run."""
    if len(servers) == 1:
        return servers[0]
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return servers[int.from_bytes(digest[:8], "little") % len(servers)]


# ---------------------------------------------------------------------- response parsing


class MalformedResponse(ValueError):
    """A 200 answer that is not a chat completion as the OpenAI format has it (retried like a 5xx)."""


def _text_of(value: Any, field: str) -> str | None:
    """A message field as text: a string, None, or a list of text parts (the OpenAI format allows it for content)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                       and isinstance(p.get("text"), str) for p in value):
        return "".join(p["text"] for p in value)
    raise MalformedResponse(f"message.{field} is neither text nor a list of text parts: {json.dumps(value)[:200]}")


def _token_count(usage: dict[str, Any], field: str) -> int:
    value = usage.get(field)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"usage.{field} is not a token count: {json.dumps(value)[:200]}")
    return value


def message_parts(message: dict[str, Any]) -> tuple[str | None, str | None]:
    """(content, reasoning) of a response message, as text or None. Raises MalformedResponse on other types."""
    content = _text_of(message.get("content"), "content")
    # vLLM names it `reasoning_content` (older) or `reasoning` (newer); some servers send both, one of them empty.
    reasoning = _text_of(message.get("reasoning_content"), "reasoning_content") or \
        _text_of(message.get("reasoning"), "reasoning")
    return content, reasoning


def response_text(message: dict[str, Any], finish_reason: str | None) -> str:
    """The response as the transformers engine gives it: reasoning returned apart is put back inside
    `<think>…</think>` before the answer (left open when the token limit cut the reasoning, as a raw output would
    be); a content that closes a reasoning block it never opened (the chat template opened it in the prompt) gets
    the opening tag back."""
    return _joined(*message_parts(message), finish_reason)


def _joined(content: str | None, reasoning: str | None, finish_reason: str | None) -> str:
    content = content or ""
    if reasoning:
        if not content and finish_reason == "length":
            return OPEN_TAG + reasoning
        return f"{OPEN_TAG}{reasoning}{CLOSE_TAG}{content}"
    close = _CLOSE_TAG_RE.search(content)
    if close and not _OPEN_TAG_RE.search(content, 0, close.start()):
        return f"<{close.group(1)}>" + content
    return content


def parse_completion(data: Any, sample_key: str | None) -> GenerationResult:
    """A Chat Completions response -> GenerationResult. Raises MalformedResponse when it is not one, field types
    included (a server that answers 200 with a wrong shape is a failure of that try, not of the run)."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
    except (KeyError, IndexError, TypeError):
        raise MalformedResponse(f"not a chat completion: {json.dumps(data)[:200]}") from None
    if not isinstance(choice, dict) or not isinstance(message, dict):
        raise MalformedResponse(f"choices[0].message is not an object: {json.dumps(data)[:200]}")
    finish = choice.get("finish_reason")
    if finish is not None and not isinstance(finish, str):
        raise MalformedResponse(f"finish_reason is not text: {json.dumps(finish)[:200]}")
    usage = data.get("usage") or {}
    if not isinstance(usage, dict):
        raise MalformedResponse(f"usage is not an object: {json.dumps(usage)[:200]}")
    content, reasoning = message_parts(message)
    return GenerationResult(
        text=_joined(content, reasoning, finish),  # response_text, the message read once
        prompt_tokens=_token_count(usage, "prompt_tokens"),
        generated_tokens=_token_count(usage, "completion_tokens"),
        hit_limit=finish == "length",
        sample_key=sample_key,
        no_content=content is None and not reasoning,
    )


_BEARER_RE = re.compile(r"(Bearer\s+)[^\s\"',;}\]]+", re.IGNORECASE)
SCRUBBED = "***"


def scrub(text: str, api_key: str | None) -> str:
    """`text` with the API key and any `Bearer` token replaced by ***: a server may echo the request's headers in
    its error messages, and those end up in logs, exceptions and records."""
    if api_key:
        text = text.replace(api_key, SCRUBBED)
    return _BEARER_RE.sub(lambda m: m.group(1) + SCRUBBED, text)


def server_message(status: int, text: str, api_key: str | None = None) -> str:
    """The server's own words for an error response, on one line (`{"error": {"message": ...}}`, `{"detail":
    ...}`, `{"message": ...}` or plain text), scrubbed of the key (`scrub`)."""
    message: Any = text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error", data)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail") or error.get("msg") or json.dumps(error)
        elif error:
            message = error
        if isinstance(data.get("detail"), (str, list)):
            message = data["detail"]
    return f"HTTP {status}: " + scrub(" ".join(scrub(str(message), api_key).split()), api_key)[:500]


def retry_after_seconds(value: str | None) -> float | None:
    """Seconds to wait from a `Retry-After` header (seconds or an HTTP date), or None."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        from email.utils import parsedate_to_datetime

        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), RETRY_AFTER_MAX_SECONDS)


def backoff_seconds(attempt: int) -> float:
    """0.5, 1, 2, 4 … s (capped at 30), with jitter so that many clients do not retry in step."""
    return min(BACKOFF_BASE_SECONDS * 2**attempt, BACKOFF_MAX_SECONDS) * (0.5 + random.random() / 2)


# ---------------------------------------------------------------------- servers


def api_key_from_env(env_name: str | None) -> str | None:
    """The API key held by the environment variable `env_name` (the recipe names the variable, never the key)."""
    if not env_name:
        return None
    key = os.environ.get(env_name)
    if not key:
        raise RecipeError(f"engine_api_key_env names the environment variable {env_name!r}, which is not set: "
                          f"`export {env_name}=...` before the run (the key never goes into the recipe)")
    return key


def _headers(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def _list_models(session, base_url: str, api_key: str | None) -> list[dict[str, Any]]:
    async with session.get(base_url.rstrip("/") + "/models") as resp:
        text = await resp.text()
        if resp.status != 200:
            raise RecipeError(f"engine server {base_url} answered GET /models with "
                              f"{server_message(resp.status, text, api_key)}; check engine_base_url and "
                              "engine_api_key_env")
        try:
            return list(json.loads(text)["data"])
        except (ValueError, KeyError, TypeError):
            raise RecipeError(f"engine server {base_url} answered GET /models with something that is not a model "
                              f"list ({scrub(text[:200], api_key)!r}); engine_base_url must end in the API root, e.g. "
                              "http://HOST:8000/v1") from None


def check_servers(base_urls: Iterable[str], model: str, api_key: str | None, timeout_seconds: float = 30.0) -> str:
    """Before any work: every server answers `GET /v1/models` and serves `model`. Returns the server family:
    "vllm" or "sglang" (their `owned_by`), "transformers" (`transformers serve` lists each model with a `status`),
    or "" for others. Raises a one-line RecipeError naming the URL and the models it does serve."""
    import aiohttp

    async def check() -> str:
        kinds = set()
        timeout = aiohttp.ClientTimeout(total=timeout_seconds)
        async with aiohttp.ClientSession(timeout=timeout, headers=_headers(api_key)) as session:
            for url in base_urls:
                try:
                    models = await _list_models(session, url, api_key)
                except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                    raise RecipeError(f"engine server {url} is unreachable ({_describe(err, api_key)}); start the server "
                                      "or fix engine_base_url (or set engine_server to let rsgen start one)") from None
                served = [str(m.get("id")) for m in models if isinstance(m, dict)]
                if model not in served:
                    raise RecipeError(f"engine server {url} does not serve model {model!r}; it serves "
                                      f"{', '.join(repr(s) for s in served) or 'no model'}: set model_name_or_path "
                                      "(or judge_model_name_or_path) to the served name, or start the server with "
                                      "that model")
                entry = next(m for m in models if isinstance(m, dict) and str(m.get("id")) == model)
                owner = str(entry.get("owned_by", ""))
                if owner in EXTENDED_SAMPLING_SERVERS:
                    kinds.add(owner)
                elif isinstance(entry.get("status"), dict) and "value" in entry["status"]:
                    kinds.add(TRANSFORMERS_SERVE)
                else:
                    kinds.add("")
        if len(kinds) > 1:
            raise RecipeError(f"the servers of {', '.join(base_urls)} are of different kinds "
                              f"({', '.join(sorted(k or 'other' for k in kinds))}); their defaults differ: use one kind")
        return kinds.pop() if kinds else ""

    return asyncio.run(check())


def _describe(err: BaseException, api_key: str | None) -> str:
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    return scrub(" ".join(f"{type(err).__name__}: {err}".split()), api_key)[:300]


def _retry_cause(err: BaseException | None, status: int | None) -> str:
    """The cause a retry is counted under (the log line and stats.json): timeout, connection, 429, 5xx, malformed."""
    if isinstance(err, asyncio.TimeoutError):
        return "timeout"
    if err is not None:
        return "connection"
    if status == 200:
        return "malformed"
    if status == 429:
        return "429"
    return "5xx" if status and status >= 500 else str(status)


# ---------------------------------------------------------------------- the engine


class AdaptiveConcurrency:
    """`engine_max_concurrency: auto`: additive increase while throughput grows, multiplicative decrease when the
    server pushes back (a 429 or a timeout), so that the requests in flight settle at the server's knee.

    Throughput is measured over windows of `max(limit, MIN_WINDOW)` answers: when a window's answers/s beat the
    best so far by GAIN, the limit grows by STEP; when they do not for PATIENCE windows, it holds (the knee); a
    429 or a timeout halves it (at most once a window, as a burst of 429s is one signal)."""

    START = 8
    STEP = 8
    MAX = 1024
    GAIN = 1.05
    PATIENCE = 4  # flat windows before trying one step higher again
    MIN_WINDOW = 16

    def __init__(self, start: int = START):
        self.limit = start
        self.best = 0.0
        self.flat = 0
        self.pushed_back = False  # set on a 429 or a timeout the client process reports
        self.window_answers = 0
        self.window_start: float | None = None  # the first answer starts the first window
        self.cut_this_window = False
        self.history: list[tuple[int, float]] = []  # (limit, answers/s) per window, for the benchmark

    def answered(self, now: float | None = None) -> None:
        """One answer came back (main thread)."""
        now = time.perf_counter() if now is None else now
        if self.window_start is None:
            self.window_start = now
            return
        self.window_answers += 1
        if self.pushed_back and not self.cut_this_window:
            self.limit = max(1, self.limit // 2)
            self.cut_this_window = True
            self.best *= 0.5  # what the smaller limit gives is measured afresh
        self.pushed_back = False
        if self.window_answers < max(self.limit, self.MIN_WINDOW):
            return
        rate = self.window_answers / max(now - self.window_start, 1e-9)
        self.history.append((self.limit, rate))
        if not self.cut_this_window:
            if rate > self.best * self.GAIN:
                self.best = rate
                self.flat = 0
                self.limit = min(self.MAX, self.limit + self.STEP)
            else:
                self.best = max(self.best, rate)
                self.flat += 1
                if self.flat >= self.PATIENCE:  # probe above the knee now and then: the server may have grown
                    self.flat = 0
                    self.best = rate
        self.window_answers = 0
        self.window_start = now
        self.cut_this_window = False


class RatePacer:
    """`engine_requests_per_minute` / `engine_tokens_per_minute` (hosted APIs): requests leave evenly spaced, and
    while the tokens the server reported (`usage`) over the last minute's budget are spent, none leaves. Used in the
    client process only (a copy of the engine's), where requests leave.

    The spacing is a token bucket holding one request: a request that leaves late never earns the next ones an
    earlier start (no catch-up burst). It is `HEADROOM` wider than the limit's: the API counts requests when they
    arrive, and one that arrives a few ms late beside the next on time would put one over the limit in the API's
    window (at exactly the limit's pace the rate-limited stub of bench_server.py answered 7 of 200 with a 429)."""

    HEADROOM = 0.9  # the share of the limit sent: tolerates a request up to ~0.1 s late in a one-second window

    def __init__(self, requests_per_minute: float | None, tokens_per_minute: float | None, clock=time.monotonic):
        self.interval = 60.0 / (requests_per_minute * self.HEADROOM) if requests_per_minute else 0.0
        self.tokens_per_second = tokens_per_minute / 60.0 if tokens_per_minute else 0.0
        self.capacity = float(tokens_per_minute or 0)
        self.tokens = self.capacity  # a token bucket: full at the start, refilled continuously
        self.clock = clock
        self.next_send = 0.0
        self.updated = clock()

    def delay(self) -> float:
        """0 if a request may leave now (it is counted as gone), else how long to wait before asking again."""
        now = self.clock()
        if self.tokens_per_second:
            self.tokens = min(self.capacity, self.tokens + (now - self.updated) * self.tokens_per_second)
            self.updated = now
        delay = max(self.next_send - now, 0.0)
        if self.tokens_per_second and self.tokens <= 0:
            delay = max(delay, -self.tokens / self.tokens_per_second + 1e-3)
        if delay <= 0:
            self.next_send = now + self.interval  # from now, never from when it was due: no catch-up
        return delay

    async def wait(self) -> None:
        while (delay := self.delay()) > 0:
            await asyncio.sleep(delay)

    def spent(self, tokens: int) -> None:
        if self.tokens_per_second:
            self.tokens -= tokens


# A GenerationResult as the tuple of its fields, in the order GenerationResult(*fields) takes them back.
_result_fields = operator.attrgetter(*(f.name for f in dataclasses.fields(GenerationResult)))


def _body_around(decoding: Decoding) -> tuple[bytes, bytes] | None:
    """The JSON of a greedy request body before and after its messages (encoded once per engine, byte-identical to
    encoding each body whole), or None when bodies differ by more than their messages (sampling: a seed each)."""
    if decoding.temperature > 0:
        return None
    marker = "\x00rsgen-messages\x00"  # encoded as "\u0000rsgen-messages\u0000": no model name or setting has it
    whole = json.dumps(request_body(marker, decoding, None), ensure_ascii=False)  # type: ignore[arg-type]
    parts = whole.split(json.dumps(marker))
    if len(parts) != 2:
        return None
    return parts[0].encode("utf-8"), parts[1].encode("utf-8")


class OpenAIEngine:
    """Answers chat requests through OpenAI-compatible servers, `max_concurrency` requests in flight.

    `engine.generate(requests)` yields `(request, result)` pairs in completion order; requests are read lazily,
    as slots free up. A result the server refused has `refused` set (its text empty).
    """

    def __init__(
        self,
        base_urls: Iterable[str] | str,
        model: str,
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int = 0,
        chat_template_kwargs: dict[str, Any] | None = None,
        api_key: str | None = None,
        max_concurrency: int | str = 64,
        timeout_seconds: float = 600.0,
        max_retries: int = 5,
        server_kind: str = "",
        requests_per_minute: float | None = None,
        tokens_per_minute: float | None = None,
    ):
        urls = (base_urls,) if isinstance(base_urls, str) else tuple(base_urls)
        if not urls:
            raise ValueError("the openai engine needs at least one server URL (engine_base_url)")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.adaptive = AdaptiveConcurrency() if max_concurrency == "auto" else None
        if self.adaptive is not None:
            max_concurrency = AdaptiveConcurrency.MAX
        if not isinstance(max_concurrency, int) or max_concurrency < 1 or max_retries < 0 or timeout_seconds <= 0:
            raise ValueError("engine_max_concurrency must be >= 1 or auto, engine_max_retries >= 0, "
                             "engine_timeout_seconds > 0")
        self.servers = tuple(u.rstrip("/") for u in urls)
        self.decoding = Decoding(model, max_new_tokens, temperature, top_p, seed,
                                 tuple(sorted((chat_template_kwargs or {}).items())), server_kind)
        self._api_key = api_key  # kept out of repr, logs and errors
        self.max_concurrency = max_concurrency  # with `auto`: the most the controller may reach
        self.pacer = RatePacer(requests_per_minute, tokens_per_minute) if requests_per_minute or tokens_per_minute \
            else None
        self.timeout_seconds = timeout_seconds
        self.max_retries = max_retries
        self.stats = EngineStats()
        self.revision: str | None = None  # a server does not say which commit it loaded
        self.answered = 0
        self.failed_in_a_row = 0
        self.in_flight_seconds = 0.0  # integral of requests in flight over time (mean concurrency = / wall)
        self._retries_unlogged: dict[str, int] = {}
        self._retries_logged_at = time.monotonic()
        self._body_around = _body_around(self.decoding)

    def __repr__(self) -> str:
        return f"OpenAIEngine(servers={self.servers!r}, model={self.decoding.model!r})"

    @classmethod
    def from_spec(cls, spec, device=None) -> OpenAIEngine:
        """From an EngineSpec (rsgen.engine.build_engine): checks the servers first (`check_servers`), so a wrong
        URL or model is one line, not a retry storm."""
        api_key = api_key_from_env(spec.api_key_env)
        kind = check_servers(spec.base_urls, spec.served_model, api_key)
        return cls(spec.base_urls, spec.served_model, max_new_tokens=spec.max_new_tokens,
                   temperature=spec.temperature, top_p=spec.top_p, seed=spec.seed,
                   chat_template_kwargs=spec.chat_template_kwargs, api_key=api_key,
                   max_concurrency=spec.max_concurrency, timeout_seconds=spec.timeout_seconds,
                   max_retries=spec.max_retries, server_kind=kind, requests_per_minute=spec.requests_per_minute,
                   tokens_per_minute=spec.tokens_per_minute)

    # ------------------------------------------------------------------ one request

    def bodies(self, request: ChatRequest) -> list[tuple[str | None, bytes]]:
        """(sample key, JSON body) per response the request asks for."""
        if request.sample_keys and self.decoding.temperature == 0:
            raise ValueError(f"request {request.key!r} asks for {len(request.sample_keys)} samples but the engine "
                             "decodes greedily (temperature 0): every sample would be the same response")
        if self._body_around is not None:  # greedy: one body, the same for every request but its messages
            prefix, suffix = self._body_around
            return [(None, prefix + messages_json(request).encode("utf-8") + suffix)]
        messages = openai_messages(request)
        keys: tuple[str | None, ...] = request.sample_keys or (None,)
        return [(k, json.dumps(request_body(messages, self.decoding, k if k is not None else request.key),
                               ensure_ascii=False).encode("utf-8")) for k in keys]

    async def _post(self, session, job: tuple[str, bytes, str | None], on_retry: Callable[[str], None]) -> tuple:
        """In the client process: POST one job's body (server, body, sample key) with retries (each one's cause
        handed to `on_retry`). Returns the result (`refused` set on a refusal, `failed` when every try failed) as
        the tuple of its fields (`_take` makes it again: a dataclass crosses the pipe ~10x slower); raises
        EngineUnavailable on an answer that means no request can succeed (401, 404, ...)."""
        import aiohttp

        url, body, sample_key = job
        endpoint = url + "/chat/completions"
        problem = ""
        for attempt in range(self.max_retries + 1):
            delay = None
            error: BaseException | None = None
            status: int | None = None
            if self.pacer is not None:
                await self.pacer.wait()
            try:
                async with session.post(endpoint, data=body) as resp:  # Content-Type: the session's
                    status = resp.status
                    if status == 200:
                        try:  # JSON is UTF-8 (RFC 8259; json.loads reads UTF-16/32 too): no charset lookup
                            result = parse_completion(json.loads(await resp.read()), sample_key)
                            if self.pacer is not None:
                                self.pacer.spent(result.prompt_tokens + result.generated_tokens)
                            return _result_fields(result)
                        except ValueError as err:  # MalformedResponse, or not JSON (or not text) at all
                            problem = self._scrub(f"an answer that is not a chat completion ({err})")[:500]
                    else:
                        message = server_message(status, await resp.text(errors="replace"), self._api_key)
                        if status in REFUSED_STATUSES:  # this request, as sent, will never be answered
                            return _result_fields(GenerationResult("", 0, 0, hit_limit=False, sample_key=sample_key,
                                                                   refused=message))
                        if status not in RETRY_STATUSES:  # 401/403 (key), 404 (URL or model), 422 (a field it
                            # does not take): every request fails
                            raise EngineUnavailable(f"engine server {url} answered {message}; check "
                                                    "engine_base_url, engine_api_key_env and model_name_or_path")
                        problem = message
                        delay = retry_after_seconds(resp.headers.get("Retry-After"))
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as err:
                error = err
                problem = _describe(err, self._api_key)
            if attempt == self.max_retries:
                break
            on_retry(_retry_cause(error, status))
            await asyncio.sleep(delay if delay is not None else backoff_seconds(attempt))
        if isinstance(error, aiohttp.ClientConnectorError):  # nothing listens any more: the server is gone
            raise EngineUnavailable(
                f"engine server {url} failed {self.max_retries + 1} times in a row (last: {problem}); every finished "
                "record is on disk: rerun the same command once the server answers again")
        return _result_fields(GenerationResult("", 0, 0, hit_limit=False, sample_key=sample_key,
                                               failed=f"{self.max_retries + 1} tries failed (last: {problem})"))

    def _scrub(self, text: str) -> str:
        return scrub(text, self._api_key)

    def _count_retry(self, cause: str) -> None:
        """Count a retry by cause (reported by the client process); at most once a minute, log the retries since
        the last line."""
        self.stats.retries += 1
        if self.adaptive is not None and cause in ("429", "timeout"):
            self.adaptive.pushed_back = True
        by_cause = self.stats.retries_by_cause
        by_cause[cause] = by_cause.get(cause, 0) + 1
        self._retries_unlogged[cause] = self._retries_unlogged.get(cause, 0) + 1
        now = time.monotonic()
        if now - self._retries_logged_at >= RETRY_LOG_SECONDS:
            self._log_retries(now)

    def _log_retries(self, now: float) -> None:
        if self._retries_unlogged:
            counts = ", ".join(f"{cause} {n}" for cause, n in sorted(self._retries_unlogged.items()))
            logger.warning("engine server: %d retries in the last %.0f s (%s); %d in all so far",
                           sum(self._retries_unlogged.values()), now - self._retries_logged_at, counts,
                           self.stats.retries)
        self._retries_unlogged = {}
        self._retries_logged_at = now

    # ------------------------------------------------------------------ many requests

    def generate(self, requests: Iterable[ChatRequest]) -> Iterator[tuple[ChatRequest, GenerationResult]]:
        """Yield `(request, result)` for every response, in completion order, `max_concurrency` in flight.

        The HTTP client runs in a process of its own (`rsgen.engine.client_process`: in a thread it shared one GIL
        with the stage's work on each answer). This side builds the bodies and hands them over a batch at a time
        (one pipe write), when at least half the concurrency's worth is free, keeping AHEAD times the concurrency
        waiting in the client: the client starts the next request the moment one ends, as a single-process client does,
        not when this side has taken the answer. Answers come back as many as are ready at once, with the
        retries the client counted."""
        import aiohttp  # noqa: F401  (imported before the fork, never in the child: rsgen.engine.client_process)

        client = ClientProcess(self._open_session, self._post)
        pending: dict[int, tuple[ChatRequest, int]] = {}  # job id -> (request, its body's bytes)
        pending_bytes = 0
        ids = itertools.count()
        work = self._work(requests)
        exhausted = False
        sent_limit = 0
        start = last = time.perf_counter()

        def refill(force: bool = False) -> None:
            """Hand the client as many new requests as fit its window, when enough do (and a new limit)."""
            nonlocal exhausted, sent_limit, pending_bytes
            limit = self.adaptive.limit if self.adaptive is not None else self.max_concurrency
            free = limit * (1 + AHEAD) - len(pending)
            jobs = []
            room = pending_bytes < AHEAD_BYTES or len(pending) < limit  # the in-flight slots are always filled
            if not exhausted and free > 0 and (force or free >= max(1, limit // 2)) and room:
                exhausted = True
                for server, body, request, sample_key in work:
                    job_id = next(ids)
                    pending[job_id] = (request, len(body))
                    pending_bytes += len(body)
                    jobs.append((job_id, (server, body, sample_key)))
                    if len(jobs) == free or (pending_bytes >= AHEAD_BYTES and len(pending) >= limit):
                        exhausted = False
                        break
            if jobs or limit != sent_limit:
                client.send(limit, jobs)
                sent_limit = limit

        try:
            while True:
                refill(force=not pending)
                if not pending:
                    break
                last = self._account(client.running, last)  # running as the client last said
                results, retries = client.receive()
                self.stats.in_flight_peak = max(self.stats.in_flight_peak, client.peak)
                for cause in retries:
                    self._count_retry(cause)
                for job_id, result in results:
                    request, size = pending.pop(job_id)
                    pending_bytes -= size
                    yield self._take(request, result)
                    refill()  # the server is fed while the stage works through the answers already back
        finally:
            client.close()
            self.stats.generate_seconds += time.perf_counter() - start
            self._log_retries(time.monotonic())
            if self.stats.no_content:
                logger.warning("engine server answered %d request(s) with `content: null` and no reasoning: recorded "
                               "with reason no_content (a content filter, or a server bug)", self.stats.no_content)

    def _work(self, requests: Iterable[ChatRequest]) -> Iterator[tuple[str, bytes, ChatRequest, str | None]]:
        for request in requests:
            server = server_for(request.key, self.servers)
            for sample_key, body in self.bodies(request):
                yield server, body, request, sample_key

    def _account(self, in_flight: int, since: float) -> float:
        now = time.perf_counter()
        self.in_flight_seconds += in_flight * (now - since)
        return now

    def _take(self, request: ChatRequest, fields: tuple | BaseException) -> tuple[ChatRequest, GenerationResult]:
        if isinstance(fields, BaseException):  # EngineUnavailable: the stage ends, its records are kept
            raise fields
        result = GenerationResult(*fields)
        self.stats.requests += 1
        self.stats.prompt_tokens += result.prompt_tokens
        self.stats.padded_prompt_tokens += result.prompt_tokens
        self.stats.generated_tokens += result.generated_tokens
        self.stats.padded_generated_tokens += result.generated_tokens
        if result.failed:
            self.stats.failed += 1
            self.failed_in_a_row += 1
            if self.failed_in_a_row >= FAILED_IN_A_ROW:
                raise EngineUnavailable(
                    f"engine server {server_for(request.key, self.servers)} failed {self.failed_in_a_row} requests "
                    f"in a row, each after {self.max_retries + 1} tries (last: request {request.key!r}, "
                    f"{result.failed}); every finished record is on disk: rerun the same command once the server "
                    "answers again")
            logger.warning("request %r failed: %s; recorded as a drop (request_failed), the next run asks it again",
                           request.key, result.failed)
            return request, result
        self.failed_in_a_row = 0
        if self.adaptive is not None:
            self.adaptive.answered()
        if result.refused:
            self.stats.refused += 1
            logger.warning("engine server refused request %r: %s (recorded as a drop)", request.key, result.refused)
            if self.answered == 0 and self.stats.refused >= REFUSALS_BEFORE_ANY_ANSWER:
                raise EngineUnavailable(f"the engine server refused the first {self.stats.refused} requests and "
                                        f"answered none (last: {result.refused}); it cannot take these requests")
        else:
            self.answered += 1
            self.stats.no_content += result.no_content
        return request, result

    async def _open_session(self):
        import aiohttp

        # One connection per request in flight to each server; DNS cached; the key in the session's headers only.
        connector = aiohttp.TCPConnector(limit=self.max_concurrency, limit_per_host=self.max_concurrency,  # auto: MAX
                                         ttl_dns_cache=300)
        return aiohttp.ClientSession(connector=connector,
                                     headers={**_headers(self._api_key), "Content-Type": "application/json"},
                                     timeout=aiohttp.ClientTimeout(total=self.timeout_seconds))
