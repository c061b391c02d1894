"""The generation engine on real tiny models: batched output equals one-by-one output, batches respect the token
budget, out-of-memory splits and retries, token counting and decoding, sampling."""

from __future__ import annotations

import pytest
from engine_helpers import (
    SIZES,
    BatchRecordingModel,
    OOMAboveBatchSizeModel,
    ScriptedTokensModel,
    as_dict,
    eos_ids,
    image_requests,
    naive_generate,
    text_requests,
)
from tokenizers import AddedToken
from transformers.image_processing_utils import SizeDict

from rsgen.engine import ChatRequest
from rsgen.engine.models import load_model_and_processor
from rsgen.engine.transformers_engine import TransformersEngine
from rsgen.testing.zoo import ZOO_ARCHS

# transformers' model, processor, generate and cache APIs: .ci/run runs the slow ones on the floors too
pytestmark = pytest.mark.floors

MAX_NEW = 12
THINKING = {"enable_thinking": True}


@pytest.fixture(scope="module")
def loaded(zoo_model_path):
    """`loaded(arch)` -> (model, processor), loaded once per module; tests must not change them."""
    cache = {}

    def load(arch):
        if arch not in cache:
            cache[arch] = load_model_and_processor(zoo_model_path(arch))
        return cache[arch]

    return load


def run_engine(model, processor, requests, **kwargs) -> dict:
    kwargs.setdefault("max_new_tokens", MAX_NEW)
    kwargs.setdefault("chat_template_kwargs", THINKING)
    engine = TransformersEngine(model, processor, **kwargs)
    results = {}
    for request, result in engine.generate(requests):
        assert request.key not in results, f"{request.key} answered twice"
        results[request.key] = as_dict(result)
    return results, engine


def check_batched_equals_one_by_one(model, processor, requests):
    expected = {r.key: naive_generate(model, processor, r, MAX_NEW, THINKING) for r in requests}
    recorder = BatchRecordingModel(model)
    longest = max(e["prompt_tokens"] for e in expected.values())
    budget = 3 * (longest + MAX_NEW)
    got, engine = run_engine(recorder, processor, requests, token_budget=budget, max_batch_size=4)

    assert got == expected
    # Several batches, some of several rows, every one within the budget and the row cap.
    assert len(recorder.shapes) >= 2 and max(rows for rows, _ in recorder.shapes) >= 3
    for rows, padded in recorder.shapes:
        assert rows <= 4 and rows * (padded + MAX_NEW) <= budget
    # The engine's length estimate (what it sorts and budgets by) is the processor's exact length.
    for r in requests:
        assert engine.measure(r).length == expected[r.key]["prompt_tokens"]
    return expected, engine


@pytest.mark.slow
@pytest.mark.parametrize("arch", ZOO_ARCHS)
def test_batched_equals_one_by_one(arch, loaded):
    model, processor = loaded(arch)
    expected, _ = check_batched_equals_one_by_one(model, processor, image_requests(8, seed=ZOO_ARCHS.index(arch)))
    assert len({e["text"] for e in expected.values()}) > 1, "outputs do not depend on the input: a useless test"


@pytest.mark.slow
def test_dynamic_resolution_image_tokens(zoo_model_path):
    """Qwen2-VL with a pixel range: images of different sizes give different numbers of image tokens, which the
    engine must count exactly (it sorts and budgets by them) and batch without changing the output."""
    model, processor = load_model_and_processor(zoo_model_path("qwen2_vl"))
    processor.image_processor.size = SizeDict(shortest_edge=28 * 28 * 2, longest_edge=28 * 28 * 12)
    _, engine = check_batched_equals_one_by_one(model, processor, image_requests(8, seed=7))
    assert len({engine._image_tokens(size) for size in SIZES}) > 2


@pytest.mark.slow
def test_text_only_requests(loaded):
    """The judge's requests: no images at all."""
    model, processor = loaded("qwen2_5_vl")
    check_batched_equals_one_by_one(model, processor, text_requests(8))


@pytest.mark.slow
def test_oom_splits_batch_and_lowers_budget(loaded):
    model, processor = loaded("llava")
    requests = image_requests(8, seed=3)
    baseline, _ = run_engine(model, processor, requests, token_budget=10**6, max_batch_size=8)

    wrapped = OOMAboveBatchSizeModel(model, max_rows=2)
    got, engine = run_engine(wrapped, processor, requests, token_budget=10**6, max_batch_size=8)

    assert got == baseline
    assert wrapped.ooms >= 1 and engine.stats.oom_splits == wrapped.ooms
    assert engine.token_budget < 10**6
    assert max(wrapped.batch_sizes) == 2 and sum(wrapped.batch_sizes) == len(requests)


@pytest.mark.slow
def test_oom_on_a_single_request_is_a_clear_error(loaded):
    model, processor = loaded("llava")
    engine = TransformersEngine(OOMAboveBatchSizeModel(model, max_rows=0), processor, max_new_tokens=4)
    with pytest.raises(RuntimeError, match="out of memory on a single request .*lower max_new_tokens"):
        list(engine.generate(image_requests(2)))


