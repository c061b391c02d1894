"""The `openai` engine's client: its own overhead, and the concurrency it reaches against a real server.

    python bench/bench_server.py                   # client vs a STUB server: requests/s, rsgen's client and the SDK's
    python bench/bench_server.py --real            # and against a real `transformers serve` of a tiny zoo LLaVA

Part 1 measures the CLIENT ONLY. The server is a stub (rsgen.testing.stub_server, in a process of its own) that
answers every chat request at once with a fixed completion and never looks at a model: whatever limits the
requests/s here is the client. Requests are the demo pool's (one ~1 KB PNG as a data URI + the question), 64 in
flight. Two clients run side by side on the same requests: rsgen's `OpenAIEngine` (aiohttp on an event loop in a
forked process of its own, fed bodies built in this one) and the `openai` SDK's `AsyncOpenAI` (when installed)
with the same concurrency. Target on the 2-core CPU machine: rsgen's client >= 1,000 requests/s, so that it never limits a vLLM server (~10-50
requests/s per GPU for a 7B VLM).

Part 2 (`--real`) runs `transformers serve` on CPU with a tiny zoo LLaVA and sends the same requests with 1 and
then 16 in flight: printed are requests/s at each, the requests the client kept in flight (peak and mean), and the
concurrency the server reached = throughput at 16 in flight / throughput at 1 (about 1 for `transformers serve`,
which answers VLM requests one at a time; a continuous-batching server such as vLLM goes far higher).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

INSTRUCTION = "Answer in short without any other content."
TARGET_REQUESTS_PER_SECOND = 1000


def demo_requests(n: int):
    from rsgen.demo.pool import make_demo_rows
    from rsgen.engine import ChatRequest
    from rsgen.schema import user_turn

    rows = list(make_demo_rows(max(1, n // 8), 20261203))
    return [ChatRequest(f"{i:06d}", user_turn(f"{row['question']}\n{INSTRUCTION}"), [row["image"]])
            for i, row in zip(range(n), (rows * (n // len(rows) + 1))[:n])]


def start(cmd: list[str], root: str, log: Path) -> subprocess.Popen:
    from rsgen.engine.server import wait_until_healthy

    with open(log, "ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until_healthy(root, process, lambda: log.read_text()[-2000:], timeout=300)
    return process


def stop(process: subprocess.Popen) -> None:
    import signal

    os.killpg(process.pid, signal.SIGTERM)
    process.wait(timeout=60)


def run_rsgen_client(base_url: str, model: str, requests, concurrency: int, max_new_tokens: int = 16):
    from rsgen.engine.openai_engine import OpenAIEngine

    engine = OpenAIEngine(base_url, model, max_new_tokens=max_new_tokens, max_concurrency=concurrency)
    start_time = time.perf_counter()
    n = sum(1 for _ in engine.generate(requests))
    seconds = time.perf_counter() - start_time
    return n / seconds, engine


def run_sdk_client(base_url: str, model: str, requests, concurrency: int) -> float | None:
    """The `openai` SDK's AsyncOpenAI with the same messages and concurrency (None when it is not installed)."""
    try:
        from openai import AsyncOpenAI
    except ImportError:
        return None
    from rsgen.engine.openai_engine import openai_messages

    async def main() -> int:
        client = AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        semaphore = asyncio.Semaphore(concurrency)

        async def one(request):
            async with semaphore:
                reply = await client.chat.completions.create(model=model, messages=openai_messages(request),
                                                             max_tokens=16, temperature=0.0)
                return reply.choices[0].message.content

        results = await asyncio.gather(*(one(r) for r in requests))
        await client.close()
        return len(results)

    start_time = time.perf_counter()
    n = asyncio.run(main())
    return n / (time.perf_counter() - start_time)


def run_minimal_client(base_url: str, bodies: list[bytes], concurrency: int) -> float:
    """The floor: a minimal aiohttp client posting the SAME request bodies (built beforehand, not timed), a
    semaphore for the concurrency, the JSON of each answer parsed and nothing else done with it."""
    import json

    import aiohttp

    async def main() -> int:
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            semaphore = asyncio.Semaphore(concurrency)

            async def one(body: bytes):
                async with semaphore:
                    async with session.post(base_url + "/chat/completions", data=body,
                                            headers={"Content-Type": "application/json"}) as resp:
                        return json.loads(await resp.text())["choices"][0]["message"]["content"]

            return len(await asyncio.gather(*(one(b) for b in bodies)))

    start_time = time.perf_counter()
    n = asyncio.run(main())
    return n / (time.perf_counter() - start_time)


