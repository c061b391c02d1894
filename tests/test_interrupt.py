"""SIGTERM/SIGINT as an exception: raised once, held back during writes that must not be cut, handlers restored."""

import os
import signal
import time

import pytest

from rsgen.interrupt import Interrupted, deferred, interruptible


def wait_for_signal(seconds: float = 5.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the handler runs between bytecodes, within the loop
        time.sleep(0.001)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_raises_interrupted_and_handlers_are_restored(signum):
    before = signal.getsignal(signum)
    with pytest.raises(Interrupted) as err, interruptible():
        os.kill(os.getpid(), signum)
        wait_for_signal()
    assert err.value.signum == signum and "rerun the same command" in str(err.value)
    assert signal.getsignal(signum) is before


def test_a_signal_inside_deferred_is_raised_when_it_ends():
    steps = []
    with pytest.raises(Interrupted), interruptible():
        with deferred():
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for_signal(0.2)
            steps.append("write finished")
        steps.append("after the write")  # not reached
    assert steps == ["write finished"]


def test_a_second_signal_does_not_cut_the_cleanup_of_the_first():
    """Under torchrun a worker gets SIGTERM twice (Slurm's, then the launcher's): the flush the first started ends."""
    cleaned = []
    with pytest.raises(Interrupted), interruptible():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for_signal()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)
            wait_for_signal(0.2)
            cleaned.append(True)
    assert cleaned == [True]

