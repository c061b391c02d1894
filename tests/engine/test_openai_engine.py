"""The `openai` engine's client side: request building, response parsing, concurrency, retries and refusals,
against a STUB server that answers at once (rsgen.testing.stub_server; the real-server tests are in
test_openai_server.py)."""

from __future__ import annotations

import base64
import json
import threading
import time

import pytest
from engine_helpers import image_requests, png_bytes

from rsgen.config import RecipeConfig, RecipeError, recipe_from_dict
from rsgen.engine import ChatRequest, EngineUnavailable, GenerationResult, engine_spec
from rsgen.engine import openai_engine as oe
from rsgen.engine.openai_engine import (
    OpenAIEngine,
    check_servers,
    openai_messages,
    parse_completion,
    request_body,
    response_text,
    retry_after_seconds,
    server_for,
)
from rsgen.engine.sampling import row_seed
from rsgen.testing.stub_server import STUB_MODEL, StubChatServer, free_port, stub_completion


@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(oe, "BACKOFF_BASE_SECONDS", 0.01)


def _image_request(key="q1", n_images=2):
    content = [{"type": "image"} for _ in range(n_images)] + [{"type": "text", "text": "How many?\nAnswer in short."}]
    return ChatRequest(key, [{"role": "user", "content": content}], [png_bytes(8 + i, 8, i) for i in range(n_images)])


# ---------------------------------------------------------------------- request building


def test_images_become_data_uris_in_the_order_of_the_image_parts_and_text_stays_byte_identical():
    request = _image_request()
    (message,) = openai_messages(request)
    parts = message["content"]
    assert [p["type"] for p in parts] == ["image_url", "image_url", "text"]
    for part, image in zip(parts, request.images):
        prefix, data = part["image_url"]["url"].split(",", 1)
        assert prefix == "data:image/png;base64" and base64.b64decode(data) == image  # the bytes as stored
    assert parts[2]["text"] == "How many?\nAnswer in short."


def test_text_only_content_is_one_string_and_a_missing_image_is_named():
    request = ChatRequest("t", [{"role": "user", "content": [{"type": "text", "text": "a "}, {"type": "text", "text": "b"}]}])
    assert openai_messages(request) == [{"role": "user", "content": "a b"}]
    with pytest.raises(ValueError, match="request 'q1' has 2 image part"):
        openai_messages(ChatRequest("q1", _image_request().messages, [png_bytes(8, 8, 0)]))


def test_greedy_pins_every_sampling_setting_and_sends_template_kwargs_only_when_set():
    greedy = oe.Decoding("m", 64, chat_template_kwargs=(("enable_thinking", True),))
    body = request_body([], greedy, "k")
    assert (body["temperature"], body["top_p"], body["frequency_penalty"], body["presence_penalty"]) == (0, 1, 0, 0)
    assert body["max_tokens"] == 64 and "seed" not in body and body["chat_template_kwargs"] == {"enable_thinking": True}
    assert "top_k" not in body and "repetition_penalty" not in body  # a hosted API refuses fields it does not know
    plain = request_body([], oe.Decoding("m", 64), "k")
    assert "chat_template_kwargs" not in plain
    vllm = request_body([], oe.Decoding("m", 64, server_kind="vllm"), "k")
    assert (vllm["top_k"], vllm["min_p"], vllm["repetition_penalty"]) == (-1, 0.0, 1.0)
    # transformers serve samples only where the model's generation_config says so, and with its top_k: pinned.
    serve = request_body([], oe.Decoding("m", 64, temperature=0.7, server_kind="transformers"), "k")
    assert json.loads(serve["generation_config"]) == {"do_sample": True, "top_k": 0}
    assert "generation_config" not in request_body([], oe.Decoding("m", 64, server_kind="transformers"), "k")


def test_a_greedy_body_is_byte_identical_to_encoding_the_whole_body_and_images_of_the_last_call_are_reused():
    image = png_bytes(8, 8, 0)
    for engine in (OpenAIEngine("http://127.0.0.1:1/v1", 'm"\u00e9\u0000', chat_template_kwargs={"t": "\u00e9"}),
                   OpenAIEngine("http://127.0.0.1:1/v1", "m", server_kind="vllm")):
        for question in ("what? \u00e9", "another \"one\""):
            request = ChatRequest("q", [{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                                          "text": question}]}], [image])
            whole = json.dumps(request_body(openai_messages(request), engine.decoding, "q"), ensure_ascii=False)
            assert engine.bodies(request) == [(None, whole.encode("utf-8"))]
    other = png_bytes(8, 8, 200)
    assert oe.image_data_uri(other) != oe.image_data_uri(image)
    assert oe.image_data_uri(image) == "data:image/png;base64," + __import__("base64").b64encode(image).decode()


