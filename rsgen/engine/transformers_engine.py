"""The `transformers` engine: batched chat generation with `model.generate`, shared by every stage that generates.

How it keeps a GPU busy:

- Requests are read in windows, measured (prompt tokens, image tokens included) and sorted longest first, so a
  batch holds prompts of similar length and little compute goes to padding.
- Batches are cut by a token budget, not a fixed count: rows x (padded prompt + max_new_tokens) <= budget (and
  at most `max_batch_size` rows). Short prompts make wide batches, long ones narrow batches; memory stays flat.
- Image decoding, chat templating and the processor run in background threads, a few batches ahead, while the
  main thread is inside `model.generate`.
- Left padding, so batched greedy output is the output each request would get alone.
- Sampling (temperature > 0) is reproducible per request: every row draws from its own random stream, fixed
  by (seed, its key) (`rsgen.engine.sampling`), so a response never depends on its batch or on a restart.
  A request with several `sample_keys` is encoded and prefilled once; its cache is repeated per sample.
- On CUDA out-of-memory the batch is split in half and retried, and the budget is lowered for what follows.

Decoding is defined by the engine's arguments alone (greedy unless temperature > 0): sampling and penalty
settings in the model's `generation_config.json` (e.g. a repetition penalty) are reset, so "temperature 0"
means argmax decoding for every model.

Longer than most modules (~520 lines): nearly all of it is the one class `TransformersEngine`, whose measuring,
batching, background preparation and out-of-memory back-off share its model, processor and token budget.
"""

from __future__ import annotations

import copy
import gc
import inspect
import io
import itertools
import logging
import re
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
from PIL import Image
from transformers import BatchFeature, GenerationConfig

from rsgen.engine.base import ChatRequest, EngineStats, GenerationResult, Role
from rsgen.engine.sampling import RowSeededSampler, row_seed

logger = logging.getLogger(__name__)

# Special tokens kept when decoding: reasoning and answer tags are output, not control tokens, even where a
# tokenizer marks them special (the verifier and the emitted `response` need them).
KEEP_SPECIAL_TOKEN_RE = re.compile(r"^</?(think|thinking|thought|reasoning|answer|solution)>$")

# A chat template that ends the prompt with an opening reasoning tag (thinking-only models: "<think>\n") makes
# the model's output start inside the reasoning; the tag is given back to the response so that every response
# reads "<think>...</think>answer" whatever the template.
OPEN_REASONING_TAG_RE = re.compile(r"<(?:think|thinking|thought|reasoning)>\s*$")

# After an out-of-memory error the token budget becomes this share of the batch that failed.
OOM_BUDGET_FACTOR = 0.5


@dataclass
class _Measured:
    request: ChatRequest
    text: str  # the rendered chat template
    length: int  # prompt tokens the processor will produce for this request alone
    num_images: int
    response_prefix: str  # an opening reasoning tag the template put at the end of the prompt, else ""
    rows: int = 1  # responses drawn from this prompt (its sample keys, else 1)


@dataclass
class _Encoded:
    items: list[_Measured]
    inputs: Any  # BatchFeature on the CPU
    padded_length: int


def _is_oom(exc: BaseException) -> bool:
    return isinstance(exc, torch.OutOfMemoryError)


def _image_size(image) -> tuple[int, int]:
    if isinstance(image, Image.Image):
        return image.size
    if isinstance(image, (bytes, bytearray, memoryview)):
        with Image.open(io.BytesIO(image)) as im:  # reads the header only
            return im.size
    raise TypeError(f"request images must be PIL images or encoded bytes, got {type(image).__name__}")


