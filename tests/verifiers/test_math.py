"""`math`: math-verify equivalence in a worker process, with a per-item time limit that cannot hang."""

import os
import sys
import threading
import time

import pytest

from rsgen.verifiers import compare, verify_response
from rsgen.verifiers.mathexpr import (
    KILL_GRACE_SECONDS,
    MAX_MATH_CHARS,
    MathWorker,
    MathWorkerError,
    math_worker,
)

# (prediction, reference, match)
EQUIVALENT = [
    ("\\frac{1}{2}", "0.5", True),
    ("1/2", "\\frac{1}{2}", True),
    ("\\dfrac{2}{4}", "\\frac12", True),
    ("0.5", "\\frac{1}{3}", False),
    ("x^2+2x+1", "(x+1)^2", True),
    ("x^2+2x+2", "(x+1)^2", False),
    ("\\frac{\\pi}{2}", "\\pi/2", True),
    ("\\sqrt{8}", "2\\sqrt{2}", True),
    ("\\sqrt{8}", "3\\sqrt{2}", False),
    ("\\frac{\\sqrt{3}}{2}", "\\frac{\\sqrt3}{2}", True),
    ("3", "x=3", True),
    ("x=3", "3", True),
    ("\\{1,2\\}", "\\{2,1\\}", True),
    ("[0,1)", "[0,1)", True),
    ("[0,1]", "[0,1)", False),
    ("\\infty", "\\infty", True),
    ("$\\frac{3}{4}$", "0.75", True),
    ("1,000", "1000", True),  # plain numbers of equal value: no worker needed
    ("1000.0", "1000", True),
    ("10", "1000", False),
    ("\\frac{L}{n}", "\\frac{L}{n-1}", False),  # a near miss: n against n-1
    ("B", "b", True),  # equal after normalisation
    ("hello", "world", False),
    ("3", ["4", "\\frac{6}{2}"], True),
]


@pytest.mark.parametrize("prediction,reference,match", EQUIVALENT, ids=[f"{c[0]}|{c[1]}" for c in EQUIVALENT])
def test_math_equivalence(prediction, reference, match):
    decision = compare("math", prediction, reference)
    assert decision.match is match
    assert decision.reason == (None if match else "wrong_answer")


@pytest.mark.parametrize(
    "response,reference,match",
    [
        ("<think>Let me simplify.</think>The answer is $\\boxed{\\frac{2}{4}}$.", "\\frac{1}{2}", True),
        ("We get \\boxed{x^2 - 1}", "(x-1)(x+1)", True),
        ("Final answer: 0.25", "\\frac14", True),
        ("<think>never closed \\boxed{1/2}", "\\frac12", False),
    ],
)
def test_math_from_raw_responses(response, reference, match):
    assert verify_response("math", response, reference).match is match


def test_a_slow_item_is_a_timeout_not_a_hang():
    start = time.monotonic()
    compare("math", "1", "2")  # the worker is running before the clock matters
    start = time.monotonic()
    decision = compare("math", "(10^{7})!", "5", timeout_seconds=0.5)
    elapsed = time.monotonic() - start
    assert decision.match is False
    assert decision.reason == "math_timeout"
    assert elapsed < 0.5 + KILL_GRACE_SECONDS + 1.0
    # The worker is still usable afterwards.
    assert compare("math", "\\frac{4}{8}", "0.5").match is True


def test_math_works_from_threads():
    """math-verify's own signal-based timeout raises in threads; the worker process makes that a non-issue."""
    results = {}

    def check(i):
        results[i] = (
            compare("math", f"\\frac{{{i}}}{{{2 * i}}}", "0.5"),
            compare("math", "(10^{7})!", "5", timeout_seconds=0.3),
        )

    threads = [threading.Thread(target=check, args=(i,)) for i in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert all(ok.match for ok, _ in results.values())
    assert all(slow.reason == "math_timeout" for _, slow in results.values())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX-only")
def test_a_forked_child_starts_its_own_worker():
    compare("math", "1", "2")
    parent_starts = math_worker().starts
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: must not talk over the parent's pipes
        try:
            ok = compare("math", "\\sqrt{4}", "2").match and math_worker().starts == parent_starts + 1
            os.write(write_end, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    _, status = os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    os.close(read_end)
    assert compare("math", "\\sqrt{9}", "3").match
    assert math_worker().starts == parent_starts


# A stand-in for the worker that says it is ready and then never answers: stuck in C code, as far as the
# parent can tell. It ignores SIGALRM, like work that no signal interrupts.
NEVER_ANSWERS = (
    "import signal, sys, time\n"
    "signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
    'print(\'{"status": "ready"}\', flush=True)\n'
    "sys.stdin.readline()\n"
    "time.sleep(3600)\n"
)


def test_a_worker_that_never_answers_is_killed_within_the_grace_period():
    worker = MathWorker(command=[sys.executable, "-c", NEVER_ANSWERS])
    try:
        start = time.monotonic()
        assert worker.check(["1"], "1", 0.2) == "timeout"
        assert time.monotonic() - start < 0.2 + KILL_GRACE_SECONDS + 2.0  # startup of the stand-in included
        assert worker._proc is None  # killed
        assert worker.check(["1"], "1", 0.2) == "timeout"
        assert worker.starts == 2  # restarted for the next item
    finally:
        worker.close()


def test_a_worker_that_dies_mid_item_is_a_timeout_and_restarts():
    dies = 'print(\'{"status": "ready"}\', flush=True)\nimport sys\nsys.stdin.readline()\nsys.exit(3)\n'
    worker = MathWorker(command=[sys.executable, "-c", dies])
    try:
        assert worker.check(["1"], "1", 5.0) == "timeout"
        assert worker.check(["1"], "1", 5.0) == "timeout"
        assert worker.starts == 2
    finally:
        worker.close()


def test_a_worker_that_cannot_start_is_a_clear_error():
    worker = MathWorker(
        command=[sys.executable, "-c", "import sys; sys.stderr.write('no math here'); sys.exit(1)"]
    )
    with pytest.raises(MathWorkerError, match="no math here"):
        worker.check(["1"], "1", 1.0)


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), "5"])
def test_bad_timeout_is_a_clear_error(timeout):
    with pytest.raises(ValueError, match="timeout_seconds"):
        compare("math", "\\frac12", "\\frac13", timeout_seconds=timeout)


def test_overlong_predictions_are_not_parsed():
    long = "x+" * (MAX_MATH_CHARS // 2) + "1"
    start = time.monotonic()
    assert compare("math", long, "1").reason == "wrong_answer"
    assert compare("math", long, long).match is True  # still equal as text
    assert time.monotonic() - start < 1.0


def test_many_items_never_hang():
    items = [("(10^{7})!", "3"), ("\\frac{1}{2}", "0.5"), ("2^{2^{40}}", "3.5"), ("x+1", "1+x")] * 3
    start = time.monotonic()
    decisions = [compare("math", p, r, timeout_seconds=0.3) for p, r in items]
    assert time.monotonic() - start < len(items) * (0.3 + KILL_GRACE_SECONDS)
    assert [d.reason for d in decisions[:4]] == ["math_timeout", None, "math_timeout", None]