def test_messages_json_is_json_dumps_of_the_openai_messages_byte_for_byte():
    one, two = png_bytes(8, 8, 0), png_bytes(9, 8, 1)
    image, text = {"type": "image"}, {"type": "text", "text": "How many? \u00e9 \"q\" \\ \u0000\n"}
    requests = [
        ChatRequest("a", [{"role": "user", "content": [image, text]}], [one]),
        ChatRequest("b", [{"role": "user", "content": [image, text]}], [one]),  # the same image again: cached part
        ChatRequest("c", [{"role": "user", "content": [text, image, image, text]}], [two, one]),
        ChatRequest("d", [{"role": "system", "content": "be brief \u00e9"}, {"role": "user", "content": [text, text]},
                          {"role": "assistant", "content": None}, {"role": "user", "content": []}]),
        ChatRequest("e", [{"role": "user", "content": [image, text]}], [bytearray(two)]),
    ]
    for request in requests:
        assert oe.messages_json(request) == json.dumps(openai_messages(request), ensure_ascii=False)
    with pytest.raises(ValueError, match="request 'q1' has 2 image part"):
        oe.messages_json(ChatRequest("q1", _image_request().messages, [png_bytes(8, 8, 0)]))
    with pytest.raises(ValueError, match="neither text nor image"):
        oe.messages_json(ChatRequest("v", [{"role": "user", "content": [{"type": "video"}]}]))


def test_sampling_sends_one_request_per_sample_key_with_a_seed_of_that_key():
    engine = OpenAIEngine("http://127.0.0.1:1/v1", "m", temperature=0.8, top_p=0.9, seed=7)
    request = ChatRequest("q", _image_request().messages, _image_request().images, sample_keys=("q#1", "q#2"))
    bodies = [(k, json.loads(b)) for k, b in engine.bodies(request)]
    assert [k for k, _ in bodies] == ["q#1", "q#2"]
    assert [b["seed"] for _, b in bodies] == [row_seed(7, "q#1") & (2**63 - 1), row_seed(7, "q#2") & (2**63 - 1)]
    assert bodies[0][1]["seed"] != bodies[1][1]["seed"] and bodies[0][1]["top_p"] == 0.9
    again = [json.loads(b)["seed"] for _, b in engine.bodies(request)]
    assert again == [b["seed"] for _, b in bodies]  # a rerun asks for exactly the same
    with pytest.raises(ValueError, match="decodes greedily"):
        OpenAIEngine("http://127.0.0.1:1/v1", "m").bodies(request)


def test_a_key_always_goes_to_the_same_server_and_keys_spread_over_all():
    servers = ("http://a/v1", "http://b/v1", "http://c/v1")
    chosen = {f"k{i}": server_for(f"k{i}", servers) for i in range(300)}
    assert chosen == {f"k{i}": server_for(f"k{i}", servers) for i in range(300)}
    assert set(chosen.values()) == set(servers)


# ---------------------------------------------------------------------- response parsing


def test_reasoning_returned_apart_is_put_back_inside_think_tags():
    assert response_text({"content": "4", "reasoning_content": "two and two"}, "stop") == "<think>two and two</think>4"
    assert response_text({"content": "4", "reasoning": "r"}, "stop") == "<think>r</think>4"  # vLLM's newer field
    # Cut off inside the reasoning: left open, as the raw output would be (the verifier says no_answer).
    assert response_text({"content": None, "reasoning_content": "long"}, "length") == "<think>long"
    # The template opened the reasoning in the prompt and the server has no reasoning parser.
    assert response_text({"content": "r</think>4"}, "stop") == "<think>r</think>4"
    assert response_text({"content": "<think>r</think>4"}, "stop") == "<think>r</think>4"
    assert response_text({"content": "4"}, "stop") == "4"  # a hosted model that hides its reasoning


