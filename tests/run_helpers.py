"""What the end-to-end tests that drive `rsgen` as a subprocess share: the launcher (one process, or an
`accelerate launch` of several), waiting for it, and a run's dataset rows in a form two runs can be compared by.

Imported as `from run_helpers import ...` (tests/ is on sys.path through its conftest.py, as for card_figures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def launch(cmd: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:
    """Start `cmd` with stdout and stderr in one text pipe, in a new session so that a SIGKILL of its process group
    reaches every process of the run (torchrun's children included). `env` is added to os.environ."""
    return subprocess.Popen(cmd, cwd=cwd, env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def rsgen(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None, processes: int = 1,
          port: int = 29631) -> subprocess.Popen:
    """`python -m rsgen ARGS`, or with `processes` > 1 the same under `accelerate launch` (CPU, main process on
    `port`)."""
    if processes == 1:
        return launch([sys.executable, "-m", "rsgen", *args], env=env, cwd=cwd)
    return launch([str(BIN / "accelerate"), "launch", "--config_file", str(ROOT / "accelerate_configs/cpu_2proc.yaml"),
                   "--num_processes", str(processes), "--main_process_port", str(port), "-m", "rsgen", *args],
                  env=env, cwd=cwd)


def finish(proc: subprocess.Popen, code: int = 0, timeout: float = 600) -> str:
    """Wait for `proc`; its output, after asserting it exited with `code` (the output's tail in the message)."""
    out, _ = proc.communicate(timeout=timeout)
    assert proc.returncode == code, out[-4000:]
    return out


def parquet_rows(shards) -> list[str]:
    """The rows of the parquet files `shards` as canonical JSON (bytes as hex), sorted (order aside)."""
    rows = []
    for shard in shards:
        rows += [json.dumps(r, sort_keys=True, default=lambda b: b.hex()) for r in pq.read_table(shard).to_pylist()]
    return sorted(rows)


def dataset_rows(output_dir: Path) -> dict[str, list[str]]:
    """A run's dataset: config -> its rows as canonical JSON, sorted (order aside)."""
    return {config_dir.name: parquet_rows(sorted(config_dir.glob("*.parquet")))
            for config_dir in sorted((output_dir / "dataset" / "data").iterdir())}
