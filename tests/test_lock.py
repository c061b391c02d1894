"""The output_dir lock: a live holder refuses a second run (named, exit code 2), a dead one is taken over with a
warning, a holder on another host counts as alive until its heartbeat is old, and racing processes get exactly
one lock."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rsgen.cli import main
from rsgen.lock import (
    LOCK_NAME,
    STALE_SECONDS,
    OutputDirBusy,
    OutputDirLock,
    OutputDirUnwritable,
    locked_output_dir,
)
from rsgen.pipeline import check_output_dir

ROOT = Path(__file__).resolve().parents[1]


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def write_lock(output_dir: Path, age_seconds: float = 0.0, **holder) -> Path:
    path = output_dir / LOCK_NAME
    output_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "started_at": "2026-01-02T03:04:05+00:00",
                                **holder}) + "\n")
    if age_seconds:
        then = time.time() - age_seconds
        os.utime(path, (then, then))
    return path


def test_second_lock_is_refused_naming_the_holder(tmp_path):
    first = OutputDirLock(tmp_path)
    first.acquire()
    with pytest.raises(OutputDirBusy) as err:
        OutputDirLock(tmp_path).acquire()
    message = str(err.value)
    assert f"host {socket.gethostname()}" in message and f"pid {os.getpid()}" in message
    assert first.holder["started_at"] in message and str(tmp_path / LOCK_NAME) in message
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    with locked_output_dir(tmp_path):  # free again
        assert (tmp_path / LOCK_NAME).exists()
    assert not (tmp_path / LOCK_NAME).exists()


def test_lock_of_a_dead_process_on_this_host_is_taken_over_with_a_warning(tmp_path, caplog):
    pid = dead_pid()
    write_lock(tmp_path, pid=pid)
    with caplog.at_level("WARNING"), locked_output_dir(tmp_path):
        holder = json.loads((tmp_path / LOCK_NAME).read_text())
    assert holder["pid"] == os.getpid()
    assert f"pid {pid}" in caplog.text and "is gone" in caplog.text


def test_a_recycled_pid_does_not_keep_a_lock(tmp_path):
    """The lock names our own (live) pid, but a process that started at another time held it."""
    write_lock(tmp_path, pid=os.getpid(), process_start="1")
    with locked_output_dir(tmp_path):
        pass


def test_holder_on_another_host_is_alive_until_its_heartbeat_is_old(tmp_path, caplog):
    write_lock(tmp_path, host="node-17", pid=4242)
    with pytest.raises(OutputDirBusy, match="host node-17, pid 4242, started 2026-01-02T03:04:05"):
        OutputDirLock(tmp_path).acquire()
    write_lock(tmp_path, age_seconds=STALE_SECONDS + 60, host="node-17", pid=4242)
    with caplog.at_level("WARNING"), locked_output_dir(tmp_path):
        pass
    assert "node-17" in caplog.text and "no heartbeat" in caplog.text


def test_heartbeat_keeps_the_lock_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr("rsgen.lock.HEARTBEAT_SECONDS", 0.05)
    lock = OutputDirLock(tmp_path)
    lock.acquire()
    then = time.time() - 1000
    os.utime(tmp_path / LOCK_NAME, (then, then))
    time.sleep(0.5)
    assert time.time() - (tmp_path / LOCK_NAME).stat().st_mtime < 5
    lock.release()


def test_unreadable_lock_counts_as_held_until_old(tmp_path):
    (tmp_path / LOCK_NAME).write_text("")  # a holder that died between creating and writing it
    with pytest.raises(OutputDirBusy, match="unreadable"):
        OutputDirLock(tmp_path).acquire()
    then = time.time() - 3600
    os.utime(tmp_path / LOCK_NAME, (then, then))
    with locked_output_dir(tmp_path):
        pass


def test_release_leaves_a_lock_that_is_not_ours(tmp_path):
    lock = OutputDirLock(tmp_path)
    lock.acquire()
    write_lock(tmp_path, host="node-2", pid=7)  # e.g. taken over after our heartbeat stopped
    lock.release()
    assert "node-2" in (tmp_path / LOCK_NAME).read_text()


RACER = """
import sys, time
from rsgen.lock import OutputDirBusy, OutputDirLock
lock = OutputDirLock(sys.argv[1])
while time.time() < float(sys.argv[2]):
    pass
try:
    lock.acquire()
except OutputDirBusy:
    print("busy")
else:
    print("won")
    time.sleep(2)
    lock.release()
"""


@pytest.mark.slow
def test_racing_processes_get_one_lock(tmp_path):
    start = time.time() + 3
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(tmp_path), str(start)], env=env,
                              stdout=subprocess.PIPE, text=True) for _ in range(3)]
    outcomes = sorted(p.communicate(timeout=60)[0].strip() for p in procs)
    assert outcomes == ["busy", "busy", "won"]


@pytest.mark.slow
def test_cli_on_a_busy_output_dir_exits_2_at_once(tmp_path):
    out = tmp_path / "out"
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"output_dir: {out}\nsources: [{{dataset_name: rsgen-demo, family: Demo}}]\n")
    lock = OutputDirLock(out)
    lock.acquire()
    try:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "rsgen", "prepare", "--config", str(recipe)], cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
        seconds = time.perf_counter() - start
    finally:
        lock.release()
    assert proc.returncode == 2, proc.stderr
    assert f"pid {os.getpid()}" in proc.stderr and "in use by another rsgen run" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert seconds < 60
    assert list(out.iterdir()) == []  # refused before any work (our lock released above)


def test_lock_of_a_finished_but_unreaped_process_is_taken_over(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    while Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        time.sleep(0.01)  # exited, not yet reaped (a zombie): its pid still answers kill(pid, 0)
    write_lock(tmp_path, pid=proc.pid)
    with locked_output_dir(tmp_path):
        pass
    proc.wait()


# An output_dir nothing can be made in, even by root (os.access says yes to root there): /proc and /sys.
UNMAKEABLE = ["/proc/rsgen-out", "/sys/rsgen-out/sub"]


@pytest.mark.parametrize("output_dir", UNMAKEABLE)
def test_the_lock_in_a_folder_that_cannot_be_made_is_one_line(output_dir):
    with pytest.raises(OutputDirUnwritable) as err:
        OutputDirLock(output_dir).acquire()
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"output_dir {str(Path(output_dir))!r} cannot be written (")
    assert "set output_dir to a folder you can write" in message


@pytest.mark.parametrize("output_dir", UNMAKEABLE)
def test_the_check_before_work_tries_rather_than_asks(output_dir):
    with pytest.raises(OutputDirUnwritable, match=r"cannot be written \((No such file or directory|Operation not "
                                                   r"permitted|Permission denied|Read-only file system)"):
        check_output_dir(output_dir)


def test_the_check_leaves_nothing_behind(tmp_path):
    check_output_dir(str(tmp_path / "new" / "out"))
    check_output_dir(str(tmp_path))
    assert list(tmp_path.iterdir()) == []


def test_rsgen_demo_on_proc_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--output-dir", "/proc/x", "--num-images", "2"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert err.splitlines() == [
        "rsgen: error: output_dir '/proc/x' cannot be written (No such file or directory creating a folder in "
        "'/proc'); set output_dir to a folder you can write, or fix its permissions"], err
    assert list(tmp_path.iterdir()) == []