@pytest.mark.slow
def test_greedy_ignores_model_sampling_and_penalty_defaults(zoo_model_path):
    """temperature 0 means argmax: a repetition penalty or top_k in the model's generation_config is not applied."""
    model, processor = load_model_and_processor(zoo_model_path("idefics3"))
    requests = image_requests(6, seed=11)
    plain, _ = run_engine(model, processor, requests, token_budget=10**6)
    penalised_naive = {}
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.top_k = 5
    for r in requests:
        penalised_naive[r.key] = naive_generate(model, processor, r, MAX_NEW, THINKING)
    got, _ = run_engine(model, processor, requests, token_budget=10**6)
    assert got == plain
    assert penalised_naive != plain, "the penalty changes nothing on this model: the test cannot fail"


@pytest.mark.slow
def test_sampling_is_seeded(loaded):
    model, processor = loaded("qwen3_vl")
    requests = image_requests(6, seed=5)
    sample = dict(temperature=1.0, top_p=0.95, token_budget=10**6, max_new_tokens=12)
    a, _ = run_engine(model, processor, requests, seed=1, **sample)
    b, _ = run_engine(model, processor, requests, seed=1, **sample)
    c, _ = run_engine(model, processor, requests, seed=2, **sample)
    greedy, _ = run_engine(model, processor, requests, token_budget=10**6, max_new_tokens=12)
    assert a == b
    assert a != c and a != greedy


@pytest.mark.slow
def test_token_counts_and_decoding(zoo_model_path):
    """generated_tokens counts up to and including EOS; hit_limit means no EOS; reasoning and answer tags survive
    decoding even where the tokenizer marks them special, other special tokens do not."""
    model, processor = load_model_and_processor(zoo_model_path("qwen2_vl"))
    tok = processor.tokenizer
    tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in ("<answer>", "</answer>", "<|ctrl|>")],
                   special_tokens=True)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    one = lambda token: tok.convert_tokens_to_ids(token)  # noqa: E731
    eos = eos_ids(model)[0]
    requests = text_requests(3)
    engine = TransformersEngine(model, processor, max_new_tokens=16, chat_template_kwargs=THINKING)
    lengths = [engine.measure(r).length for r in requests]
    assert len(set(lengths)) == 3
    answer = [one("<think>"), *ids("two and two"), one("</think>"), one("<answer>"), *ids("4"), one("</answer>")]
    cut_off = [one("<|ctrl|>"), *ids("and so on and so on and so on and so on and so on")][:16]
    assert len(cut_off) == 16
    scripts = {lengths[0]: answer + [eos], lengths[1]: cut_off, lengths[2]: [eos]}
    engine.model = ScriptedTokensModel(model, scripts, pad_id=tok.pad_token_id)

    got = {r.key: res for r, res in engine.generate(requests)}
    first, second, third = (got[r.key] for r in requests)
    assert first.text == "<think>two and two</think><answer>4</answer>"
    assert (first.generated_tokens, first.hit_limit) == (len(answer) + 1, False)
    assert "<|ctrl|>" not in second.text and second.text.startswith("and so on")
    assert (second.generated_tokens, second.hit_limit) == (16, True)
    assert (third.text, third.generated_tokens, third.hit_limit) == ("", 1, False)
    assert [res.prompt_tokens for res in (first, second, third)] == lengths


@pytest.mark.slow
def test_reasoning_tag_opened_by_the_template_is_kept(zoo_model_path):
    """Thinking-only templates end the prompt with "<think>\n": the response still starts with the tag."""
    model, processor = load_model_and_processor(zoo_model_path("qwen3_vl"))
    processor.chat_template += "{%- if add_generation_prompt -%}{{ '<think>\n' }}{%- endif -%}"
    requests = image_requests(3, seed=2)
    got, _ = run_engine(model, processor, requests, token_budget=10**6)
    for r in requests:
        expected = naive_generate(model, processor, r, MAX_NEW, THINKING)
        assert got[r.key] == {**expected, "text": "<think>\n" + expected["text"]}


def test_image_count_must_match_image_parts(loaded):
    model, processor = loaded("llava")
    engine = TransformersEngine(model, processor, max_new_tokens=4)
    bad = ChatRequest("bad", [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "hi"}]}], [])
    with pytest.raises(ValueError, match="'bad' has 1 image part"):
        list(engine.generate([bad]))


def test_request_the_processor_refuses_is_named(loaded):
    """A question that contains the image placeholder itself makes the processor count two images for one."""
    model, processor = loaded("llava")
    requests = image_requests(3)
    requests[1].messages[0]["content"][1]["text"] += " <image>"
    engine = TransformersEngine(model, processor, max_new_tokens=4, token_budget=10**6)
    with pytest.raises(ValueError, match="could not prepare request 'q001'"):
        list(engine.generate(requests))


def test_engine_rejects_bad_settings(loaded):
    model, processor = loaded("llava")
    for kwargs in ({"max_new_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}, {"token_budget": 0}):
        with pytest.raises(ValueError):
            TransformersEngine(model, processor, **kwargs)


def test_requests_are_consumed_lazily(loaded):
    """The engine reads requests window by window, so a caller can stream a pool larger than memory."""
    model, processor = loaded("llava")
    pulled = []

    def stream():
        for r in image_requests(24):
            pulled.append(r.key)
            yield r

    engine = TransformersEngine(model, processor, max_new_tokens=2, sort_window=4, prefetch_batches=1, token_budget=10**6)
    it = engine.generate(stream())
    next(it)
    assert len(pulled) <= 12
    assert len(list(it)) == 23
