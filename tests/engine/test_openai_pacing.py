"""How hard the `openai` engine pushes a server: `engine_max_concurrency: auto` (additive increase while throughput
grows, halved on a 429 or a timeout) and `engine_requests_per_minute` / `engine_tokens_per_minute`, against
SCRIPTED stubs standing in for a server of fixed capacity and for a rate-limited hosted API
(rsgen.testing.stub_server). The side-by-side figures at larger sizes: bench/bench_server.py --pacing."""

from __future__ import annotations

import contextlib

import pytest
from engine_helpers import image_requests

from rsgen.config import RecipeError, recipe_from_dict
from rsgen.engine import EngineUnavailable
from rsgen.engine import openai_engine as oe
from rsgen.engine.openai_engine import AdaptiveConcurrency, OpenAIEngine
from rsgen.testing.stub_server import STUB_MODEL, CapacityReply, RateLimitedReply, StubChatServer


def _drive(control: AdaptiveConcurrency, knee: int, windows: int) -> list[int]:
    """Feed the controller windows of answers whose rate grows with the limit up to `knee`, flat beyond."""
    now = 0.0
    limits = []
    for _ in range(windows):
        size = max(control.limit, control.MIN_WINDOW)
        rate = 10.0 * min(control.limit, knee)
        for _ in range(size):
            now += 1.0 / rate
            control.answered(now)
        limits.append(control.limit)
    return limits


def test_auto_grows_while_throughput_grows_and_holds_near_the_knee():
    limits = _drive(AdaptiveConcurrency(), knee=40, windows=40)
    assert limits[5] > limits[1] > AdaptiveConcurrency.START  # it grew while answers/s grew
    settled = limits[10:]
    assert min(settled) >= 40 and max(settled) <= 40 + 2 * AdaptiveConcurrency.STEP  # at the knee, probing above


def test_a_429_or_a_timeout_halves_the_limit_once_per_window():
    control = AdaptiveConcurrency(start=64)
    control.pushed_back = True
    control.answered(0.0)
    control.pushed_back = True  # a burst of 429s in the same window is one signal
    control.answered(0.001)
    assert control.limit == 32


def test_auto_reaches_a_fixed_capacity_stub_without_a_429_storm(monkeypatch):
    monkeypatch.setattr(oe, "BACKOFF_BASE_SECONDS", 0.01)
    server = CapacityReply(capacity=16, seconds=0.01, queue=8)
    with StubChatServer(reply=server) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency="auto")
        out = list(engine.generate(image_requests(240)))
    assert len(out) == 240 and not any(r.failed for _, r in out)
    assert engine.stats.in_flight_peak >= 16  # it went up to the server's capacity
    # and not far beyond it: each probe one step above the knee (8) costs the 8 requests past the queue one 429
    # each, then the limit halves; in 240 answers the controller probes once or twice (8 or 16 429s measured on an
    # idle machine), three times at the most
    assert server.rejected <= 3 * AdaptiveConcurrency.STEP

    fixed = CapacityReply(capacity=16, seconds=0.01, queue=8)
    with StubChatServer(reply=fixed) as stub:  # the same server flooded by a fixed limit far above its knee
        list(OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency=64).generate(image_requests(240)))
    assert fixed.rejected > 1.5 * server.rejected  # the storm `auto` avoids (45-56 measured against 8)


def test_requests_per_minute_spaces_requests_and_a_rate_limited_api_sends_no_429():
    api = RateLimitedReply(per_minute=2400, window_seconds=0.5)  # 20 requests per half second
    with StubChatServer(reply=api) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency=64, requests_per_minute=2400)
        out = list(engine.generate(image_requests(30)))
    assert len(out) == 30 and api.rejected == 0 and engine.stats.retries == 0

    unpaced = RateLimitedReply(per_minute=2400, window_seconds=0.5)
    with StubChatServer(reply=unpaced) as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_concurrency=64, max_retries=0)
        with contextlib.suppress(EngineUnavailable):  # 8 requests refused in a row stop it: what a storm does
            list(engine.generate(image_requests(30)))
    assert unpaced.rejected > 0  # the same requests without the limit: the API pushes back (the test can fail)


def test_requests_per_minute_never_bursts_after_a_late_request():
    """The pacer on a clock the test moves: requests asked for one after another, some of them late (the loop or the
    machine busy for several intervals). In no sliding window of a second may more leave than the limit allows
    (20): a schedule that catches up after a late request (the slots it missed sent at once) fails this."""
    now = [100.0]
    pacer = oe.RatePacer(1200, None, clock=lambda: now[0])
    sent = []
    for i in range(400):
        if i % 37 == 5:
            now[0] += 0.4  # late: eight intervals' worth
        while (delay := pacer.delay()) > 0:
            now[0] += delay
        sent.append(now[0])
        now[0] += 0.001  # the request's own work before the next one asks
    for i, t in enumerate(sent):
        in_window = sum(1 for u in sent[i:i + 40] if u - t < 1.0)
        assert in_window <= 20, f"{in_window} requests left within a second from request {i}"
    gaps = [b - a for a, b in zip(sent, sent[1:])]
    assert min(gaps) >= 60.0 / 1200 - 1e-9  # never closer than the limit's spacing
    assert max(gaps) < 0.6  # and paced, not stalled


def test_tokens_per_minute_waits_once_the_budget_is_spent():
    # stub_completion reports 11 + 3 = 14 tokens: a budget of 14 * 60 * 4 a minute is 4 answers a second.
    with StubChatServer() as stub:
        engine = OpenAIEngine(stub.base_url, STUB_MODEL, tokens_per_minute=14 * 60 * 4)
        import time

        start = time.perf_counter()
        list(engine.generate(image_requests(10)))
        seconds = time.perf_counter() - start
    # The bucket starts full (a minute's budget): 10 answers fit in it, none waits.
    assert seconds < 1.0
    pacer = oe.RatePacer(None, 14 * 60 * 4)
    pacer.spent(14 * 60 * 4 + 14)  # over budget by one answer
    assert pacer.tokens < 0


def test_pacing_keys_are_checked_when_the_recipe_loads():
    base = {"engine": "openai", "model_name_or_path": "m"}
    assert recipe_from_dict({**base, "engine_max_concurrency": "auto"}).engine_max_concurrency == "auto"
    with pytest.raises(RecipeError, match="integer >= 1 or auto, got 'many'"):
        recipe_from_dict({**base, "engine_max_concurrency": "many"})
    with pytest.raises(RecipeError, match="engine_requests_per_minute must be a number > 0"):
        recipe_from_dict({**base, "engine_requests_per_minute": 0})
