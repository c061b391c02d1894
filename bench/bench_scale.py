"""rsgen's own cost at users' sizes: the whole pipeline on 10k to 1M QA pairs against a server that answers at once.

    python bench/bench_scale.py                          # 10,000 and 100,000 QA pairs
    python bench/bench_scale.py --sizes 100000 1000000   # up to a million (the pool is drawn once, then cached)
    python bench/bench_scale.py --sizes 100000 1000000 --keep-work DIR               # keep each size's work in DIR
    python bench/bench_scale.py --sizes 100000 1000000 --keep-work DIR --stage emit  # emit alone again on it

The model is taken out: the server is the STUB (`python -m rsgen.testing.stub_server`, in a process of its own),
which answers every request at once with the same text (`2`, with a line of reasoning returned apart), so that
what is measured is rsgen alone: prepare -> generate -> verify -> judge -> blind -> emit, each stage its own
`python -m rsgen STAGE --config recipe.yaml` process (as a user runs them), blind check on (`flag`). The fixed answer
is right for some demo questions (counts of 2), so every path runs: accepted pairs (calibration, blind check, the
RS splits) and rejected ones (the judge, whose answer `2` is no verdict: UNSURE, the rejected split).

The pool is the demo pool (about 4 QA pairs per image), drawn untimed into `--pool-dir` (default
~/.cache/rsgen-bench) by two processes and reused by later runs. Printed per size and stage: seconds, QA pairs per
second, peak RSS of the stage's process (ru_maxrss from wait4, prepare's worker processes not included), files
under work/ after the stage; then the growth of each stage's time between consecutive sizes divided by the growth
of the work (1.00 = linear), and of each stage's peak RSS. Goals (issue #35): 1M QA pairs end to end in <= 60 min,
peak RSS <= 4 GB, every stage within 1.3x of linear from 100k to 1M, emit's peak RSS flat (within 1.3x) from 100k
to 1M. Numbers of stages that take under a few seconds at the smaller size
are mostly process start-up; the ratio is printed for them too.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SEED = 20261204
QA_PER_IMAGE = 4.0  # the demo pool draws about 4.04 QA pairs per image
STAGES = ("prepare", "generate", "verify", "judge", "blind", "emit")
GOAL_SECONDS_1M = 3600
GOAL_RSS_MB = 4096
GOAL_GROWTH = 1.3
FLAT_RSS_STAGES = ("emit",)  # stages whose memory must not grow with the pool (issue #35 point 6)
GOAL_RSS_GROWTH = 1.3  # their peak RSS from 100k to 1M pairs: within this of the smaller size's


def draw_pool(pool_dir: Path, images: int) -> list[Path]:
    """The demo pool of `images` images as two parquet files (drawn by two processes), cached by size."""
    halves = [(images + 1) // 2, images // 2]
    paths = [pool_dir / f"demo-{images}-{i}.parquet" for i in range(2)]
    todo = [(p, n, SEED + i) for i, (p, n) in enumerate(zip(paths, halves)) if not p.exists()]
    if todo:
        print(f"drawing a demo pool of {images:,} images into {pool_dir} (untimed, once) ...", flush=True)
        start = time.perf_counter()
        procs = [subprocess.Popen([sys.executable, "-c", "import sys; from rsgen.demo.pool import write_demo_pool; "
                                   "write_demo_pool(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "
                                   "rows_per_row_group=100)", str(p), str(n), str(seed)]) for p, n, seed in todo]
        if any(p.wait() for p in procs):
            raise SystemExit("drawing the demo pool failed")
        print(f"  drawn in {time.perf_counter() - start:.0f} s", flush=True)
    return paths


def start_stub(port: int, log: Path) -> subprocess.Popen:
    from rsgen.engine.server import wait_until_healthy

    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "rsgen.testing.stub_server", "--port", str(port),
                                    "--content", "2", "--reasoning", "There are 2."],
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    wait_until_healthy(f"http://127.0.0.1:{port}", process, lambda: log.read_text()[-2000:], timeout=60)
    return process


def write_recipe(path: Path, output_dir: Path, pool: list[Path], port: int) -> None:
    import yaml

    recipe = {
        "model_name_or_path": "stub-model",
        "output_dir": str(output_dir),
        "engine": "openai",
        "engine_base_url": [f"http://127.0.0.1:{port}/v1"],
        "sources": [{"data_files": [str(p) for p in pool], "family_column": "family", "options_column": "options",
                     "source_id_column": "source_id"}],
        "instruction": "Answer in short without any other content.",
        "max_new_tokens": 96,
        "verifier": "relaxed",
        "judge": True,
        "judge_calibration_size": 60,
        "blind_check": "flag",
        "checkpoint_every_items": 64,  # the demo's setting: the most parts a stage can write
        "prepare_num_proc": 2,
    }
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))


def count_files(folder: Path) -> int:
    return sum(len(files) for _root, _dirs, files in os.walk(folder))


def run_stage(stage: str, recipe: Path, output_dir: Path, log: Path) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    start = time.perf_counter()
    with open(log, "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "rsgen", stage, "--config", str(recipe)], stdout=out,
                                   stderr=subprocess.STDOUT, env=env)
        _pid, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode:
        raise SystemExit(f"rsgen {stage} failed (exit {process.returncode}); its log: {log}")
    return {"stage": stage, "seconds": round(seconds, 2), "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "work_files": count_files(output_dir / "work")}


def run_size(qa_pairs: int, pool_dir: Path, keep: Path | None, keep_work: Path | None = None,
             only: tuple[str, ...] = STAGES) -> dict:
    from rsgen.testing.stub_server import free_port

    images = math.ceil(qa_pairs / QA_PER_IMAGE)
    pool = draw_pool(pool_dir, images)
    with contextlib.ExitStack() as stack:
        if keep_work is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rsgen-bench-scale-", dir=keep)))
        else:  # kept, so that a later run can measure one stage again on the same work (--stage)
            tmp = keep_work / f"qa-{qa_pairs}"
            tmp.mkdir(parents=True, exist_ok=True)
        output_dir, recipe, log = tmp / "out", tmp / "recipe.yaml", tmp / "rsgen.log"
        if only == STAGES and output_dir.exists():  # the stages would resume finished work: nothing measured
            raise SystemExit(f"{output_dir} holds an earlier run: remove it, or measure stages again with --stage")
        if only != STAGES and not (output_dir / "prepared" / "prepare_report.json").exists():
            raise SystemExit(f"--stage {' '.join(only)} needs the earlier stages' work in {tmp}: run once with "
                             "--keep-work and every stage first")
        port = free_port()
        stub = start_stub(port, tmp / "stub.log")
        try:
            write_recipe(recipe, output_dir, pool, port)
            stages = []
            for stage in only:
                stages.append(run_stage(stage, recipe, output_dir, log))
                print(json.dumps({"qa_pairs_asked": qa_pairs, **stages[-1]}), flush=True)
        finally:
            stub.terminate()
            stub.wait(timeout=30)
        report = json.loads((output_dir / "prepared" / "prepare_report.json").read_text())
        stats = json.loads((output_dir / "stats.json").read_text())
        pairs = report["kept_qa_pairs"]
        return {"qa_pairs_asked": qa_pairs, "qa_pairs": pairs, "images": images, "stages": stages,
                "dataset_files": count_files(output_dir / "dataset"), "totals": stats.get("totals", {})}


def _whole(result: dict) -> bool:
    """Whether a result ran every stage (not `--stage`)."""
    return [s["stage"] for s in result["stages"]] == list(STAGES)


def print_table(results: list[dict]) -> None:
    print()
    print(f"{'QA pairs':>10} {'stage':>9} {'seconds':>9} {'pairs/s':>9} {'peak MB':>8} {'work files':>10}")
    for r in results:
        for s in r["stages"]:
            print(f"{r['qa_pairs']:>10,} {s['stage']:>9} {s['seconds']:>9.1f} {r['qa_pairs'] / s['seconds']:>9,.0f} "
                  f"{s['peak_rss_mb']:>8.0f} {s['work_files']:>10,}")
        if not _whole(r):  # --stage: a total of some stages is no pipeline's
            continue
        total = sum(s["seconds"] for s in r["stages"])
        peak = max(s["peak_rss_mb"] for s in r["stages"])
        print(f"{r['qa_pairs']:>10,} {'total':>9} {total:>9.1f} {r['qa_pairs'] / total:>9,.0f} {peak:>8.0f} "
              f"{r['stages'][-1]['work_files']:>10,}")
    verdicts = []
    for small, big in zip(results, results[1:]):
        work = big["qa_pairs"] / small["qa_pairs"]
        print(f"\ngrowth {small['qa_pairs']:,} -> {big['qa_pairs']:,} QA pairs (x{work:.1f} the work): "
              "time ratio / work ratio (1.00 = linear); peak RSS ratio (1.00 = flat)")
        for a, b in zip(small["stages"], big["stages"]):
            growth = b["seconds"] / a["seconds"] / work
            rss = b["peak_rss_mb"] / a["peak_rss_mb"]
            print(f"  {a['stage']:>9}: {growth:.2f}   files under work/ {a['work_files']:,} -> {b['work_files']:,}   "
                  f"peak RSS {a['peak_rss_mb']:,.0f} -> {b['peak_rss_mb']:,.0f} MB (x{rss:.2f})")
            if small["qa_pairs_asked"] >= 100_000:  # below, process start-up is a large share of a stage
                verdicts.append((f"{a['stage']} growth <= {GOAL_GROWTH}x linear", growth <= GOAL_GROWTH))
                if a["stage"] in FLAT_RSS_STAGES:
                    verdicts.append((f"{a['stage']} peak RSS flat (<= {GOAL_RSS_GROWTH}x from {small['qa_pairs']:,} "
                                     f"to {big['qa_pairs']:,})", rss <= GOAL_RSS_GROWTH))
    for r in filter(_whole, results):
        peak = max(s["peak_rss_mb"] for s in r["stages"])
        total = sum(s["seconds"] for s in r["stages"])
        per_million = total * 1_000_000 / r["qa_pairs"]
        print(f"\n{r['qa_pairs']:,} QA pairs: {total / 60:.1f} min end to end ({per_million / 60:.1f} min per million "
              f"at this rate), peak RSS {peak:,.0f} MB")
        if r["qa_pairs_asked"] >= 100_000:
            verdicts.append((f"peak RSS <= {GOAL_RSS_MB} MB at {r['qa_pairs']:,}", peak <= GOAL_RSS_MB))
            verdicts.append((f"<= 60 min per million at {r['qa_pairs']:,}", per_million <= GOAL_SECONDS_1M))
    if verdicts:
        print("\ngoals:")
        for what, ok in verdicts:
            print(f"  {what}: {'OK' if ok else 'MISSED'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000], help="QA pairs per run")
    parser.add_argument("--pool-dir", type=Path, default=Path.home() / ".cache" / "rsgen-bench",
                        help="where drawn demo pools are kept between runs")
    parser.add_argument("--keep", type=Path, default=None, help="run in a folder under this one (default: /tmp)")
    parser.add_argument("--keep-work", type=Path, default=None,
                        help="run each size in DIR/qa-SIZE and keep it there (its work, outputs and logs)")
    parser.add_argument("--stage", nargs="+", choices=STAGES, default=None,
                        help="only run these stages, each in a fresh process, on the work kept by an earlier "
                             "--keep-work run of the same sizes (e.g. --stage emit: emit alone, its peak RSS)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results to this file (after each size)")
    parser.add_argument("--table", type=Path, nargs="+", default=None,
                        help="only print the table of results written by --json (one or more files, in size order)")
    args = parser.parse_args()
    if args.table:
        print_table([r for path in args.table for r in json.loads(path.read_text())])
        return
    if args.stage and args.keep_work is None:
        parser.error("--stage needs --keep-work DIR (the work of an earlier run to run the stages on again)")
    args.pool_dir.mkdir(parents=True, exist_ok=True)
    only = tuple(s for s in STAGES if s in args.stage) if args.stage else STAGES
    results = []
    for size in args.sizes:
        results.append(run_size(size, args.pool_dir, args.keep, args.keep_work, only))
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))
    print_table(results)


if __name__ == "__main__":
    main()
