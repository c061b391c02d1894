"""The `openai` engine against a hostile server: a SCRIPTED stub (rsgen.testing.stub_server) that answers 200s of
the wrong types, fails one request every time, cuts responses at the token limit, echoes the API key, answers
`content: null`, or sends reasoning in the other field. Each case runs through the real client, and the stage
cases through the real generate stage on a real prepared demo pool (the stub stands in for the model only: what
is checked is what the client and the stage do with the answers)."""

from __future__ import annotations

import dataclasses
import json
import logging

import pyarrow.parquet as pq
import pytest
from engine_helpers import image_requests

from rsgen.config import RecipeError, recipe_from_dict
from rsgen.emit.card_tables import tokens_table
from rsgen.emit.stage import run_emit
from rsgen.emit.stats import server_requests
from rsgen.engine import EngineUnavailable, GenerationResult
from rsgen.engine import openai_engine as oe
from rsgen.engine.openai_engine import OpenAIEngine, check_servers, parse_completion, scrub
from rsgen.generate.stage import run_generate
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.records import GenerateRecord, read_records
from rsgen.store import CheckpointStore
from rsgen.testing.stub_server import STUB_MODEL, StubChatServer, stub_completion
from rsgen.verify.stage import run_verify

KEY = "sk-live-abcdef0123456789"


@pytest.fixture
def quick_backoff(monkeypatch):
    monkeypatch.setattr(oe, "BACKOFF_BASE_SECONDS", 0.001)


def _question(body: dict) -> str:
    content = body["messages"][0]["content"]
    return content if isinstance(content, str) else next(p["text"] for p in content if p["type"] == "text")


# ---------------------------------------------------------------------- A: wrong-typed 200s


@pytest.mark.parametrize("bad", [
    {"choices": [{"message": "4", "finish_reason": "stop"}]},  # message a string
    {"choices": [{"message": {"content": {"text": "4"}}, "finish_reason": "stop"}]},  # content an object
    {**stub_completion("4"), "usage": {"prompt_tokens": {"n": 3}, "completion_tokens": 1}},  # a count an object
    {"choices": [{"message": {"content": "4"}, "finish_reason": 7}]},  # finish_reason a number
    {"choices": "none"},
    ["not", "an", "object"],
])
def test_a_wrong_typed_200_is_malformed_not_a_crash(bad):
    with pytest.raises(oe.MalformedResponse):
        parse_completion(bad, None)


def test_content_as_a_list_of_text_parts_is_read_as_text():
    data = stub_completion()
    data["choices"][0]["message"]["content"] = [{"type": "text", "text": "The answer "}, {"type": "text", "text": "is 4"}]
    assert parse_completion(data, None).text == "The answer is 4"


def test_a_wrong_typed_first_try_is_retried_and_answered(quick_backoff):
    tries: dict[str, int] = {}

    def reply(body, n):
        q = json.dumps(body["messages"])
        tries[q] = tries.get(q, 0) + 1
        return {"choices": [{"message": "4"}]} if tries[q] == 1 else stub_completion("4")

    with StubChatServer(reply=reply) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_retries=2)
        out = [result for _, result in engine.generate(image_requests(6))]
    assert [r.text for r in out] == ["4"] * 6 and not any(r.failed for r in out)
    assert engine.stats.retries_by_cause == {"malformed": 6}


def test_bytes_that_are_not_text_are_retried_whether_a_200_or_an_error(quick_backoff):
    tries: dict[str, int] = {}

    def reply(body, n):
        q = json.dumps(body["messages"])
        tries[q] = tries.get(q, 0) + 1
        if tries[q] == 1:
            return 200, b'{"choices": [{"message": {"content": "\xff\xfe"}}]}', {"Content-Type": "application/json"}
        if tries[q] == 2:
            return 503, b"overloaded \xff\xfe", {}
        return stub_completion("4")

    with StubChatServer(reply=reply) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_retries=2)
        out = [result for _, result in engine.generate(image_requests(6))]
    assert [r.text for r in out] == ["4"] * 6 and not any(r.failed for r in out)
    assert engine.stats.retries_by_cause == {"malformed": 6, "5xx": 6}


def test_always_wrong_typed_is_a_failure_of_that_request_naming_the_problem(quick_backoff):
    def reply(body, n):
        if "Be brief" in _question(body):  # three requests in four
            return {**stub_completion("4"), "usage": {"prompt_tokens": {"n": 1}}}
        return stub_completion("4")

    with StubChatServer(reply=reply) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_retries=2)
        out = {request.key: result for request, result in engine.generate(image_requests(6))}
    failed = {k: r.failed for k, r in out.items() if r.failed}
    assert failed and len(failed) < 6
    assert all("3 tries failed" in m and "usage.prompt_tokens is not a token count" in m for m in failed.values())
    assert all(r.drop_reason == "request_failed" for k, r in out.items() if k in failed)
    assert engine.stats.failed == len(failed)