def decode_image(image) -> Image.Image:
    """Encoded bytes or a PIL image -> a loaded RGB PIL image (what the processor receives)."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        image = Image.open(io.BytesIO(image))
    elif not isinstance(image, Image.Image):
        raise TypeError(f"request images must be PIL images or encoded bytes, got {type(image).__name__}")
    if image.mode != "RGB":
        image = image.convert("RGB")
    image.load()
    return image


def count_image_parts(messages: list[dict]) -> int:
    n = 0
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            n += sum(1 for part in content if isinstance(part, dict) and part.get("type") == "image")
    return n


class TransformersEngine:
    """Generates responses for chat requests in length-sorted, token-budgeted batches.

    `engine.generate(requests)` yields `(request, result)` pairs in completion order. The model is used as given
    (loaded once by the caller); `processor` is its `AutoProcessor` (or a tokenizer, for text-only models).
    """

    def __init__(
        self,
        model,
        processor,
        max_new_tokens: int = 2048,
        temperature: float = 0.0,
        top_p: float = 1.0,
        token_budget: int = 32768,
        max_batch_size: int = 256,
        chat_template_kwargs: dict[str, Any] | None = None,
        seed: int = 0,
        num_workers: int = 2,
        prefetch_batches: int = 3,
        sort_window: int = 2048,
    ):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {temperature}")
        if not 0 < top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if token_budget < 1 or max_batch_size < 1:
            raise ValueError("token_budget and max_batch_size must be >= 1")
        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        if getattr(self.tokenizer, "padding_side", "left") != "left":
            # Right padding changes batched greedy output (measured on five architectures); the engine owns it.
            self.tokenizer.padding_side = "left"
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.token_budget = token_budget
        self.max_batch_size = max_batch_size
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.seed = seed
        self.num_workers = max(1, num_workers)
        self.prefetch_batches = max(1, prefetch_batches)
        self.sort_window = max(1, sort_window)
        self.stats = EngineStats()

        self.eos_token_ids = self._eos_token_ids()
        pad = self.tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else self.eos_token_ids[0]
        self.generation_config = self._generation_config()
        self._skip_ids = self._ids_to_skip_when_decoding()
        self._image_token_cache: dict[tuple[int, int], int] = {}
        self._lock = threading.Lock()
        self._thread_local = threading.local()
        self._warned_length = False
        # The commit the weights came from when loaded from the Hub cache (work records carry it).
        self.revision = getattr(getattr(model, "config", None), "_commit_hash", None)

    @classmethod
    def from_spec(cls, spec, device=None) -> TransformersEngine:
        """Load `spec.model_path` with `load_model_and_processor` and wrap it (rsgen.engine.build_engine calls this)."""
        from rsgen.engine.models import load_model_and_processor

        model, processor = load_model_and_processor(
            spec.model_path,
            revision=spec.revision,
            torch_dtype=spec.torch_dtype,
            attn_implementation=spec.attn_implementation,
            trust_remote_code=spec.trust_remote_code,
            device=device,
            allow_text_only=spec.role is Role.JUDGE,  # the judge reads text only: a text LM will do
        )
        decoding = ("max_new_tokens", "temperature", "top_p", "token_budget", "max_batch_size", "chat_template_kwargs",
                    "seed")
        engine = cls(model, processor, **{name: getattr(spec, name) for name in decoding})
        engine.revision = engine.revision or spec.revision
        return engine

    # ------------------------------------------------------------------ setup

    def _eos_token_ids(self) -> list[int]:
        eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = self.tokenizer.eos_token_id
        if eos is None:
            raise ValueError("the model has no EOS token (generation_config.eos_token_id and tokenizer.eos_token_id are unset)")
        return [eos] if isinstance(eos, int) else list(eos)

    def _generation_config(self) -> GenerationConfig:
        # Every logits-shaping field is set explicitly: generate() fills unset (None) fields from the model's own
        # generation_config, which may carry a repetition penalty or top_k that the recipe did not ask for.
        # Selection is always greedy: with temperature > 0 the row-seeded sampler (`_generate_batch`) applies
        # temperature and top-p, draws the token and leaves only it finite, so argmax picks the sample.
        return GenerationConfig(
            max_new_tokens=self.max_new_tokens,
            do_sample=False,
            repetition_penalty=1.0,
            no_repeat_ngram_size=0,
            num_beams=1,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
        )

    def _ids_to_skip_when_decoding(self) -> set[int]:
        """What `skip_special_tokens=True` removes, minus reasoning/answer tags (often special added tokens)."""
        tok = self.tokenizer
        special: dict[int, str] = {}
        for token_id, added in getattr(tok, "added_tokens_decoder", {}).items():
            if getattr(added, "special", False):
                special[token_id] = str(added)
        for token_id, token in zip(tok.all_special_ids, tok.all_special_tokens):
            special[token_id] = token
        return {i for i, t in special.items() if not KEEP_SPECIAL_TOKEN_RE.match(t)}

    def _local(self):
        """(processor, tokenizer) private to the calling thread. A fast tokenizer keeps its padding settings in
        shared Rust state and refuses concurrent use ("Already borrowed"), so each worker thread gets a copy."""
        local = self._thread_local
        if not hasattr(local, "processor"):
            with self._lock:
                processor = copy.deepcopy(self.processor)
            local.processor = processor
            local.tokenizer = getattr(processor, "tokenizer", processor)
        return local.processor, local.tokenizer

    # ------------------------------------------------------------------ measuring

    def render(self, request: ChatRequest) -> str:
        n_parts = count_image_parts(request.messages)
        if n_parts != len(request.images):
            raise ValueError(
                f"request {request.key!r} has {n_parts} image part(s) in its messages but {len(request.images)} image(s)"
            )
        processor, _ = self._local()
        return processor.apply_chat_template(
            request.messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )

    def _add_special_tokens(self, text: str) -> bool:
        # As the processor's own apply_chat_template does: a template that writes BOS itself gets no second one.
        bos = self.tokenizer.bos_token
        return not (bos is not None and text.startswith(bos))

    def _text_length(self, text: str) -> int:
        _, tokenizer = self._local()
        return len(tokenizer(text, add_special_tokens=self._add_special_tokens(text))["input_ids"])

    def _image_tokens(self, size: tuple[int, int]) -> int:
        """Tokens one image of this size adds to a prompt, measured once per size with the processor itself (the
        count depends only on the size for every processor we know: fixed, tiled, or dynamic resolution)."""
        cached = self._image_token_cache.get(size)
        if cached is not None:
            return cached
        processor, _ = self._local()
        probe = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}]
        text = processor.apply_chat_template(probe, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs)
        blank = Image.new("RGB", size)
        with_image = processor(
            text=[text], images=[[blank]], add_special_tokens=self._add_special_tokens(text), return_tensors="pt"
        )["input_ids"].shape[1]
        count = with_image - self._text_length(text)
        self._image_token_cache[size] = count
        return count

    def measure(self, request: ChatRequest) -> _Measured:
        if request.sample_keys and self.temperature == 0:
            raise ValueError(f"request {request.key!r} asks for {len(request.sample_keys)} samples but the engine "
                             "decodes greedily (temperature 0): every sample would be the same response")
        text = self.render(request)
        length = self._text_length(text) + sum(self._image_tokens(_image_size(im)) for im in request.images)
        tag = OPEN_REASONING_TAG_RE.search(text)
        return _Measured(request, text, length, len(request.images), tag.group() if tag else "", request.num_responses)

    # ------------------------------------------------------------------ planning

    def _batch_cost(self, n_rows: int, padded_length: int) -> int:
        return n_rows * (padded_length + self.max_new_tokens)

    def _cut_batches(self, window: list[_Measured]) -> list[list[_Measured]]:
        """Longest first; text-only and image requests never share a batch (processors want one or the other),
        nor do requests drawing different numbers of samples (one cache repetition per batch).
        Rows (responses), not requests, count against the budget and `max_batch_size`."""
        window = sorted(window, key=lambda m: (m.num_images > 0, m.rows, -m.length))
        batches: list[list[_Measured]] = []
        current: list[_Measured] = []
        for item in window:
            rows = len(current) * (current[0].rows if current else 0) + item.rows
            if current and (
                rows > self.max_batch_size
                or (current[0].num_images > 0) != (item.num_images > 0)
                or current[0].rows != item.rows
                or self._batch_cost(rows, current[0].length) > self.token_budget
            ):
                batches.append(current)
                current = []
            current.append(item)
        if current:
            batches.append(current)
        return batches

    def _measured_windows(self, requests: Iterable[ChatRequest], pool: ThreadPoolExecutor) -> Iterator[list[_Measured]]:
        """Windows of measured requests; the next window is read and measured in the background."""
        it = iter(requests)

        def read_and_measure() -> list[_Measured]:
            return [self.measure(r) for r in itertools.islice(it, self.sort_window)]

        future = pool.submit(read_and_measure)
        while True:
            window = future.result()
            if not window:
                return
            future = pool.submit(read_and_measure)
            yield window

    def _planned_batches(self, requests: Iterable[ChatRequest], pool: ThreadPoolExecutor) -> Iterator[list[_Measured]]:
        for window in self._measured_windows(requests, pool):
            yield from self._cut_batches(window)

    # ------------------------------------------------------------------ encoding

    def encode(self, items: list[_Measured]) -> _Encoded:
        """Decode images and run the processor for one batch (runs in a worker thread). A request the processor
        refuses (e.g. a question that itself contains an image placeholder) is named in the error."""
        try:
            return self._encode(items)
        except Exception as batch_error:
            culprit, error = items[0], batch_error
            for item in items if len(items) > 1 else []:
                try:
                    self._encode([item])
                except Exception as single_error:
                    culprit, error = item, single_error
                    break
            raise ValueError(f"the processor could not prepare request {culprit.request.key!r}: {error}") from error

    def _encode(self, items: list[_Measured]) -> _Encoded:
        processor, tokenizer = self._local()
        texts = [m.text for m in items]
        kwargs: dict[str, Any] = {"padding": True, "return_tensors": "pt"}
        add_special = {self._add_special_tokens(t) for t in texts}
        if len(add_special) == 1:
            kwargs["add_special_tokens"] = add_special.pop()
        if any(m.num_images for m in items):
            images = [[decode_image(im) for im in m.request.images] for m in items]
            inputs = processor(text=texts, images=images, **kwargs)
        elif tokenizer is processor:
            inputs = tokenizer(texts, **kwargs)
        else:
            inputs = processor(text=texts, **kwargs)
        return _Encoded(items, inputs, int(inputs["input_ids"].shape[1]))

    # ------------------------------------------------------------------ generating

    def generate(self, requests: Iterable[ChatRequest]) -> Iterator[tuple[ChatRequest, GenerationResult]]:
        """Yield `(request, result)` for every request, in completion order."""
        with ThreadPoolExecutor(max_workers=self.num_workers, thread_name_prefix="rsgen-prepare") as pool:
            planned = self._planned_batches(requests, pool)
            inflight: deque[Future] = deque()

            def refill() -> None:
                while len(inflight) < self.prefetch_batches:
                    batch = next(planned, None)
                    if batch is None:
                        return
                    inflight.append(pool.submit(self.encode, batch))

            try:
                refill()
                while inflight:
                    start = time.perf_counter()
                    encoded = inflight.popleft().result()
                    self.stats.wait_seconds += time.perf_counter() - start
                    refill()
                    yield from self._run(encoded)
            finally:
                for f in inflight:
                    f.cancel()

    def _run(self, encoded: _Encoded) -> Iterator[tuple[ChatRequest, GenerationResult]]:
        """Generate one encoded batch; split it when it exceeds the (possibly lowered) budget or runs out of memory."""
        n = len(encoded.items)
        rows = n * encoded.items[0].rows
        measured = max(m.length for m in encoded.items)
        if encoded.padded_length != measured and not self._warned_length:
            self._warned_length = True
            logger.warning(
                "prompt length estimate off for this processor (%d measured, %d actual): batches are split to fit "
                "the token budget, which costs speed, not results", measured, encoded.padded_length,
            )
        if n > 1 and self._batch_cost(rows, encoded.padded_length) > self.token_budget:
            for half in (encoded.items[: n // 2], encoded.items[n // 2 :]):
                yield from self._run(self.encode(half))
            return
        try:
            results = self._generate_batch(encoded)
        except Exception as exc:  # only out-of-memory is handled; the rest propagates below
            if not _is_oom(exc):
                raise
            oom = True
        else:
            oom = False
        if oom:
            # Outside the except block, so the traceback no longer pins the failed batch's tensors.
            self._free_memory()
            cost = self._batch_cost(rows, encoded.padded_length)
            if n == 1:
                raise RuntimeError(
                    f"out of memory on a single request ({encoded.items[0].request.key!r}: {encoded.padded_length} "
                    f"prompt tokens + max_new_tokens {self.max_new_tokens}, {rows} response(s)); lower "
                    "max_new_tokens or max_image_pixels, or use a GPU with more memory"
                )
            self.token_budget = max(1, min(self.token_budget, int(cost * OOM_BUDGET_FACTOR)))
            self.stats.oom_splits += 1
            logger.warning(
                "CUDA out of memory on a batch of %d rows (%d tokens); splitting it and lowering token_budget to %d",
                rows, cost, self.token_budget,
            )
            for half in (encoded.items[: n // 2], encoded.items[n // 2 :]):
                yield from self._run(self.encode(half))
            return
        yield from results

    @staticmethod
    def _free_memory() -> None:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    @staticmethod
    def _row_keys(items: list[_Measured]) -> list[tuple[_Measured, str | None]]:
        """(item, sample key) per output row: a request's samples are consecutive rows (`_generate_shared`)."""
        return [(m, k) for m in items for k in (m.request.sample_keys or (None,))]

    def _generate_shared(self, inputs, samples: int, extra: dict[str, Any]) -> torch.Tensor:
        """`samples` responses per prompt, the prompt's image encoding and prefill computed once.

        The prompts minus their last token are prefilled by `generate` itself (one step, so every architecture
        computes its own positions, M-RoPE included); the cache is then repeated per sample, and generation
        continues from the full prompts, each row with its own seed. Per-row state a model keeps from its prefill
        (Qwen-VL's `rope_deltas`) is repeated with it. Equal to separate requests (tested on five architectures).
        """
        ids = inputs["input_ids"]
        rows, length = ids.shape
        # Per-token inputs (ids, masks, token types) lose their last position; images and their grids stay whole.
        per_token = {k for k, v in inputs.items() if torch.is_tensor(v) and v.dim() == 2 and tuple(v.shape) == (rows, length)}
        prefix = {k: (v[:, :-1] if k in per_token else v) for k, v in inputs.items()}
        prefill = copy.deepcopy(self.generation_config)
        prefill.max_new_tokens, prefill.return_dict_in_generate = 1, True
        out = self.model.generate(**prefix, generation_config=prefill)
        cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
        cache.batch_repeat_interleave(samples)
        for module in self.model.modules():
            state = getattr(module, "rope_deltas", None)
            if torch.is_tensor(state) and state.shape[0] == rows:
                module.rope_deltas = state.repeat_interleave(samples, dim=0)
        expanded = {k: inputs[k].repeat_interleave(samples, dim=0) for k in per_token}
        # transformers renamed `past_key_values` to `cache` (5.2x); older releases know only the old name.
        name = "cache" if "cache" in inspect.signature(self.model.forward).parameters else "past_key_values"
        return self.model.generate(**expanded, **{name: cache}, generation_config=self.generation_config, **extra)

    def _generate_batch(self, encoded: _Encoded) -> list[tuple[ChatRequest, GenerationResult]]:
        device = getattr(self.model, "device", torch.device("cpu"))
        dtype = getattr(self.model, "dtype", None)
        # A processor's BatchFeature casts pixel values to the model's dtype; a tokenizer's BatchEncoding (text-only
        # models) holds token ids only and moves without a cast.
        if dtype is not None and isinstance(encoded.inputs, BatchFeature):
            inputs = encoded.inputs.to(device=device, dtype=dtype)
        else:
            inputs = encoded.inputs.to(device)
        row_keys = self._row_keys(encoded.items)
        samples = encoded.items[0].rows
        extra: dict[str, Any] = {}
        if self.temperature > 0:
            # Each row's stream is fixed by (seed, its key): the response does not depend on the batch.
            seeds = [row_seed(self.seed, key if key is not None else m.request.key) for m, key in row_keys]
            extra["logits_processor"] = [
                RowSeededSampler(seeds, encoded.padded_length, self.temperature, self.top_p)
            ]
        start = time.perf_counter()
        with torch.inference_mode():
            if samples > 1:
                output = self._generate_shared(inputs, samples, extra)
            else:
                output = self.model.generate(**inputs, generation_config=self.generation_config, **extra)
        new_tokens = output[:, encoded.padded_length :].cpu()
        self.stats.generate_seconds += time.perf_counter() - start

        prompt_lengths = inputs["attention_mask"].sum(dim=1).repeat_interleave(samples).tolist()
        is_eos = torch.isin(new_tokens, torch.tensor(self.eos_token_ids))
        has_eos = is_eos.any(dim=1).tolist()
        first_eos = is_eos.int().argmax(dim=1).tolist()
        rows, steps = new_tokens.shape
        results = []
        for i, (item, key) in enumerate(row_keys):
            n_gen = first_eos[i] + 1 if has_eos[i] else steps
            ids = [t for t in new_tokens[i, : first_eos[i] if has_eos[i] else steps].tolist() if t not in self._skip_ids]
            text = item.response_prefix + self.tokenizer.decode(
                ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
            )
            results.append(
                (item.request, GenerationResult(text, int(prompt_lengths[i]), n_gen, hit_limit=not has_eos[i],
                                                sample_key=key))
            )
            self.stats.prompt_tokens += int(prompt_lengths[i])
            self.stats.generated_tokens += n_gen
        self.stats.requests += rows
        self.stats.batches += 1
        self.stats.padded_prompt_tokens += rows * encoded.padded_length
        self.stats.padded_generated_tokens += rows * steps
        return results