def client_part(num_requests: int, concurrency: int, workdir: Path) -> None:
    from rsgen.testing.stub_server import STUB_MODEL, free_port

    port = free_port()
    stub = start([sys.executable, "-m", "rsgen.testing.stub_server", "--port", str(port)], f"http://127.0.0.1:{port}",
                 workdir / "stub.log")
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        requests = demo_requests(num_requests)
        run_rsgen_client(base_url, STUB_MODEL, requests[:200], concurrency)  # warm-up (imports, connections)
        from rsgen.engine.openai_engine import OpenAIEngine

        bodies = [body for r in requests for _, body in OpenAIEngine(base_url, STUB_MODEL, max_new_tokens=16).bodies(r)]
        minimal = []
        rsgen_runs = []
        for _ in range(3):  # interleaved, best of three each: the machine is shared
            minimal.append(run_minimal_client(base_url, bodies, concurrency))
            rsgen_runs.append(run_rsgen_client(base_url, STUB_MODEL, requests, concurrency))
        minimal_rps = max(minimal)
        rsgen_rps, engine = max(rsgen_runs, key=lambda run: run[0])
        sdk_rps = run_sdk_client(base_url, STUB_MODEL, requests, concurrency)
    finally:
        stop(stub)
    size = sum(len(r.images[0]) for r in requests) / len(requests)
    print(f"== client only, against a STUB server that answers at once ({num_requests} demo requests, ~{size:,.0f}-byte "
          f"PNG each as a data URI, {concurrency} in flight)")
    print(f"minimal aiohttp client:       {minimal_rps:8,.0f} requests/s   (the same bodies, built beforehand)")
    print(f"rsgen OpenAIEngine (aiohttp): {rsgen_rps:8,.0f} requests/s   (peak in flight {engine.stats.in_flight_peak}; "
          f"{rsgen_rps / minimal_rps:.0%} of the minimal client, bodies built while it runs)")
    if sdk_rps is None:
        print("openai SDK AsyncOpenAI:       not installed")
    else:
        print(f"openai SDK AsyncOpenAI:       {sdk_rps:8,.0f} requests/s   (rsgen's client: {rsgen_rps / sdk_rps:.1f}x)")
    verdict = "meets" if rsgen_rps >= TARGET_REQUESTS_PER_SECOND else "MISSES"
    print(f"target >= {TARGET_REQUESTS_PER_SECOND:,} requests/s: {verdict}")


STAGE_TARGET = 0.85  # the generate stage against the minimal client on the same bodies


