"""Start `rsgen` the way a user does (directly, or through `accelerate launch` with two CPU processes) and
SIGKILL a whole process tree."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
CPU_2PROC = REPO / "accelerate_configs" / "cpu_2proc.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(args: list[str], processes: int, log: Path) -> subprocess.Popen:
    if processes == 1:
        cmd = [sys.executable, "-m", "rsgen", *args]
    else:
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CPU_2PROC),
               "--num_processes", str(processes), "--main_process_port", str(_free_port()), "-m", "rsgen", *args]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "ab") as fh:
        return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process and everything it started (torchrun puts workers in their own sessions)."""
    try:
        root = psutil.Process(proc.pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(tree, timeout=10)


def run_to_end(args: list[str], processes: int, log: Path, timeout: float = 900) -> None:
    proc = launch(args, processes, log)
    try:
        rc = proc.wait(timeout=timeout)
    finally:
        kill_tree(proc)
    assert rc == 0, log.read_text()[-4000:]