# ---------------------------------------------------------------------- B: one request failing every retry


def _recipe(tmp_path, base_url, **keys):
    raw = {"model_name_or_path": STUB_MODEL, "engine": "openai", "engine_base_url": [base_url],
           "output_dir": str(tmp_path / "out"), "judge": False, "prepare_num_proc": 1, "engine_max_retries": 2,
           "max_new_tokens": 32,
           "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 4, "demo_seed": 1, "family_column": "family",
                        "options_column": "options", "source_id_column": "source_id"}]}
    raw.update(keys)
    return recipe_from_dict(raw)


def _records(recipe) -> dict[str, GenerateRecord]:
    return {r.key: r for r in read_records(CheckpointStore(OutputLayout(recipe.output_dir).generate_work),
                                           GenerateRecord)}


def test_a_request_failing_every_retry_is_a_recorded_drop_and_the_rerun_asks_it_again(tmp_path, quick_backoff):
    poisoned: list[str] = []

    def reply(body, n):
        question = _question(body)
        if not poisoned:
            poisoned.append(question)
        if question == poisoned[0]:
            return 500, {"error": {"message": f"worker crashed on this prompt (Authorization: Bearer {KEY})"}}, {}
        return stub_completion("4")

    with StubChatServer(reply=reply) as stub:
        recipe = _recipe(tmp_path, stub.base_url)
        run_prepare(recipe)
        summary = run_generate(recipe)  # finishes: one bad request is not a gone server
        asked_first = len(stub.received)
    records = _records(recipe)
    assert summary.done_now == summary.total == len(records)
    failed = [r for r in records.values() if r.reason == "request_failed"]
    assert len(failed) == 1 and failed[0].question == poisoned[0] and not failed[0].match
    assert "3 tries failed" in failed[0].failed and "worker crashed on this prompt" in failed[0].failed
    assert KEY not in failed[0].failed and "Bearer ***" in failed[0].failed
    counts = server_requests(recipe.output_dir)["generate"]
    assert counts["failed"] == 1 and counts["retries"] == {"5xx": 2} and asked_first == len(records) + 2

    # Emitted now, the failed pair is a counted rejection with its own reason, in no training or DPO view.
    run_verify(recipe)
    run_emit(recipe)
    stats = json.loads(OutputLayout(recipe.output_dir).stats_json.read_text())
    family = stats["families"][failed[0].family]
    assert family["rejected_reasons"]["request_failed"] == 1
    dataset = OutputLayout(recipe.output_dir).dataset / "data"
    needle = json.dumps(poisoned[0])[1:-1]  # the question as it reads in JSON
    rejected_text = ""
    for config in dataset.iterdir():
        text = "".join(json.dumps(row, default=str) for shard in config.glob("*.parquet")
                       for row in pq.read_table(shard).drop_columns(
                           [c for c in pq.read_table(shard).column_names if c in ("image", "images")]).to_pylist())
        if config.name.endswith(("_sft", "_dpo", "_RS_think", "_RS_nothink")):
            assert needle not in text, config.name
        if config.name.endswith("_rejected"):
            rejected_text += text
    assert needle in rejected_text and '"reason": "request_failed"' in rejected_text

    with StubChatServer(reply=lambda body, n: stub_completion("4"), port=stub.port) as again:
        run_generate(recipe)
        assert [_question(b) for b in again.bodies] == poisoned  # only the failed request is asked again
    records = _records(recipe)
    assert not any(r.failed for r in records.values()) and records[failed[0].key].response == "4"


def test_the_run_stops_when_the_server_fails_requests_in_a_row(tmp_path, quick_backoff):
    with StubChatServer(reply=lambda body, n: (503, "overloaded", {})) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_retries=1, max_concurrency=2)
        with pytest.raises(EngineUnavailable, match=f"failed {oe.FAILED_IN_A_ROW} requests in a row") as info:
            list(engine.generate(image_requests(40)))
    assert "\n" not in str(info.value) and "HTTP 503: overloaded" in str(info.value)
    assert len(image_requests(40)) > oe.FAILED_IN_A_ROW


# ---------------------------------------------------------------------- C: the token limit


def test_a_response_cut_at_the_token_limit_is_never_accepted_and_says_why(tmp_path):
    with StubChatServer(reply=lambda body, n: stub_completion("The answer is 2", finish_reason="length")) as stub:
        recipe = _recipe(tmp_path, stub.base_url)
        run_prepare(recipe)
        run_generate(recipe)
    records = _records(recipe).values()
    assert records and all(not r.match and r.reason == "hit_token_limit" and r.hit_limit for r in records)
    # Re-verification (a verifier change) keeps it a drop: no verifier accepts a cut response.
    run_verify(dataclasses.replace(recipe, verifier="exact"))
    decisions = [json.loads(line) for p in CheckpointStore(OutputLayout(recipe.output_dir).verify_work).parts()
                 for line in p.read_text().splitlines()]
    assert decisions and all(d["reason"] == "hit_token_limit" for d in decisions)