def test_usage_and_finish_reason_become_token_counts_and_hit_limit():
    result = parse_completion(stub_completion("x", finish_reason="length", prompt_tokens=20, completion_tokens=5), "k#1")
    assert (result.prompt_tokens, result.generated_tokens, result.hit_limit, result.sample_key) == (20, 5, True, "k#1")
    with pytest.raises(ValueError, match="not a chat completion"):
        parse_completion({"object": "error"}, None)


def test_retry_after_in_seconds_or_as_a_date():
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds(None) is None
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0  # in the past: at once
    assert retry_after_seconds("garbage") is None


# ---------------------------------------------------------------------- against the stub


def test_every_request_comes_back_once_with_its_result_and_counters():
    with StubChatServer() as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_new_tokens=9, max_concurrency=4)
        requests = image_requests(10)
        out = list(engine.generate(requests))
    assert sorted(r.key for r, _ in out) == sorted(r.key for r in requests)
    assert all(res.text == "stub answer" and res.prompt_tokens == 11 for _, res in out)
    assert engine.stats.requests == 10 and engine.stats.generated_tokens == 30
    assert len(stub.bodies) == 10 and all(b["model"] == STUB_MODEL and b["max_tokens"] == 9 for b in stub.bodies)


def test_requests_in_flight_never_exceed_max_concurrency_and_reach_it():
    state = {"now": 0, "peak": 0}
    lock = threading.Lock()

    async def slow(body, n):
        import asyncio

        with lock:
            state["now"] += 1
            state["peak"] = max(state["peak"], state["now"])
        await asyncio.sleep(0.05)
        with lock:
            state["now"] -= 1
        return stub_completion()

    with StubChatServer(reply=slow) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency=5)
        assert len(list(engine.generate(image_requests(30)))) == 30
    assert state["peak"] == 5 and engine.stats.in_flight_peak == 5


@pytest.mark.parametrize("ahead_bytes, most_handed_over", [(1 << 30, 5 * (1 + oe.AHEAD)), (1, 5)])
def test_requests_wait_in_the_client_up_to_ahead_times_the_concurrency_and_ahead_bytes(monkeypatch, ahead_bytes,
                                                                                        most_handed_over):
    """Beyond the concurrency, requests wait in the client process only while their bodies stay under AHEAD_BYTES
    (a pool of large images would otherwise hold AHEAD x the concurrency of base64 bodies)."""
    monkeypatch.setattr(oe, "AHEAD_BYTES", ahead_bytes)
    handed: list[int] = []  # requests handed over and not yet answered, after each hand-over

    class SlowClient:  # answers the oldest request handed over, one per receive
        def __init__(self, open_client, call):
            self.jobs: list = []
            self.running = self.peak = 0

        def send(self, limit, jobs):
            self.jobs.extend(jobs)
            handed.append(len(self.jobs))

        def receive(self):
            job_id, (_, _, sample_key) = self.jobs.pop(0)
            return [(job_id, oe._result_fields(GenerationResult("2", 1, 1, False, sample_key)))], []

        def close(self):
            pass

    monkeypatch.setattr(oe, "ClientProcess", SlowClient)
    engine = OpenAIEngine("http://127.0.0.1:1/v1", STUB_MODEL, max_concurrency=5)
    assert len(list(engine.generate(image_requests(60)))) == 60
    assert max(handed) == most_handed_over, handed


def test_5xx_and_429_are_retried_honouring_retry_after(quick_backoff):
    def flaky(body, n):
        if n == 0:
            return 503, {"error": {"message": "loading"}}, {}
        if n == 1:
            return 429, {"error": {"message": "slow down"}}, {"Retry-After": "0.3"}
        return stub_completion()

    with StubChatServer(reply=flaky) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_retries=3)
        start = time.perf_counter()
        ((_, result),) = list(engine.generate(image_requests(1)))
    assert result.text == "stub answer" and engine.stats.retries == 2
    assert time.perf_counter() - start >= 0.3  # waited as long as the server asked


