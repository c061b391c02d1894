"""A STUB OpenAI-compatible chat server that answers at once, without a model — for the tests of the `openai`
engine's client side (request building, response parsing, retries, refusals) and for `bench/bench_server.py`,
which measures the client alone against it. It never stands in for a real server where results matter: the
engine's end-to-end tests run a real `transformers serve`.

    with StubChatServer() as stub:                      # in a thread of this process
        engine = OpenAIEngine(stub.base_url, "stub-model")
        ...
        stub.bodies                                     # every request body received, in arrival order

    python -m rsgen.testing.stub_server --port 8123     # in a process of its own (the benchmarks)
    python -m rsgen.testing.stub_server --port 8123 --content 2 --reasoning 'count'   # another fixed answer

`reply(body, n)` decides each answer (n = how many chat requests came before this one): return a dict (200 with
that JSON) or `(status, json_or_text, headers)`. The default reply is `stub_completion`. `models_reply(headers)`
may answer GET /v1/models instead of the model list (a `(status, json_or_text, headers)`; None: the list).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
from collections.abc import Callable
from typing import Any

from aiohttp import web

STUB_MODEL = "stub-model"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stub_completion(content: str = "stub answer", reasoning: str | None = None, finish_reason: str = "stop",
                    prompt_tokens: int = 11, completion_tokens: int = 3, model: str = STUB_MODEL) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return {
        "id": "stub", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


class CapacityReply:
    """A reply for a server of fixed capacity: `capacity` requests worked on at once, each for `seconds`; up to
    `queue` more wait their turn; beyond that, 429 (Retry-After 1), as a serving engine with a bounded waiting
    queue or a hosted API answers. Its best throughput is capacity / seconds requests/s."""

    def __init__(self, capacity: int, seconds: float, queue: int):
        self.capacity, self.seconds, self.queue = capacity, seconds, queue
        self.waiting = 0
        self.rejected = 0
        self._semaphore: asyncio.Semaphore | None = None

    async def __call__(self, body: dict, n: int):
        if self._semaphore is None:
            self._semaphore = asyncio.Semaphore(self.capacity)
        if self.waiting >= self.capacity + self.queue:
            self.rejected += 1
            return 429, {"error": {"message": "server busy"}}, {"Retry-After": "1"}
        self.waiting += 1
        try:
            async with self._semaphore:
                await asyncio.sleep(self.seconds)
        finally:
            self.waiting -= 1
        return stub_completion()


class RateLimitedReply:
    """A reply for a hosted API's rate limit: at most `per_minute` requests in any sliding minute (scaled: the
    window is `window_seconds`, the limit per_minute * window_seconds / 60); beyond it, 429 with Retry-After."""

    def __init__(self, per_minute: float, window_seconds: float = 60.0):
        self.limit = max(1, int(per_minute * window_seconds / 60.0))
        self.window = window_seconds
        self.times: list[float] = []
        self.rejected = 0

    def __call__(self, body: dict, n: int):
        import time

        now = time.monotonic()
        self.times = [t for t in self.times if now - t < self.window]
        if len(self.times) >= self.limit:
            self.rejected += 1
            return 429, {"error": {"message": "rate limit reached"}}, {"Retry-After": f"{self.window:.3f}"}
        self.times.append(now)
        return stub_completion()


def _default_reply(body: dict, n: int) -> dict:
    return stub_completion()


def _response(answer) -> web.Response:
    if isinstance(answer, dict):
        return web.json_response(answer)
    status, payload, headers = answer
    if isinstance(payload, (dict, list)):
        return web.json_response(payload, status=status, headers=headers)
    if isinstance(payload, bytes):  # sent as they are: bytes that are no text at all
        return web.Response(status=status, body=payload, headers=headers)
    return web.Response(status=status, text=str(payload), headers=headers)


def build_app(reply: Callable[[dict, int], Any] = _default_reply, models=(STUB_MODEL,), owned_by: str = "stub",
              record: list | None = None, model_fields: dict | None = None,
              models_reply: Callable[[dict], Any] | None = None) -> web.Application:
    counter = {"n": 0}

    async def chat(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if record is not None:
            record.append({"body": body, "authorization": request.headers.get("Authorization")})
        n = counter["n"]
        counter["n"] += 1
        answer = reply(body, n)
        if asyncio.iscoroutine(answer):
            answer = await answer
        return _response(answer)

    async def list_models(request: web.Request) -> web.Response:
        answer = models_reply(dict(request.headers)) if models_reply else None
        if answer is not None:
            return _response(answer)
        return web.json_response({"object": "list", "data": [
            {"id": m, "object": "model", "owned_by": owned_by, **(model_fields or {})} for m in models]})

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application(client_max_size=64 * 1024**2)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    return app


class StubChatServer:
    """The stub on 127.0.0.1 (a free port), served by an event loop in a daemon thread of this process."""

    def __init__(self, reply: Callable[[dict, int], Any] = _default_reply, models=(STUB_MODEL,),
                 owned_by: str = "stub", port: int | None = None, model_fields: dict | None = None,
                 models_reply: Callable[[dict], Any] | None = None):
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self.received: list[dict] = []
        self._app = build_app(reply, models, owned_by, self.received, model_fields, models_reply)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="stub-server", daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def bodies(self) -> list[dict]:
        return [r["body"] for r in self.received]

    def start(self) -> StubChatServer:
        self._thread.start()

        async def up():
            self._runner = web.AppRunner(self._app, access_log=None)
            await self._runner.setup()
            await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

        asyncio.run_coroutine_threadsafe(up(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
            self._runner = None
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def __enter__(self) -> StubChatServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description="a stub OpenAI-compatible chat server that answers at once")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-name", default=STUB_MODEL, help="the model name it lists and answers for")
    parser.add_argument("--content", default="stub answer", help="the answer every request gets")
    parser.add_argument("--reasoning", default=None, help="reasoning returned apart (reasoning_content)")
    args = parser.parse_args()
    completion = stub_completion(args.content, args.reasoning)
    web.run_app(build_app(lambda body, n: completion, models=(args.served_name,)), host="127.0.0.1", port=args.port,
                access_log=None, print=None)


if __name__ == "__main__":
    main()
