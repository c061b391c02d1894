"""The explore pass, measured side by side in one run, with the shipped demo model on the demo pool.

    python bench/bench_explore.py                        # CPU, defaults below
    python bench/bench_explore.py --num-images 40 --samples 8 --explore-samples 8
    python bench/bench_explore.py --device cuda          # the same on a GPU

1. Shared prompt vs separate requests: every question of `--num-images` demo images gets `--samples` sampled
   responses, once as one request per question with `sample_keys` (one image decode, processor call, image
   encoding and prefill; the cache repeated per sample) and once as `--samples` separate requests (keys `{id}#{s}`). Sampling is keyed per
   response, so both must give the same texts (checked). Printed: sampled responses per second of each, the
   ratio, and the share of wall time inside `model.generate`.
2. Paired stopping vs drawing all N: prepare + generate the demo pool once (judge off: the verifier alone decides),
   then the explore stage with `explore_stop: paired` and with `never` (`--explore-samples` N each). Printed:
   explore samples drawn, on-policy pairs found (questions with a verified-correct and a verified-wrong
   response), samples per found pair, and the learnable share (0 < pass rate < 1). Every sample `paired` draws
   is one `never` draws too (same key, same response; checked), so `never` finds every pair `paired` finds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

INSTRUCTION = "Answer in short without any other content."
SEED = 20261202


def sampling_requests(num_images: int, samples: int):
    from rsgen.demo.pool import make_demo_rows
    from rsgen.engine import ChatRequest
    from rsgen.schema import user_turn

    shared, separate = [], []
    for i, row in enumerate(make_demo_rows(num_images, SEED)):
        messages, images = user_turn(f"{row['question']}\n{INSTRUCTION}"), [row["image"]]
        keys = tuple(f"{i:06d}#{s}" for s in range(1, samples + 1))
        shared.append(ChatRequest(f"{i:06d}", messages, images, sample_keys=keys))
        separate += [ChatRequest(key, messages, images) for key in keys]
    return shared, separate


def timed(engine, requests) -> tuple[dict[str, str], float]:
    start = time.perf_counter()
    out = {(result.sample_key or request.key): result.text for request, result in engine.generate(requests)}
    return out, time.perf_counter() - start


def shared_vs_separate(args) -> None:
    from rsgen.engine import demo_model_path
    from rsgen.engine.models import load_model_and_processor
    from rsgen.engine.transformers_engine import TransformersEngine

    model, processor = load_model_and_processor(demo_model_path(), device=args.device)
    shared, separate = sampling_requests(args.num_images, args.samples)
    kwargs = dict(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=0, token_budget=args.token_budget,
                  chat_template_kwargs={"enable_thinking": True})
    # Warm-up (first-call costs are not the thing measured), then each mode once.
    timed(TransformersEngine(model, processor, **kwargs), separate[: args.samples * 2])
    results = {}
    for name, requests in (("separate", separate), ("shared", shared)):
        engine = TransformersEngine(model, processor, **kwargs)
        texts, seconds = timed(engine, requests)
        results[name] = (texts, seconds, engine.stats.generate_seconds)
    if results["shared"][0] != results["separate"][0]:
        sys.exit("shared-prompt sampling gave other responses than separate requests: a bug")
    n = len(separate)
    print(f"\n1. {n} sampled responses ({args.num_images} images, {len(shared)} questions x {args.samples} samples, "
          f"{args.max_new_tokens} new tokens at most, device {args.device})")
    print(f"{'mode':<10} {'seconds':>8} {'responses/s':>12} {'in generate':>12}")
    for name, (_texts, seconds, in_generate) in results.items():
        print(f"{name:<10} {seconds:>8.1f} {n / seconds:>12.2f} {in_generate / seconds:>12.0%}")
    print(f"shared / separate: {results['separate'][1] / results['shared'][1]:.2f}x responses per second "
          "(identical responses)")


def paired_vs_never(args) -> None:
    from rsgen.config import load_recipe
    from rsgen.demo_command import RECIPE
    from rsgen.explore import run_explore
    from rsgen.generate import run_generate
    from rsgen.layout import OutputLayout
    from rsgen.prepare import run_prepare
    from rsgen.store import CheckpointStore, distributed_state
    from rsgen.verify import run_verify

    root = Path(tempfile.mkdtemp(prefix="rsgen-bench-explore-"))
    try:
        base = root / "base"
        overrides = {"output_dir": str(base), "judge": False, "explore_samples": args.explore_samples,
                     "explore_temperature": 1.0, "prepare_num_proc": 1}
        recipe = load_recipe(RECIPE, overrides)
        recipe.sources[0].demo_num_images = args.num_images
        state = distributed_state()
        run_prepare(recipe)
        run_generate(recipe, state)
        run_verify(recipe, state)  # explore reads the verify stage's decisions, not generate's
        rows = {}
        for stop in ("paired", "never"):
            out = root / stop
            shutil.copytree(base, out)
            recipe = load_recipe(RECIPE, {**overrides, "output_dir": str(out), "explore_stop": stop})
            recipe.sources[0].demo_num_images = args.num_images
            start = time.perf_counter()
            run_explore(recipe, state)
            seconds = time.perf_counter() - start
            rates = [json.loads(line) for line in OutputLayout(out).explore_pass_rates.read_text().splitlines()]
            records = CheckpointStore(OutputLayout(out).explore_work).records()
            rows[stop] = (len(records), sum(r["paired"] for r in rates),
                          sum(0 < r["pass_rate"] < 1 for r in rates) / len(rates), seconds, records)
        paired, never = rows["paired"][4], rows["never"][4]
        if any(never[k]["response"] != rec["response"] for k, rec in paired.items()):
            sys.exit("a sample differs between the paired and the never run: sampling is not keyed per response")
        questions = len(rates)
        print(f"\n2. explore on {questions} questions ({args.num_images} demo images), explore_samples "
              f"{args.explore_samples}, temperature 1.0, judge off")
        print(f"{'explore_stop':<13} {'samples':>8} {'pairs':>6} {'samples/pair':>13} {'learnable':>10} {'seconds':>8}")
        for stop, (samples, pairs, learnable, seconds, _) in rows.items():
            per_pair = f"{samples / pairs:.2f}" if pairs else "-"
            print(f"{stop:<13} {samples:>8} {pairs:>6} {per_pair:>13} {learnable:>10.1%} {seconds:>8.1f}")
        (ps, pp, *_), (ns, np_, *_) = rows["paired"], rows["never"]
        if pp and np_:
            print(f"paired draws {(ns / np_) / (ps / pp):.2f}x fewer samples per found pair than never "
                  f"({pp}/{np_} of never's pairs found with {ps / ns:.0%} of its samples)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--num-images", type=int, default=20, help="demo images (several questions each)")
    parser.add_argument("--samples", type=int, default=4, help="part 1: sampled responses per question")
    parser.add_argument("--explore-samples", type=int, default=8, help="part 2: explore_samples")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--token-budget", type=int, default=16384)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    shared_vs_separate(args)
    paired_vs_never(args)


if __name__ == "__main__":
    main()