def test_a_400_is_a_refusal_with_the_servers_message_and_the_others_are_answered():
    def refuse_the_long_one(body, n):
        text = body["messages"][0]["content"][-1]["text"]
        if "Be brief. Be brief. Be brief." in text:
            return 400, {"error": {"message": "prompt is longer than the context (4096 tokens)"}}, {}
        return stub_completion()

    with StubChatServer(reply=refuse_the_long_one) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL)
        out = {r.key: res for r, res in engine.generate(image_requests(8))}
    refused = {k: res.refused for k, res in out.items() if res.refused}
    assert len(out) == 8 and len(refused) == 2 and engine.stats.refused == 2
    assert all(m == "HTTP 400: prompt is longer than the context (4096 tokens)" for m in refused.values())
    assert all(out[k].text == "" for k in refused)


def test_a_server_that_refuses_everything_is_one_error_not_a_dataset_of_drops():
    with StubChatServer(reply=lambda body, n: (400, {"detail": "unknown field seed"}, {})) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL)
        with pytest.raises(EngineUnavailable, match="refused the first 16 requests.*unknown field seed"):
            list(engine.generate(image_requests(40)))


def test_a_server_gone_is_retried_then_one_line_and_earlier_results_are_kept(quick_backoff):
    stub = StubChatServer().start()
    engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency=1, max_retries=2)
    results = engine.generate(image_requests(5))
    got = [next(results), next(results)]
    stub.stop()
    with pytest.raises(EngineUnavailable) as info:
        list(results)
    message = str(info.value)
    assert stub.base_url in message and "failed 3 times" in message and "rerun the same command" in message
    assert "\n" not in message and len(got) == 2 and engine.stats.retries >= 2


def test_the_api_key_goes_in_the_header_only(monkeypatch):
    monkeypatch.setenv("RSGEN_TEST_KEY", "sk-secret-123")
    with StubChatServer() as stub:
        spec = engine_spec(RecipeConfig(engine="openai", model_name_or_path=STUB_MODEL, engine_base_url=[stub.base_url],
                                        engine_api_key_env="RSGEN_TEST_KEY"), "generate")
        engine = OpenAIEngine.from_spec(spec)
        list(engine.generate(image_requests(2)))
    assert {r["authorization"] for r in stub.received} == {"Bearer sk-secret-123"}
    assert "sk-secret" not in repr(engine) and "sk-secret" not in json.dumps(stub.bodies)
    monkeypatch.delenv("RSGEN_TEST_KEY")
    with pytest.raises(RecipeError, match="'RSGEN_TEST_KEY', which is not set"):
        OpenAIEngine.from_spec(spec)


# ---------------------------------------------------------------------- pre-flight


def test_preflight_names_the_url_and_the_models_it_serves():
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(RecipeError, match=f"engine server {url} is unreachable"):
        check_servers([url], "m", None, timeout_seconds=5)
    with StubChatServer(models=("org/a", "org/b")) as stub:
        with pytest.raises(RecipeError, match="does not serve model 'org/c'; it serves 'org/a', 'org/b'"):
            check_servers([stub.base_url], "org/c", None)
        assert check_servers([stub.base_url], "org/a", None) == ""
    with StubChatServer(owned_by="vllm") as stub:
        assert check_servers([stub.base_url], STUB_MODEL, None) == "vllm"  # requests then pin vLLM's extra fields
    with StubChatServer(owned_by="local", model_fields={"status": {"value": "loaded"}}) as stub:
        assert check_servers([stub.base_url], STUB_MODEL, None) == "transformers"  # how transformers serve lists


def test_engine_keys_are_checked_when_the_recipe_loads():
    base = {"model_name_or_path": "m", "engine": "openai"}
    with pytest.raises(RecipeError, match="engine_server must be one of vllm, sglang, transformers"):
        recipe_from_dict({**base, "engine_server": "tgi"})
    with pytest.raises(RecipeError, match="not an http"):
        recipe_from_dict({**base, "engine_base_url": "127.0.0.1:8000"})
    with pytest.raises(RecipeError, match="NAME of an environment variable"):
        recipe_from_dict({**base, "engine_api_key_env": "sk-abc-123"})
    with pytest.raises(RecipeError, match="set engine: openai"):
        recipe_from_dict({"model_name_or_path": "m", "engine_server": "vllm"})
    recipe = recipe_from_dict({**base, "engine_base_url": "http://h:1/v1"})
    assert recipe.engine_base_url == ["http://h:1/v1"]  # one URL or a list
    judge = engine_spec(recipe, "judge")
    assert judge.base_urls == ("http://h:1/v1",) and judge.served_model == "m"  # the judge's URL defaults to it