def stage_part(num_images: int, concurrency: int, workdir: Path, repetitions: int = 9) -> None:
    """The whole generate stage (requests read from the prepared pool, bodies built, responses verified, records
    checkpointed, progress shown) against the stub, beside the minimal client posting the same bodies."""
    import dataclasses
    import logging
    import shutil
    import statistics

    from rsgen.config import recipe_from_dict
    from rsgen.engine.openai_engine import OpenAIEngine
    from rsgen.generate.stage import GenerateStage, run_generate
    from rsgen.prepare import run_prepare
    from rsgen.schema import open_prepared
    from rsgen.testing.stub_server import STUB_MODEL, free_port

    logging.getLogger("rsgen").setLevel(logging.WARNING)
    port = free_port()
    stub = start([sys.executable, "-m", "rsgen.testing.stub_server", "--port", str(port)], f"http://127.0.0.1:{port}",
                 workdir / "stub-stage.log")
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        recipe = recipe_from_dict({
            "model_name_or_path": STUB_MODEL, "engine": "openai", "engine_base_url": [base_url], "judge": False,
            "output_dir": str(workdir / "stage"), "prepare_num_proc": 1, "max_new_tokens": 16,
            "engine_max_concurrency": concurrency,
            "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": num_images, "demo_seed": 7,
                         "family_column": "family", "options_column": "options", "source_id_column": "source_id"}]})
        run_prepare(recipe)
        stage = GenerateStage(recipe, open_prepared(recipe.output_dir))
        engine = OpenAIEngine(base_url, STUB_MODEL, max_new_tokens=16)
        bodies = [body for r in stage.requests(stage.keys()) for _, body in engine.bodies(r)]
        minimal, staged = [], []
        cpu = {"minimal": 0.0, "stage": 0.0, "client": 0.0}  # CPU seconds over every run, per process
        for _ in range(repetitions):  # interleaved pairs: the machine is shared, so each ratio is of one pair
            before = _cpu_seconds()
            minimal.append(run_minimal_client(base_url, bodies, concurrency))
            cpu["minimal"] += _cpu_seconds()[0] - before[0]
            shutil.rmtree(workdir / "stage" / "work" / "generate", ignore_errors=True)
            before = _cpu_seconds()
            start_time = time.perf_counter()
            summary = run_generate(dataclasses.replace(recipe))
            staged.append(summary.done_now / (time.perf_counter() - start_time))
            after = _cpu_seconds()  # the client process is joined by now: counted among the children
            cpu["stage"] += after[0] - before[0]
            cpu["client"] += after[1] - before[1]
    finally:
        stop(stub)
    ratios = [s / m for s, m in zip(staged, minimal)]
    ratio = statistics.median(ratios)
    print(f"\n== the generate stage against the STUB ({len(bodies):,} QA pairs of a {num_images}-image demo pool, "
          f"{concurrency} in flight, {repetitions} interleaved pairs)")
    print(f"minimal aiohttp client, same bodies: {statistics.median(minimal):8,.0f} requests/s median  (runs: "
          f"{', '.join(f'{x:,.0f}' for x in minimal)})")
    print(f"rsgen generate stage:                {statistics.median(staged):8,.0f} items/s median     (runs: "
          f"{', '.join(f'{x:,.0f}' for x in staged)}; verified, checkpointed)")
    print(f"stage / minimal client, per pair: {', '.join(f'{r:.0%}' for r in ratios)}; median {ratio:.0%} "
          f"(target >= {STAGE_TARGET:.0%}: {'meets' if ratio >= STAGE_TARGET else 'MISSES'})")
    per_item = {name: seconds / (len(bodies) * repetitions) * 1e6 for name, seconds in cpu.items()}
    print(f"CPU per request: minimal client {per_item['minimal']:.0f} us; generate stage {per_item['stage']:.0f} us in "
          f"its own process + {per_item['client']:.0f} us in its HTTP client process (processes sharing one CPU "
          "share -- a loaded machine -- go as fast as their sum allows; with a core each, as the slower one)")


def _cpu_seconds() -> tuple[float, float]:
    """(CPU seconds of this process, of its children that have ended) so far."""
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


def pacing_part(num_requests: int) -> None:
    """`engine_max_concurrency: auto` against a STUB of fixed capacity (32 requests at once, 50 ms each, 16 more
    queued, 429 beyond: at best 640 requests/s) beside every fixed setting; then a STUB rate-limited API (1,200
    requests a minute, in a sliding second) with and without `engine_requests_per_minute`."""
    import logging

    from rsgen.engine import openai_engine as oe
    from rsgen.engine.openai_engine import OpenAIEngine
    from rsgen.testing.stub_server import STUB_MODEL, CapacityReply, RateLimitedReply, StubChatServer

    logging.getLogger("rsgen").setLevel(logging.ERROR)
    requests = demo_requests(num_requests)

    def run(reply, **keys):
        with StubChatServer(reply=reply) as stub:
            engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_new_tokens=16, **keys)
            start_time = time.perf_counter()
            n = sum(1 for _ in engine.generate(requests))
            return n / (time.perf_counter() - start_time), engine

    print(f"\n== engine_max_concurrency against a STUB of fixed capacity (32 at once, 50 ms each, 16 queued, 429 "
          f"beyond; at best 640 requests/s; {num_requests} requests)")
    fixed = {}
    for concurrency in (8, 16, 32, 64, 128):
        server = CapacityReply(32, 0.05, 16)
        fixed[concurrency], _ = run(server, max_concurrency=concurrency)
        print(f"fixed {concurrency:>4}: {fixed[concurrency]:6.0f} requests/s   (429s from the server: {server.rejected})")
    server = CapacityReply(32, 0.05, 16)
    auto_rps, engine = run(server, max_concurrency="auto")
    best = max(fixed, key=fixed.get)
    print(f"auto:       {auto_rps:6.0f} requests/s   (429s: {server.rejected}; peak in flight "
          f"{engine.stats.in_flight_peak}, settled at {engine.adaptive.limit})")
    ratio = auto_rps / fixed[best]
    print(f"auto / best fixed setting ({best}): {ratio:.0%} (target: within 10%: {'meets' if ratio >= 0.9 else 'MISSES'})")

    paced_requests = requests[:200]
    print("\n== a STUB API limited to 1,200 requests a minute (20 in any sliding second), 200 requests, 64 in flight")
    oe_backoff = oe.BACKOFF_BASE_SECONDS
    for label, keys in (("no limit set", {}), ("engine_requests_per_minute: 1200", {"requests_per_minute": 1200})):
        api = RateLimitedReply(1200, window_seconds=1.0)
        with StubChatServer(reply=api) as stub:
            engine = OpenAIEngine(stub.base_url, STUB_MODEL, max_new_tokens=16, max_concurrency=64, max_retries=8,
                                  **keys)
            start_time = time.perf_counter()
            n = sum(1 for _, r in engine.generate(paced_requests) if not r.failed)
            seconds = time.perf_counter() - start_time
        print(f"{label:<34} {n} answered in {seconds:5.1f} s, 429s from the API: {api.rejected}")
    oe.BACKOFF_BASE_SECONDS = oe_backoff


