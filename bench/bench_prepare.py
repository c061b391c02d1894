"""Throughput and peak memory of the prepare stage on the demo pool, at two pool sizes.

    python bench/bench_prepare.py                      # 1,000 and 10,000 images, 2 workers
    python bench/bench_prepare.py --sizes 1000 10000 --num-proc 2 --source demo

Each size runs in a fresh subprocess so that its peak resident memory (ru_maxrss) is its own. With
`--source parquet` (the default) the demo pool is first written to a parquet file (not timed) and prepare reads
it like any local pool; `--source demo` draws the images inside prepare (`dataset_name: rsgen-demo`), which
measures the drawing too. Target: peak memory at 10,000 images within 1.5x of that at 1,000.

    python bench/bench_prepare.py --decontaminate 10000   # also: the overhead of decontamination

With `--decontaminate N`, each size is prepared three times side by side in one run: without an evaluation set,
then with an evaluation set of N demo images of another seed (a parquet file, drawn untimed) twice -- cold (an
empty signature cache: every evaluation image is hashed, by the prepare workers) and warm (the signatures cached
by the cold run, rsgen.prepare.decontaminate.signature_cache_root, in a cache folder of the bench's own). Printed:
the overhead of each over the plain run (target, warm: under 20%), the evaluation images the cold run indexed per
second of its time over the warm run's (the indexing alone; target: >= 3x the 870 images/s one process hashed
before the cache, issue #35) and per second of its time over the plain run's (the pool side's matching too), the
images one process hashes per second, whether the three pools are identical (the cache changes no decision), and
the CPU time one worker spends on a pool image without and with the evaluation index (the part no cache removes).
Each run's CPU seconds (main process + image workers) are printed beside its wall time: on a shared machine the
wall time follows the CPU a run needs in all.

    python bench/bench_prepare.py --sizes 10000 --decontaminate 10000 --image-size 480x320

With `--image-size WxH` the demo images of the pool and of the evaluation set are drawn as usual and then stored
resized to W x H (bilinear, PNG; untimed), e.g. CLEVR's 480 x 320: the demo's 168 x 112 PNGs decode in ~0.1 ms,
so on them every per-image cost of decontamination weighs more than on a real pool's images.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 20261202
BASELINE_HASH_RATE = 870  # evaluation images hashed per second by one process before the cache (issue #35)


def child(num_images: int, num_proc: int, source_kind: str, workdir: str, decontaminate: int = 0,
          output_name: str = "out") -> dict:
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from rsgen.config import RecipeConfig, source_from_dict
    from rsgen.prepare import run_prepare

    mapping = {"family_column": "family", "options_column": "options", "source_id_column": "source_id"}
    if source_kind == "parquet":
        source = {"data_files": [os.path.join(workdir, "pool.parquet")], **mapping}
    else:
        source = {"dataset_name": "rsgen-demo", "demo_num_images": num_images, "demo_seed": SEED, **mapping}
    evaluation = [source_from_dict({"data_files": [os.path.join(workdir, "eval.parquet")], **mapping}, 0,
                                   "decontaminate")] if decontaminate else []
    recipe = RecipeConfig(
        output_dir=os.path.join(workdir, output_name), sources=[source_from_dict(source)], prepare_num_proc=num_proc,
        decontaminate=evaluation,
    )
    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu_before = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    start = time.perf_counter()
    report = run_prepare(recipe, force=True)
    seconds = time.perf_counter() - start
    # CPU time of the main process and of the image workers (joined when prepare ends, so RUSAGE_CHILDREN has
    # them): on a shared machine the wall time follows the CPU a run needs in all more than its critical path.
    cpu = [after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime for before, after in zip(
        cpu_before, (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)))]
    import hashlib

    shards = sorted(Path(recipe.output_dir, "prepared").glob("*.parquet"))
    return {
        "pool_sha256": hashlib.sha256(b"".join(p.read_bytes() for p in shards)).hexdigest(),
        "images": num_images,
        "eval_images": decontaminate,
        "removed": report["dropped_qa_pairs"],
        "source_rows": sum(s["source_rows"] for s in report["sources"]),
        "qa_pairs": report["input_qa_pairs"],
        "rows_written": report["rows"],
        "seconds": round(seconds, 2),
        "cpu_main_s": round(cpu[0], 2),
        "cpu_workers_s": round(cpu[1], 2),
        "source_rows_per_s": round(sum(s["source_rows"] for s in report["sources"]) / seconds, 1),
        "images_per_s": round(num_images / seconds, 1),
        "rss_before_mb": round(baseline / 1024, 1),
        # The main process only: a spawned worker's ru_maxrss includes the parent's pages at fork time, so
        # RUSAGE_CHILDREN would report the parent's size again, not the worker's.
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def write_pool(path: str, num_images: int, seed: int, image_size: tuple[int, int] | None) -> None:
    """The demo pool as a parquet file, its images resized to `image_size` (W, H) when given. Row groups of 100
    rows, as `datasets` writes image datasets: a parquet reader holds about one row group, so a pool written as one
    giant row group would measure the file layout, not prepare."""
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from rsgen.demo.pool import write_demo_pool

    write_demo_pool(path, num_images, seed, rows_per_row_group=100)
    if image_size is None:
        return
    drawn = pq.ParquetFile(path)
    with pq.ParquetWriter(path + ".resized", drawn.schema_arrow) as writer:
        for group in range(drawn.num_row_groups):
            table = drawn.read_row_group(group)
            cells = []
            for cell in table.column("image").to_pylist():
                buffer = io.BytesIO()
                image = Image.open(io.BytesIO(cell["bytes"])).convert("RGB").resize(image_size, Image.BILINEAR)
                image.save(buffer, format="PNG")  # Pillow's default level, as datasets' PNGs are written
                cells.append({**cell, "bytes": buffer.getvalue()})
            column = table.schema.get_field_index("image")
            writer.write_table(table.set_column(column, table.schema.field(column),
                                                pa.array(cells, type=table.schema.field(column).type)))
    os.replace(path + ".resized", path)


def hashed_per_second(image_size: tuple[int, int] | None, n: int = 200) -> float:
    import io

    from PIL import Image

    from rsgen.demo.pool import make_demo_image
    from rsgen.prepare.perceptual import image_signature

    images = [Image.open(io.BytesIO(make_demo_image(SEED, i)[1])).convert("RGB") for i in range(n)]
    if image_size is not None:
        images = [image.resize(image_size, Image.BILINEAR) for image in images]
    start = time.perf_counter()
    for image in images:
        image_signature(image)
    return n / (time.perf_counter() - start)


def worker_cost(pool_parquet: str, index_dir: str, repeats: int = 3) -> tuple[float, float]:
    """CPU seconds one worker process spends an image on the pool's images (`process_images` in batches of 32, the
    best of `repeats`), without and with the evaluation index at `index_dir`: the pool side of decontamination,
    which no cache removes. CPU time, not wall time: on a shared machine (load 5-7 on 2 cores) the wall time of the
    same code varied by 1.4x between consecutive runs, the CPU time by a few percent."""
    import pyarrow.parquet as pq

    from rsgen.prepare.images import ImageJob, process_images
    from rsgen.prepare.perceptual import open_index

    seen, images = set(), []
    for cell in pq.read_table(pool_parquet, columns=["image"]).column("image").to_pylist():
        if cell["bytes"] not in seen:
            seen.add(cell["bytes"])
            images.append(cell["bytes"])
    open_index(index_dir)  # opened once per worker in prepare: not part of an image's cost
    best = {}
    for index in [None, index_dir] * repeats:
        jobs = [ImageJob("bytes", data, None, 1 << 30, 1000.0, index) for data in images]
        start = time.process_time()
        for i in range(0, len(jobs), 32):
            process_images(jobs[i : i + 32])
        best[index] = min(best.get(index, float("inf")), (time.process_time() - start) / len(images))
    return best[None], best[index_dir]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--num-proc", type=int, default=2)
    parser.add_argument("--source", choices=["parquet", "demo"], default="parquet")
    parser.add_argument("--decontaminate", type=int, default=0, help="evaluation images (0: no decontamination run)")
    parser.add_argument("--image-size", help="WxH: store the demo images resized to this size (e.g. 480x320)")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--output-name", default="out", help=argparse.SUPPRESS)
    parser.add_argument("--workdir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        result = child(args.child, args.num_proc, args.source, args.workdir, args.decontaminate, args.output_name)
        print(json.dumps(result))
        return

    image_size = None
    if args.image_size:
        try:
            image_size = tuple(int(side) for side in args.image_size.lower().split("x"))
        except ValueError:
            image_size = ()
        if len(image_size) != 2 or min(image_size) < 1:
            parser.error(f"--image-size {args.image_size!r}: expected WIDTHxHEIGHT in pixels, e.g. 480x320")
        if args.source != "parquet":
            parser.error("--image-size resizes the images of a parquet pool: use it with --source parquet")
    results = []
    for size in args.sizes:
        with tempfile.TemporaryDirectory(prefix="rsgen-bench-prepare-") as workdir:
            # Drawn in other processes, so that drawing leaves no trace in the measured one.
            draw = [(os.path.join(workdir, "pool.parquet"), size, SEED)] if args.source == "parquet" else []
            if args.decontaminate:
                draw.append((os.path.join(workdir, "eval.parquet"), args.decontaminate, SEED + 1))
            drawing = [subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                                "from bench_prepare import write_pool; write_pool(sys.argv[2], int(sys.argv[3]), "
                                "int(sys.argv[4]), tuple(map(int, sys.argv[5:])) or None)",
                                os.path.dirname(os.path.abspath(__file__)), path, str(count), str(seed),
                                *map(str, image_size or ())]) for path, count, seed in draw]
            if any(process.wait() for process in drawing):
                sys.exit("drawing the demo pool failed (see above)")
            runs = []
            # plain, then cold and warm: the same signature cache folder, empty before the cold run.
            env = {**os.environ, "HF_ASSETS_CACHE": os.path.join(workdir, "signature-cache")}
            plan = [("plain", 0), ("cold", args.decontaminate), ("warm", args.decontaminate)] if args.decontaminate \
                else [("plain", 0)]
            for name, evaluation in plan:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", str(size), "--workdir", workdir, "--num-proc",
                     str(args.num_proc), "--source", args.source, "--decontaminate", str(evaluation),
                     "--output-name", name],
                    check=True, capture_output=True, text=True, env=env,
                )
                runs.append({"run": name, **json.loads(out.stdout.strip().splitlines()[-1])})
                print(json.dumps(runs[-1]))
            costs = None
            if args.decontaminate and args.source == "parquet":  # before the work folder (and its cache) goes
                (index_dir,) = {str(p.parent) for p in Path(env["HF_ASSETS_CACHE"]).glob("rsgen/*/*/*/hashes.npz")}
                costs = worker_cost(os.path.join(workdir, "pool.parquet"), index_dir)
        results.append(runs[0])
        if args.decontaminate:
            plain, cold, warm = runs
            for run, target in ((cold, None), (warm, 0.2)):
                overhead = run["seconds"] / plain["seconds"] - 1
                verdict = "" if target is None else f" (target < {target:.0%}: {'OK' if overhead < target else 'OVER TARGET'})"
                print(f"decontamination against {args.decontaminate} evaluation images, pool of {size}, {run['run']} "
                      f"signature cache: {plain['seconds']} s -> {run['seconds']} s, overhead {overhead:+.0%}{verdict}; "
                      f"QA pairs removed {run['removed']}")
                cpu_plain, cpu_run = (r["cpu_main_s"] + r["cpu_workers_s"] for r in (plain, run))
                print(f"  CPU seconds (main + workers): {plain['cpu_main_s']} + {plain['cpu_workers_s']} -> "
                      f"{run['cpu_main_s']} + {run['cpu_workers_s']}, {cpu_run / max(cpu_plain, 1e-9) - 1:+.0%}")
            # The cold run's extra time over the warm run is the evaluation set's indexing alone (hashing the images,
            # writing the cache): both runs then match the same pool against the same index. Over the plain run it
            # also counts that matching, which grows with the pool (docs/decontamination.md#cost).
            rate = args.decontaminate / max(cold["seconds"] - warm["seconds"], 1e-9)
            rate_plain = args.decontaminate / max(cold["seconds"] - plain["seconds"], 1e-9)
            print(f"cold: {rate:,.0f} evaluation images indexed per second of the cold run's time over the warm run's, "
                  f"{args.num_proc} workers (target >= {3 * BASELINE_HASH_RATE:,} = 3x the {BASELINE_HASH_RATE} "
                  f"images/s of one process before the cache: {'OK' if rate >= 3 * BASELINE_HASH_RATE else 'UNDER TARGET'}"
                  f"); {rate_plain:,.0f} per second of its time over the plain run's (the pool side included)")
            same = cold["pool_sha256"] == warm["pool_sha256"] and cold["removed"] == warm["removed"]
            print(f"cold and warm prepared pools identical: {same}")
            if costs is not None:
                plain_cost, decon_cost = costs
                print(f"one worker, an image of the pool: {plain_cost * 1e6:,.0f} us of CPU without decontamination, "
                      f"{decon_cost * 1e6:,.0f} us with it (+{(decon_cost - plain_cost) * 1e6:,.0f} us: its "
                      "signature, the proposal, the gate, the pixel checks)")
    print()
    print(f"source: {args.source}, workers: {args.num_proc}, images: "
          + ("168 x 112 (the demo's)" if image_size is None else f"{image_size[0]} x {image_size[1]} (resized)"))
    print(f"{'images':>8} {'rows':>8} {'QA pairs':>9} {'seconds':>8} {'rows/s':>8} {'images/s':>9} {'peak MB':>8}")
    for r in results:
        print(f"{r['images']:>8} {r['source_rows']:>8} {r['qa_pairs']:>9} {r['seconds']:>8} {r['source_rows_per_s']:>8} "
              f"{r['images_per_s']:>9} {r['peak_rss_mb']:>8}")
    if args.decontaminate:
        print(f"images hashed per second (one process): {hashed_per_second(image_size):.0f}")
    if len(results) >= 2:
        ratio = results[-1]["peak_rss_mb"] / results[0]["peak_rss_mb"]
        verdict = "OK" if ratio <= 1.5 else "OVER TARGET"
        print(f"peak memory ratio {results[-1]['images']} / {results[0]['images']} images: {ratio:.2f}x "
              f"(target <= 1.5x: {verdict})")


if __name__ == "__main__":
    main()
