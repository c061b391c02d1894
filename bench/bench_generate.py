"""The generation engine against the loop most users write, on the demo pool with a tiny zoo model.

    python bench/bench_generate.py                       # CPU: engine vs naive loop, one run
    python bench/bench_generate.py --arch idefics3 --num-images 60 --max-new-tokens 48
    python bench/bench_generate.py --device cuda         # GPU: a random Qwen2-VL-2B, tokens/s per token budget

CPU mode: every QA pair of the demo pool (`--num-images` images, several questions each) is answered twice,
greedily: by the naive loop (per question: `apply_chat_template(tokenize=True)`, one `model.generate`, decode)
and by `TransformersEngine` (length-sorted, token-budgeted batches, processor work in background threads). The two
must give the same outputs. Printed: items/s of each and the ratio, the engine's padding efficiency (real tokens
/ tokens computed, prompt padding and finished rows both counted) and the share of wall time spent inside
`model.generate`. Targets on a 2-core CPU machine: ratio >= 5, padding efficiency >= 0.85, >= 80 % in generate.

CUDA mode: a randomly initialised model with the configuration of Qwen2-VL-2B (no download; the tokenizer and
processor come from the zoo model, with Qwen2-VL's real image resolution range) answers the demo questions with
`--max-new-tokens` tokens each (a random model rarely stops early, so every row runs to the limit); printed:
generated tokens/s, items/s, rows per batch and peak memory at each of `--budgets`. `--model-size smoke` runs the
same code path with a small configuration (to check it anywhere).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

INSTRUCTION = "Answer in short without any other content."
SEED = 20261202


def demo_requests(num_images: int):
    from rsgen.demo.pool import make_demo_rows
    from rsgen.engine import ChatRequest
    from rsgen.schema import user_turn

    return [
        ChatRequest(f"{i:06d}", user_turn(f"{row['question']}\n{INSTRUCTION}"), [row["image"]])
        for i, row in enumerate(make_demo_rows(num_images, SEED))
    ]


def naive_loop(model, processor, requests, max_new_tokens: int, chat_template_kwargs: dict):
    """One request at a time, as in the model cards: decode the image, template+tokenize, generate, decode."""
    import torch

    from rsgen.engine.transformers_engine import decode_image

    eos = model.generation_config.eos_token_id
    eos = {eos} if isinstance(eos, int) else set(eos)
    outputs, in_generate = {}, 0.0
    start = time.perf_counter()
    for request in requests:
        image = decode_image(request.images[0])
        messages = [
            {"role": "user", "content": [{"type": "image", "image": image}, request.messages[0]["content"][1]]}
        ]
        inputs = processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True, return_tensors="pt",
            **chat_template_kwargs,
        ).to(model.device)
        t = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False)
        in_generate += time.perf_counter() - t
        new = out[0, inputs["input_ids"].shape[1]:].tolist()
        end = next((i for i, tok in enumerate(new) if tok in eos), len(new))
        outputs[request.key] = processor.tokenizer.decode(new[:end], skip_special_tokens=True)
    return outputs, time.perf_counter() - start, in_generate


def run_engine(model, processor, requests, **engine_kwargs):
    from rsgen.engine.transformers_engine import TransformersEngine

    engine = TransformersEngine(model, processor, **engine_kwargs)
    start = time.perf_counter()
    outputs = {request.key: result.text for request, result in engine.generate(requests)}
    return outputs, time.perf_counter() - start, engine


def cpu_benchmark(args) -> int:
    import torch

    from rsgen.engine.models import load_model_and_processor
    from rsgen.testing.zoo import build_tiny_vlm

    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model, processor = load_model_and_processor(build_tiny_vlm(args.arch, tmp), device="cpu")
    requests = demo_requests(args.num_images)
    kwargs = {"enable_thinking": True}
    engine_kwargs = dict(
        max_new_tokens=args.max_new_tokens, token_budget=args.token_budget, max_batch_size=args.max_batch_size,
        chat_template_kwargs=kwargs,
    )
    print(f"{len(requests)} questions on {args.num_images} demo images; zoo model {args.arch}; "
          f"max_new_tokens {args.max_new_tokens}; torch threads {torch.get_num_threads()}")
    # Warm both paths up (first-call allocations, lazy imports) on a few requests, untimed.
    run_engine(model, processor, requests[:4], **engine_kwargs)
    naive_loop(model, processor, requests[:2], args.max_new_tokens, kwargs)

    engine_out, engine_s, engine = run_engine(model, processor, requests, **engine_kwargs)
    naive_out, naive_s, naive_in_generate = naive_loop(model, processor, requests, args.max_new_tokens, kwargs)

    same = sum(engine_out[k] == naive_out[k] for k in naive_out)
    stats = engine.stats
    n = len(requests)
    rows = [
        ("naive loop", n / naive_s, naive_s, naive_in_generate / naive_s, n, 1.0),
        ("engine", n / engine_s, engine_s, stats.generate_seconds / engine_s, stats.batches, stats.padding_efficiency),
    ]
    print(f"\n{'':<12} {'items/s':>9} {'seconds':>8} {'in generate':>12} {'generate calls':>15} {'padding eff.':>13}")
    for name, rate, seconds, share, calls, eff in rows:
        print(f"{name:<12} {rate:>9.2f} {seconds:>8.2f} {share:>12.1%} {calls:>15} {eff:>13.3f}")
    ratio = (n / engine_s) / (n / naive_s)
    print(f"\nspeed-up (engine / naive items/s): {ratio:.1f}x")
    print(f"padding efficiency: {stats.padding_efficiency:.3f} overall, {stats.prompt_padding_efficiency:.3f} on prompts "
          f"({stats.prompt_tokens} real / {stats.padded_prompt_tokens} padded prompt tokens, "
          f"{stats.generated_tokens} real / {stats.padded_generated_tokens} computed generation slots)")
    print(f"engine wall time inside generate: {stats.generate_seconds / engine_s:.1%} "
          f"(waiting for prepared batches: {stats.wait_seconds:.2f} s)")
    print(f"identical outputs: {same}/{n}")
    checks = {
        "outputs identical": same == n,
        "speed-up >= 5x": ratio >= 5,
        "padding efficiency >= 0.85": stats.padding_efficiency >= 0.85,
        ">= 80% of wall time in generate": stats.generate_seconds / engine_s >= 0.80,
    }
    for name, ok in checks.items():
        print(f"  [{'ok' if ok else 'MISSED'}] {name}")
    return 0 if all(checks.values()) else 1


def qwen2_vl_config(size: str, vocab_size: int, special_ids: dict):
    from transformers import Qwen2VLConfig

    if size == "2b":  # Qwen/Qwen2-VL-2B-Instruct
        text = dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                    num_key_value_heads=2, rope_theta=1_000_000.0, max_position_embeddings=32768)
        vision = dict(depth=32, embed_dim=1280, hidden_size=1536, mlp_ratio=4, num_heads=16, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
    else:  # smoke: the same code path, small enough for a CPU
        text = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, rope_theta=1_000_000.0, max_position_embeddings=32768)
        vision = dict(depth=1, embed_dim=64, hidden_size=128, mlp_ratio=2, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2)
    text["rope_parameters"] = {"rope_type": "default", "mrope_section": [16, 24, 24] if size == "2b" else [4, 6, 6],
                               "rope_theta": text["rope_theta"]}
    token_ids = {k: special_ids[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    return Qwen2VLConfig(text_config={**text, **token_ids, "vocab_size": vocab_size}, vision_config=vision, **special_ids)


def device_benchmark(args) -> int:
    import torch
    from transformers import Qwen2VLForConditionalGeneration
    from transformers.image_processing_utils import SizeDict

    from rsgen.engine.models import load_config, load_processor
    from rsgen.testing.zoo import build_tiny_vlm

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("--device cuda: no CUDA device here", file=sys.stderr)
        return 2
    size = args.model_size or ("2b" if device.type == "cuda" else "smoke")
    with tempfile.TemporaryDirectory() as tmp:
        path = build_tiny_vlm("qwen2_vl", tmp)
        processor = load_processor(path, load_config(path))
    tok = processor.tokenizer
    # Qwen2-VL's own resolution range, so images cost what they cost with the real model.
    processor.image_processor.size = SizeDict(shortest_edge=56 * 56, longest_edge=28 * 28 * 1280)
    special = dict(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
    )
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = qwen2_vl_config(size, 151936 if size == "2b" else len(tok), special)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2VLForConditionalGeneration._from_config(
            config, dtype=dtype, attn_implementation="sdpa"
        ).eval()
    model.generation_config.eos_token_id = [tok.eos_token_id]
    model.generation_config.pad_token_id = tok.pad_token_id
    params = sum(p.numel() for p in model.parameters())
    requests = demo_requests(args.num_images)
    print(f"random Qwen2-VL ({size}, {params / 1e9:.2f} B parameters, {dtype}) on {device}; "
          f"{len(requests)} questions; max_new_tokens {args.max_new_tokens}")
    run_engine(model, processor, requests[:8], max_new_tokens=8, token_budget=args.budgets[0])  # warm-up
    print(f"\n{'token budget':>12} {'gen tok/s':>10} {'items/s':>8} {'rows/batch':>11} {'in generate':>12} "
          f"{'padding eff.':>13} {'peak GiB':>9} {'OOM splits':>11}")
    for budget in args.budgets:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        _, seconds, engine = run_engine(
            model, processor, requests, max_new_tokens=args.max_new_tokens, token_budget=budget,
            max_batch_size=args.max_batch_size,
        )
        stats = engine.stats
        peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else float("nan")
        print(f"{budget:>12} {stats.generated_tokens / seconds:>10.0f} {len(requests) / seconds:>8.2f} "
              f"{stats.requests / stats.batches:>11.1f} {stats.generate_seconds / seconds:>12.1%} "
              f"{stats.padding_efficiency:>13.3f} {peak:>9.1f} {stats.oom_splits:>11}", flush=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu: engine vs naive loop; cuda: real-size model")
    parser.add_argument("--arch", default="qwen2_vl", help="zoo model for the CPU comparison")
    parser.add_argument("--num-images", type=int, default=None, help="demo images (several questions each)")
    parser.add_argument("--max-new-tokens", type=int, default=None)
    parser.add_argument("--token-budget", type=int, default=4096, help="CPU mode: padded tokens per batch")
    parser.add_argument("--max-batch-size", type=int, default=256)
    parser.add_argument("--budgets", type=int, nargs="+", default=[32768, 131072, 524288],
                        help="device mode: token budgets to compare")
    parser.add_argument("--model-size", choices=("2b", "smoke"), default=None, help="device mode model size")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads in CPU mode, for both paths (tiny models: a second thread only adds "
                             "synchronisation, and on a busy machine it spins against other processes)")
    args = parser.parse_args()
    if args.device == "cpu" and args.model_size is None:
        args.num_images = args.num_images or 100
        args.max_new_tokens = args.max_new_tokens or 32
        sys.exit(cpu_benchmark(args))
    args.num_images = args.num_images or (100 if args.device != "cpu" else 8)
    args.max_new_tokens = args.max_new_tokens or (256 if args.device != "cpu" else 16)
    if args.device == "cpu":
        args.budgets = [b for b in args.budgets if b <= 65536] or args.budgets[:1]
    sys.exit(device_benchmark(args))


if __name__ == "__main__":
    main()