def real_part(num_requests: int, workdir: Path) -> None:
    from rsgen.testing.stub_server import free_port
    from rsgen.testing.zoo import build_tiny_vlm

    model = build_tiny_vlm("llava", workdir / "llava")
    port = free_port()
    server = start([sys.executable, "-m", "transformers.cli.transformers", "serve", model, "--device", "cpu",
                    "--host", "127.0.0.1", "--port", str(port)], f"http://127.0.0.1:{port}", workdir / "serve.log")
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        requests = demo_requests(num_requests)
        run_rsgen_client(base_url, model, requests[:4], 1)  # warm-up
        one_rps, _ = run_rsgen_client(base_url, model, requests, 1)
        many_rps, engine = run_rsgen_client(base_url, model, requests, 16)
    finally:
        stop(server)
    mean_in_flight = engine.in_flight_seconds / max(engine.stats.generate_seconds, 1e-9)
    print(f"\n== against a real `transformers serve` (tiny zoo LLaVA on CPU, {num_requests} demo requests, 16 new "
          "tokens each)")
    print(f"1 in flight:  {one_rps:6.1f} requests/s")
    print(f"16 in flight: {many_rps:6.1f} requests/s; the client kept {engine.stats.in_flight_peak} in flight at peak, "
          f"{mean_in_flight:.1f} on average")
    print(f"concurrency the server reached: {many_rps / one_rps:.2f}x one request at a time "
          "(transformers serve answers VLM requests one at a time)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num-requests", type=int, default=3000)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--real", action="store_true", help="also measure against a real transformers serve")
    parser.add_argument("--real-requests", type=int, default=48)
    parser.add_argument("--stage-images", type=int, default=4000, help="demo images of the generate-stage part")
    parser.add_argument("--stage-repetitions", type=int, default=9, help="interleaved minimal-client/stage pairs; "
                        "the median of their ratios is the figure")
    parser.add_argument("--stage-only", action="store_true", help="only the generate-stage part")
    parser.add_argument("--pacing", action="store_true", help="also measure engine_max_concurrency: auto and "
                        "engine_requests_per_minute against a fixed-capacity and a rate-limited stub")
    parser.add_argument("--pacing-requests", type=int, default=3000)
    parser.add_argument("--pacing-only", action="store_true", help="only the --pacing part")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rsgen-bench-server-") as tmp:
        if not (args.stage_only or args.pacing_only):
            client_part(args.num_requests, args.concurrency, Path(tmp))
        if not args.pacing_only:
            stage_part(args.stage_images, args.concurrency, Path(tmp), args.stage_repetitions)
        if args.pacing or args.pacing_only:
            pacing_part(args.pacing_requests)
        if args.real:
            real_part(args.real_requests, Path(tmp))


if __name__ == "__main__":
    main()
