"""A command that overruns its expectation again and again loses backfilling: the book of
overruns as pure functions, then on real lock files (holders that release late, or are
never released, and a waiter of the same command that then waits its turn)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.errors import WaitTimeout
from ci.gpu import allocator, lock_gpus, overruns
from ci.gpu.tickets import _queue_locked, _read_overruns, _read_passes, _write_passes

NUM_GPUS = 0
# A request here that waited would wait for a day: each names a timeout, and this bounds all.
pytestmark = pytest.mark.timeout(120)
SLOW = "python tests/e2e/test_slow.py"


# ---------------------------------------------------------------- the book, in memory


def test_two_overruns_in_a_row_distrust_a_command_and_one_on_time_forgives_it():
    book = overruns.noted({}, SLOW, 3)
    assert overruns.trusted(book, SLOW)  # once is an estimate that was off
    assert overruns.noted(book, SLOW, 3) == book  # the same holding counts once
    book = overruns.noted(book, SLOW, 7)
    assert not overruns.trusted(book, SLOW) and overruns.distrusted(book) == {SLOW}
    assert overruns.trusted(book, "python other.py")
    assert overruns.trusted(overruns.forgiven(book, SLOW), SLOW)
    assert overruns.noted({}, "", 1) == {}  # no command: nobody to hold it against


@settings(max_examples=200, deadline=None, database=None)
@given(st.lists(st.tuples(st.sampled_from(["forgive", "note"]), st.text(max_size=700),
                          st.integers(0, 10**12)), max_size=200))
def test_the_book_stays_bounded_whatever_is_noted(events):
    book: dict[str, tuple[int, ...]] = {}
    for what, command, number in events:
        book = (overruns.noted(book, command, number) if what == "note"
                else overruns.forgiven(book, command))
        assert len(book) <= overruns.TRACKED
        assert all(len(k) <= overruns.KEY_LIMIT and 0 < len(v) <= overruns.OVERRUN_LIMIT
                   for k, v in book.items())
        if what == "forgive":
            assert overruns.trusted(book, command)
    # Whatever the book became, the queue file keeps it, next to the pass counts.
    assert overruns.distrusted(book) <= set(book)


# ---------------------------------------------------------------- real lock files


@pytest.fixture
def pattern(tmp_path: Path) -> str:
    return str(tmp_path / "locks" / "gpu_{gpu_id}.lock")


@contextmanager
def head_waiting(pattern: str, now: float) -> Iterator[int]:
    """GPUs 2,3 held until +60 s by a job that planned honestly; a 4-GPU head queued behind."""
    inner = allocator.acquire(devices=[2, 3], total_gpus=4, lock_path_pattern=pattern,
                              command="python honest.py", expect=60, timeout=10)
    req = allocator.make_request(count=4, total_gpus=4)
    number, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid(), "since": now})
    try:
        yield number
    finally:
        allocator._drop_ticket(fd, path)
        allocator.release(inner)


def overrun_once(pattern: str, command: str = SLOW) -> None:
    """Hold a GPU for longer than the expectation given, then release."""
    lease = allocator.acquire(count=1, total_gpus=4, lock_path_pattern=pattern, command=command,
                              expect=0.05, timeout=10)
    time.sleep(0.12)
    allocator.release(lease)


def backfills(pattern: str, command: str) -> bool:
    try:
        lease = allocator.acquire(count=1, total_gpus=4, lock_path_pattern=pattern, timeout=0,
                                  command=command, expect=5)
    except WaitTimeout:
        return False
    allocator.release(lease)
    return True


def test_a_command_that_overran_twice_waits_its_turn_until_it_ends_in_time(pattern):
    overrun_once(pattern)
    with head_waiting(pattern, time.time()):
        assert backfills(pattern, SLOW)  # one overrun: still trusted (and this one was on time)
    overrun_once(pattern)
    overrun_once(pattern)
    with head_waiting(pattern, time.time()) as head:
        assert not backfills(pattern, SLOW)
        assert backfills(pattern, "python tests/e2e/test_other.py")  # others still may
        # The waiter shows why it waits, in the table and the JSON.
        req = allocator.make_request(count=1, total_gpus=4)
        _, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid(), "command": SLOW,
                                                           "expect": 5})
        try:
            st = allocator.read_status(pattern, 4)
            table = lock_gpus.format_status(st)
            got = json.loads(lock_gpus.status_as_json(st))
        finally:
            allocator._drop_ticket(fd, path)
        assert "no backfilling: its command overran its last expectations" in table
        assert got["distrusted"] == [SLOW]
        assert [w["trusted"] for w in got["waiters"]] == [True, False]
        assert got["head"] == head
    # In its turn it runs, ends within its expectation, and is trusted again.
    allocator.release(allocator.acquire(count=1, total_gpus=4, lock_path_pattern=pattern,
                                        command=SLOW, expect=60, timeout=10))
    with head_waiting(pattern, time.time()):
        assert backfills(pattern, SLOW)


def test_a_holder_never_released_is_counted_by_whoever_looks(pattern):
    # Holders killed with SIGKILL never reach release(): the waiters' decisions count them.
    @contextmanager
    def late_holder(number: int) -> Iterator[None]:
        record = {"pid": os.getpid(), "command": SLOW, "since": time.time() - 100, "expect": 10,
                  "ticket": number}
        code = (f"import fcntl, json, os, sys\nfd = os.open({allocator.gpu_path(pattern, 1)!r}, "
                "os.O_RDWR)\nfcntl.flock(fd, fcntl.LOCK_EX)\nos.ftruncate(fd, 0)\n"
                f"os.pwrite(fd, json.dumps({record!r}).encode(), 0)\nprint('held', flush=True)\n"
                "sys.stdin.read()\n")
        with subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) as proc:
            try:
                assert proc.stdout is not None and proc.stdout.readline() == "held\n"
                yield
            finally:
                proc.kill()

    allocator.check_files(pattern, 4)
    for number in (900, 901):
        with late_holder(number):
            allocator.release(allocator.acquire(count=1, total_gpus=4, lock_path_pattern=pattern,
                                                timeout=10))
    with _queue_locked(pattern) as qfd:
        assert _read_overruns(qfd) == {SLOW: (900, 901)}
        # The pass counts beside the book are kept when either is written.
        _write_passes(qfd, {5: 2})
        assert _read_overruns(qfd) == {SLOW: (900, 901)} and _read_passes(qfd) == {5: 2}
    with head_waiting(pattern, time.time()):
        assert not backfills(pattern, SLOW)


def test_a_distrusted_holder_counts_as_ending_any_moment(pattern):
    overrun_once(pattern)
    overrun_once(pattern)
    # It says 60 s; the head's reservation is now all the same, so nobody is lent its GPUs.
    req = allocator.make_request(count=4, total_gpus=4)
    with allocator.hold(devices=[3], total_gpus=4, lock_path_pattern=pattern, command=SLOW,
                        expect=60, timeout=10):
        number, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid()})
        try:
            st = allocator.read_status(pattern, 4)
            assert st.head == number and st.reservation == pytest.approx(st.now)
            assert "counted as ending any moment" in lock_gpus.format_status(st)
            assert not backfills(pattern, "python tests/e2e/test_other.py")
        finally:
            allocator._drop_ticket(fd, path)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
