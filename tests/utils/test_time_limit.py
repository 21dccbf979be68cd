"""A wall-clock limit that interrupts work in the main thread and abandons it elsewhere."""

import signal
import sys
import threading
import time

import pytest

from slime.rollout.rm_hub.time_limit import TimeLimitExceeded, call_with_time_limit

NUM_GPUS = 0


def _spin(seconds):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass
    return "done"


def test_fast_call_returns_its_value():
    assert call_with_time_limit(lambda a, b: a + b, 1.0, 2, 3) == 5


def test_slow_call_is_interrupted_in_the_main_thread():
    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(_spin, 0.2, 10)
    assert time.monotonic() - start < 2


def test_timer_and_handler_are_restored():
    before = signal.getsignal(signal.SIGALRM)
    call_with_time_limit(lambda: None, 0.5)
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(_spin, 0.1, 5)
    assert signal.getsignal(signal.SIGALRM) is before
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)


def test_an_outer_timer_is_left_armed():
    fired = []
    previous = signal.signal(signal.SIGALRM, lambda *_: fired.append(True))
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(TimeLimitExceeded):
            call_with_time_limit(_spin, 0.1, 0.3)
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
        assert 0 < remaining < 0.5
        _spin(remaining + 0.05)
        assert fired == [True]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def test_code_that_catches_every_exception_is_still_interrupted():
    def stubborn():
        end = time.monotonic() + 5
        while time.monotonic() < end:
            try:
                _spin(0.01)
            except Exception:  # as some libraries do around their inner loops
                continue
        return "finished"

    start = time.monotonic()
    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(stubborn, 0.2)
    assert time.monotonic() - start < 3


def test_exceptions_pass_through():
    def boom():
        raise KeyError("x")

    with pytest.raises(KeyError):
        call_with_time_limit(boom, 1.0)


def test_works_off_the_main_thread():
    box = {}

    def run():
        try:
            call_with_time_limit(_spin, 0.1, 0.3)
        except TimeLimitExceeded:
            box["timed_out"] = True
        box["value"] = call_with_time_limit(lambda: 7, 1.0)
        try:
            call_with_time_limit(lambda: 1 / 0, 1.0)
        except ZeroDivisionError:
            box["raised"] = True

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert box == {"timed_out": True, "value": 7, "raised": True}


def test_work_in_the_main_thread_is_stopped_not_abandoned():
    done = []

    def slow():
        _spin(0.5)
        done.append(True)

    with pytest.raises(TimeLimitExceeded):
        call_with_time_limit(slow, 0.1)
    time.sleep(0.8)  # an abandoned call would have finished by now
    assert done == []


def test_an_abandoned_worker_never_keeps_the_process_alive():
    box = {}

    def run():
        before = set(threading.enumerate())
        try:
            call_with_time_limit(_spin, 0.05, 0.5)
        except TimeLimitExceeded:
            box["left"] = [t.daemon for t in threading.enumerate() if t not in before]

    t = threading.Thread(target=run)
    t.start()
    t.join(10)
    assert box == {"left": [True]}  # still running, and a daemon: exit does not wait for it


def test_nonpositive_limit():
    with pytest.raises(ValueError, match="positive"):
        call_with_time_limit(lambda: None, 0)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