def test_any_engines_result_without_eos_is_a_drop():
    # The transformers engine sets hit_limit when no EOS came within max_new_tokens; the stages read drop_reason.
    assert GenerationResult("The answer is 2", 3, 12, hit_limit=True).drop_reason == "hit_token_limit"
    assert GenerationResult("The answer is 2", 3, 5, hit_limit=False).drop_reason is None


# ---------------------------------------------------------------------- D: the key is scrubbed


def test_scrub_removes_the_key_and_any_bearer_token():
    assert scrub(f"bad header Authorization: Bearer {KEY}, and {KEY} again", KEY) == \
        "bad header Authorization: Bearer ***, and *** again"
    assert scrub("'Authorization': 'Bearer other-token-xyz'", None) == "'Authorization': 'Bearer ***'"


def test_a_key_the_server_echoes_is_never_raised_logged_or_stored(caplog):
    def reply(body, n):
        return 400, {"error": {"message": f"refused; you sent Authorization: Bearer {KEY}"}}, {}

    with StubChatServer(reply=reply) as stub, caplog.at_level(logging.INFO):
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, api_key=KEY)
        out = [result for _, result in engine.generate(image_requests(3))]
    assert all(r.refused and "Bearer ***" in r.refused and KEY not in r.refused for r in out)
    assert KEY not in caplog.text and "refused" in caplog.text

    def models_401(headers):
        return 401, {"error": {"message": f"bad key: {headers['Authorization']}"}}, {}

    stub = StubChatServer(models_reply=models_401)
    with stub, pytest.raises(RecipeError) as info:
        check_servers([stub.base_url], STUB_MODEL, KEY)
    assert "HTTP 401" in str(info.value) and KEY not in str(info.value) and "Bearer ***" in str(info.value)


# ---------------------------------------------------------------------- E, G: content null, reasoning fields


def test_content_null_has_its_own_reason_and_a_warning_with_the_count(tmp_path, caplog):
    def reply(body, n):
        data = stub_completion()
        data["choices"][0]["message"]["content"] = None
        return data

    with StubChatServer(reply=reply) as stub, caplog.at_level(logging.WARNING):
        recipe = _recipe(tmp_path, stub.base_url)
        run_prepare(recipe)
        run_generate(recipe)
    records = _records(recipe).values()
    assert records and all(r.reason == "no_content" and not r.match for r in records)
    assert f"answered {len(records)} request(s) with `content: null`" in caplog.text
    assert server_requests(recipe.output_dir)["generate"]["no_content"] == len(records)


def test_empty_reasoning_content_falls_back_to_reasoning():
    data = stub_completion("4")
    data["choices"][0]["message"].update({"reasoning_content": "", "reasoning": "two and two"})
    assert parse_completion(data, None).text == "<think>two and two</think>4"
    data["choices"][0]["message"].update({"reasoning_content": None})
    assert parse_completion(data, None).text == "<think>two and two</think>4"


# ---------------------------------------------------------------------- F: retries logged and reported


def test_retries_are_logged_by_cause_and_reported_per_stage(tmp_path, quick_backoff, monkeypatch, caplog):
    monkeypatch.setattr(oe, "RETRY_LOG_SECONDS", 0.0)  # a line per retry here; a line a minute in a real run
    seen: set[str] = set()

    def reply(body, n):
        q = _question(body)
        if q not in seen:
            seen.add(q)
            return (429, "slow down", {"Retry-After": "0"}) if len(seen) % 2 else (502, "bad gateway", {})
        return stub_completion("4")

    with StubChatServer(reply=reply) as stub, caplog.at_level(logging.WARNING):
        recipe = _recipe(tmp_path, stub.base_url)
        run_prepare(recipe)
        run_generate(recipe)
    retry_lines = [r.getMessage() for r in caplog.records if "retries in the last" in r.getMessage()]
    assert retry_lines and all("429" in line or "5xx" in line for line in retry_lines)
    counts = server_requests(recipe.output_dir)["generate"]
    n = len(_records(recipe))
    assert sum(counts["retries"].values()) == n and set(counts["retries"]) == {"429", "5xx"}
    card = tokens_table({"families": {}, "generation": {"enable_thinking": False},
                         "server_requests": {"generate": counts}})
    assert f"Requests to the server by stage: generate {n} (retries {n}" in card and "429" in card and "5xx" in card
