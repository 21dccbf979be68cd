"""Backfilling in the GPU queue (EASY): who may start ahead of the head, when, and proof on
real lock files that the head never starts later than under strict FIFO.

The decision is taken at an explicit `now`, so the property test replays queues on a
simulated clock while every lock, ticket and holder record is a real file with a real
flock."""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.errors import UsageError, WaitTimeout
from ci.gpu import allocator, lock_gpus
from ci.gpu.allocator import _Ticket, schedule

NUM_GPUS = 0
NOW = 1_000_000.0
INF = float("inf")


def ticket(number: int, *, count: int | None = None, devices: Sequence[int] | None = None,
           expect: float | None = None, backfill: bool = True) -> _Ticket:
    return _Ticket(number=number, count=count, devices=tuple(devices) if devices else None,
                   record={}, expect=expect, backfill=backfill)


# ---------------------------------------------------------------- the decision, in memory


def test_a_short_job_backfills_behind_a_waiting_8_gpu_head_and_says_whom_it_passed():
    # 4 GPUs held until +10 s, 4 free; the head wants 8.
    ends = {g: NOW + 10 for g in range(4, 8)}
    plan = schedule([ticket(1, count=8), ticket(2, count=1, expect=5),
                     ticket(3, count=2, expect=10)], [0, 1, 2, 3], ends, NOW)
    assert (plan.head, plan.reservation) == (1, NOW + 10)
    assert plan.starts == {2: (0,), 3: (1, 2)}
    assert plan.passed == {2: (1,), 3: (1,)}


def test_a_job_expected_to_end_after_the_reservation_and_its_slack_waits():
    ends = {g: NOW + 10 for g in range(4, 8)}
    slack = allocator.BACKFILL_SLACK
    for expect, told, starts in ((10 + slack, None, True), (10 + slack + 0.01, None, False),
                                  (10.01, 0.0, False), (10.0, 0.0, True)):
        plan = schedule([ticket(1, count=8), ticket(2, count=1, expect=expect)], [0, 1, 2, 3],
                        ends, NOW, slack=told)
        assert plan.starts == ({2: (0,)} if starts else {}), (expect, told)


def test_gpus_lent_by_the_head_count_as_ending_now_so_backfills_never_ratchet():
    # GPU 3 is held by a job that backfilled past #1 and may end up to the slack after the
    # reservation (+10.5): #1's reservation stays +10, so the next one gets the same bound.
    ends = {3: NOW + 10.5} | {g: NOW + 10 for g in range(4, 8)}
    queue = [ticket(1, count=8), ticket(2, count=1, expect=11)]
    assert schedule(queue, [0, 1, 2], ends, NOW, lent={3: (1,)}).reservation == NOW + 10
    assert schedule(queue, [0, 1, 2], ends, NOW, lent={3: (1,)}).starts == {}
    # Lent to another (earlier) head: it is an ordinary holder.
    assert schedule(queue, [0, 1, 2], ends, NOW, lent={3: (0,)}).starts == {2: (0,)}


def test_without_an_expectation_or_with_backfill_off_a_job_never_backfills():
    ends = {g: NOW + 100 for g in range(4, 8)}
    plan = schedule([ticket(1, count=8), ticket(2, count=1),
                     ticket(3, count=1, expect=1, backfill=False)], [0, 1, 2, 3], ends, NOW)
    assert plan.starts == {} and plan.head == 1


def test_backfillers_share_only_the_gpus_free_now():
    ends = {g: NOW + 10 for g in range(2, 8)}
    plan = schedule([ticket(1, count=8), *(ticket(n, count=1, expect=1) for n in (2, 3, 4))],
                    [0, 1], ends, NOW)
    assert plan.starts == {2: (0,), 3: (1,)}  # #4 finds nothing left
    assert plan.passed == {2: (1,), 3: (1,)}


def test_a_holder_without_expectation_or_past_it_may_end_any_moment_so_nothing_is_lent():
    for end in (NOW, NOW + 10):  # no expectation / overrun, against a control within it
        ends = {g: NOW + 50 for g in range(4, 7)} | {7: end}
        plan = schedule([ticket(1, count=5), ticket(2, count=1, expect=5)], [0, 1, 2, 3], ends,
                        NOW)
        assert plan.reservation == end
        assert plan.starts == ({} if end == NOW else {2: (0,)})


@pytest.mark.parametrize("expect", [0.01, 0.25, allocator.BACKFILL_SLACK])
def test_a_reservation_of_now_lends_nothing_however_short_the_claim(expect):
    # GPU 7's holder has no expectation: the head may start any moment. Within the slack of
    # "now" every short claim used to pass it, one after another, up to MAX_PASSES times.
    ends = {g: NOW + 50 for g in range(4, 7)} | {7: NOW}
    plan = schedule([ticket(1, count=5), ticket(2, count=1, expect=expect)], [0, 1, 2, 3],
                    ends, NOW)
    assert plan.reservation == NOW and plan.starts == {} and plan.passed == {}
    # Lent GPUs count as ending now: a head waiting only on its own backfillers lends no more.
    plan = schedule([ticket(1, count=5), ticket(2, count=1, expect=expect)], [0, 1, 2, 3],
                    {7: NOW + 1}, NOW, lent={7: (1,)})
    assert plan.reservation == NOW and plan.starts == {}


def test_a_distrusted_ticket_never_backfills_and_starting_now_ends_any_moment():
    ends = {g: NOW + 10 for g in range(4, 8)}
    queue = [ticket(1, count=8), ticket(2, count=1, expect=5), ticket(3, count=1, expect=5)]
    plan = schedule(queue, [0, 1, 2, 3], ends, NOW, distrusted={2})
    assert plan.starts == {3: (0,)} and plan.passed == {3: (1, 2)}  # #2 waits behind the head
    # Starting in its turn, its GPU is planned as freeing up any moment, not in 30 s.
    ends = {g: NOW + g for g in range(1, 8)}
    plan = schedule([ticket(1, count=1, expect=30), ticket(2, count=4)], [0], ends, NOW,
                    distrusted={1})
    assert plan.starts == {1: (0,)} and plan.reservation == NOW + 3


def test_the_reservation_is_when_the_head_count_is_free_and_counts_those_starting_now():
    # GPU 0 free now, #1 takes it for 30 s; GPUs 1-7 end at +1..+7: a 4-GPU head is free at
    # +3 (GPUs 1, 2, 3 and... the 4th earliest is GPU 4 at +4).
    ends = {g: NOW + g for g in range(1, 8)}
    plan = schedule([ticket(1, count=1, expect=30), ticket(2, count=4)], [0], ends, NOW)
    assert plan.starts == {1: (0,)} and plan.head == 2 and plan.reservation == NOW + 4
    # Without #1's expectation its GPU may be free any moment: the 4th earliest is +3.
    plan = schedule([ticket(1, count=1), ticket(2, count=4)], [0], ends, NOW)
    assert plan.reservation == NOW + 3


def test_a_devices_head_reserves_its_own_gpus_and_others_use_the_rest_without_passing():
    ends = {0: NOW + 8, 1: NOW + 3, 2: NOW + 100}
    plan = schedule([ticket(1, devices=[0, 1, 3]), ticket(2, count=1),
                     ticket(3, devices=[3], expect=8), ticket(4, devices=[3], expect=1)],
                    [3, 4], ends, NOW)
    assert plan.head == 1 and plan.reservation == NOW + 8
    assert plan.starts == {2: (4,), 3: (3,)}  # #2 on a GPU the head never needs
    assert plan.passed == {3: (1,)}


def test_a_request_for_more_gpus_than_exist_is_never_reserved():
    assert schedule([ticket(1, count=9)], [0], {}, NOW).reservation == INF
    assert schedule([ticket(1, devices=[0, 9])], [], {0: NOW + 1}, NOW).reservation == INF


def test_a_waiter_passed_max_passes_times_is_not_passed_again():
    ends = {g: NOW + 10 for g in range(4, 8)}
    queue = [ticket(1, count=8), ticket(2, count=8), ticket(3, count=1, expect=1)]
    for passes, starts in (({1: 2, 2: 2}, {3: (0,)}), ({1: 2, 2: 3}, {}), ({1: 3}, {})):
        plan = schedule(queue, [0, 1, 2, 3], ends, NOW, passes, max_passes=3)
        assert plan.starts == starts
    assert schedule(queue, [0], ends, NOW).passed == {3: (1, 2)}  # every waiter it passes


# ---------------------------------------------------------------- real lock files


@pytest.fixture
def pattern(tmp_path: Path) -> str:
    return str(tmp_path / "locks" / "gpu_{gpu_id}.lock")


def lock_fds(pattern: str, gpus: Sequence[int], **record: object) -> tuple[int, ...]:
    """Lock GPUs the way a holder does: an flock on each lock file and its record."""
    fds: list[int] = []
    try:
        for gpu in gpus:
            path = Path(allocator.gpu_path(pattern, gpu))
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            fds.append(fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": "holder", **record,
                                      "gpu": gpu}).encode(), 0)
    except BaseException:
        _close(fds)
        raise
    return tuple(fds)


@contextmanager
def held(pattern: str, gpus: Sequence[int], **record: object) -> Iterator[None]:
    fds = lock_fds(pattern, gpus, **record)
    try:
        yield
    finally:
        _close(fds)


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        os.close(fd)


@contextmanager
def queued(pattern: str, count: int, **record: object) -> Iterator[int]:
    """A live waiter's ticket (created and flocked as `acquire` does); yields its number."""
    req = allocator.make_request(count=count, total_gpus=8)
    number, fd, path = allocator._new_ticket(pattern, req, {"pid": os.getpid(), **record})
    try:
        yield number
    finally:
        allocator._drop_ticket(fd, path)


def test_acquire_backfills_on_real_files_and_counts_the_pass(pattern):
    now = time.time()
    with held(pattern, range(4, 8), since=now, expect=60), queued(pattern, 8) as head:
        with pytest.raises(WaitTimeout):  # no expectation: it waits
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0)
        with allocator.hold(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0,
                            expect=30, command="short") as lease:
            assert lease.devices == (0,)
            st = allocator.read_status(pattern, 8)
            assert st.head == head and st.reservation == pytest.approx(now + 60)
            assert [w.passes for w in st.waiters] == [1]
            mine = st.gpus[0].holder
            assert mine is not None and mine.passed == (head,) and mine.expect == 30
            table = lock_gpus.format_status(st)
            assert f"backfilled past #{head}" in table and "passed 1x by backfilling" in table
            assert "head, reserved from" in table and "expects 30s, 30s left" in table
            got = json.loads(lock_gpus.status_as_json(st))
            assert got["head"] == head and got["waiters"][0]["passes"] == 1
            assert got["gpus"][0]["passed"] == [head] and got["gpus"][0]["expect"] == 30
        with pytest.raises(WaitTimeout):  # past the reservation
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0,
                              expect=61)


def test_pass_counts_are_kept_for_waiters_still_queued_and_dropped_for_those_gone(pattern):
    now = time.time()
    req = allocator.make_request(count=1, total_gpus=8)
    with held(pattern, range(4, 8), since=now, expect=60), queued(pattern, 8) as head, \
            queued(pattern, 1, expect=5) as small, queued(pattern, 8) as later:
        with queued(pattern, 8) as gone:
            pass
        with allocator._queue_locked(pattern) as qfd:
            allocator._write_passes(qfd, {gone: 2, later: 3})
            got = allocator._try_take(pattern, req, small, {"ticket": small, "expect": 5})
            assert got is not None
            # It passed the head; `later` (behind it) keeps its count; `gone` left the queue.
            assert allocator._read_passes(qfd) == {head: 1, later: 3}
        allocator.release(allocator.Lease(devices=got[0], fds=got[1], paths=(), pattern=pattern,
                                          ticket=small))


def test_strict_fifo_by_argument_or_environment(pattern, monkeypatch):
    now = time.time()
    with held(pattern, range(4, 8), since=now, expect=60), queued(pattern, 8):
        with pytest.raises(WaitTimeout):
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0,
                              expect=1, backfill=False)
        monkeypatch.setenv(allocator.NO_BACKFILL_ENV, "1")
        with pytest.raises(WaitTimeout):
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0,
                              expect=1)
        monkeypatch.setenv(allocator.NO_BACKFILL_ENV, "0")
        allocator.release(allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern,
                                            timeout=0, expect=1))
    assert [allocator.backfill_default() for v in ("", "no", "yes", "true")
            if not monkeypatch.setenv(allocator.NO_BACKFILL_ENV, v)] == [True, True, False, False]


def test_an_overrunning_holder_stops_backfilling_and_shows_in_gpu_status(pattern):
    now = time.time()
    with held(pattern, [7], since=now - 100, expect=10, command="late job"), \
            held(pattern, range(4, 7), since=now, expect=60), queued(pattern, 5):
        # 4 GPUs free: the 5th the head needs is GPU 7's, which may free up any moment.
        with pytest.raises(WaitTimeout):
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, timeout=0,
                              expect=1)
        st = allocator.read_status(pattern, 8)
        assert st.reservation == pytest.approx(st.now)
        table = lock_gpus.format_status(st)
        assert "GPU 7 (pid" in table and "expects 10s, OVERRUN by 90s" in table
        assert "reserved now: its GPUs may free up any moment" in table
        got = json.loads(lock_gpus.status_as_json(st))
        assert got["gpus"][7]["overrun"] == pytest.approx(90, abs=5)
        assert got["gpus"][4]["overrun"] is None


def test_expect_must_be_a_positive_finite_number(pattern):
    for bad in (0.0, -1.0, float("nan"), INF):
        with pytest.raises(UsageError, match="--expect"):
            allocator.acquire(count=1, total_gpus=8, lock_path_pattern=pattern, expect=bad)
    for text in ("0", "nan", "inf"):
        res = subprocess.run([sys.executable, "-m", "ci", "lock-gpus", "--lock-path-pattern",
                              pattern, "--total-gpus", "8", "--count", "1", "--expect", text,
                              "--", "true"], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 2 and "--expect" in res.stderr, res.stderr


def test_lock_gpus_backfills_with_expect_and_not_with_no_backfill(pattern):
    now = time.time()
    with held(pattern, range(4, 8), since=now, expect=120), queued(pattern, 8):
        base = [sys.executable, "-m", "ci", "lock-gpus", "--lock-path-pattern", pattern,
                "--total-gpus", "8", "--count", "1", "--timeout", "0", "--expect", "5"]
        res = subprocess.run([*base, "--", sys.executable, "-c",
                              "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0 and res.stdout.strip() == "0", res.stderr
        res = subprocess.run([*base, "--no-backfill", "--", "true"], cwd=REPO,
                             capture_output=True, text=True, timeout=60)
        assert res.returncode == 124 and "timed out" in res.stderr, res.stderr


# ---------------------------------------------------------------- the property


@dataclass(frozen=True)
class Job:
    gpus: int
    expect: float | None
    actual: float
    backfill: bool = True


@st.composite
def queues(draw: st.DrawFn) -> tuple[list[Job], list[Job]]:
    """Holders at time 0 (some without expectation, some overrunning) and a queue behind them.

    A waiter with an expectation runs exactly that long (honest); one without runs any time.
    Holders may run past their expectation (the head must not be hurt by that either).
    """
    times = st.integers(4, 80).map(lambda q: q / 4)  # quarter seconds: finer than the slack
    holders, used = [], 0
    for _ in range(draw(st.integers(0, 4))):
        size = draw(st.integers(1, 4))
        if used + size > 8:
            break
        used += size
        expect = draw(st.none() | times)
        late = draw(st.integers(0, 40).map(lambda q: q / 4))
        actual = (expect + late) if expect is not None else draw(times)
        holders.append(Job(size, expect, actual))
    waiters = []
    for _ in range(draw(st.integers(1, 5))):
        expect = draw(st.none() | times)
        waiters.append(Job(draw(st.sampled_from([1, 1, 2, 4, 8])), expect,
                           expect if expect is not None else draw(times),
                           backfill=draw(st.booleans())))
    return holders, waiters


def head_start(directory: str, holders: Sequence[Job], waiters: Sequence[Job],
               backfill: bool) -> float:
    """Replay the queue on real lock files with a simulated clock: when the head starts (the
    first waiter that cannot start at time 0; 0 if every waiter can).

    Every waiter looks once per event (time 0 and each release) in ticket order, as the
    real waiters do when the generation moves: one pass in ticket order is a fixed point,
    since a waiter's decision depends only on earlier tickets. Between events nothing can
    start: the reservation never grows faster than the clock.
    """
    pattern = os.path.join(directory, "gpu_{gpu_id}.lock")
    running: list[tuple[float, tuple[int, ...]]] = []
    queue: list[tuple[int, int, str, allocator.Request, Job, dict[str, object]]] = []
    try:
        first = 0
        for job in holders:
            fds = lock_fds(pattern, range(first, first + job.gpus), since=NOW, expect=job.expect)
            first += job.gpus
            running.append((NOW + job.actual, fds))
        for job in waiters:
            req = allocator.make_request(count=job.gpus, total_gpus=8)
            record: dict[str, object] = {"pid": os.getpid(), "expect": job.expect,
                                         "backfill": backfill and job.backfill}
            number, fd, path = allocator._new_ticket(pattern, req, record)
            queue.append((number, fd, path, req, job, record))
        head: int | None = None
        now = NOW
        while True:
            for item in list(queue):
                number, fd, path, req, job, record = item
                with allocator._queue_locked(pattern):
                    got = allocator._try_take(pattern, req, number, dict(record, ticket=number),
                                              now=now)
                if got is None:
                    head = number if head is None else head
                    continue
                allocator._drop_ticket(fd, path)
                queue.remove(item)
                running.append((now + job.actual, got[1]))
                if number == head:
                    return now - NOW
            if head is None:
                return 0.0
            now = min(end for end, _ in running)
            for end, fds in [r for r in running if r[0] == now]:
                _close(fds)
                running.remove((end, fds))
    finally:
        for _, fds in running:
            _close(fds)
        for _number, fd, path, *_ in queue:
            allocator._drop_ticket(fd, path)


@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(queues())
# Queues that a head-delaying mistake fails every time, whatever the random ones do: a
# backfill past the reservation; a holder without expectation, or past it, taken to hold
# forever; a backfiller's end moving the reservation it was admitted against.
@example(([Job(4, 5, 5)], [Job(8, None, 3), Job(1, 20, 20)]))
@example(([Job(4, 4, 4)], [Job(8, None, 1), Job(1, 4.25, 4.25), Job(1, 4.75, 4.75)]))
@example(([Job(4, None, 3)], [Job(8, None, 1), Job(1, 10, 10)]))
@example(([Job(4, 2, 6), Job(2, 3, 3)], [Job(8, None, 1), Job(1, 4, 4)]))
# Holders without expectations, and honest half-second claims: each passed the head within
# the slack of "now", and together they held it from +5.75 s to +6.75 s.
@example(([Job(2, None, 5.5), Job(4, None, 5.75), Job(2, None, 5.75)],
          [Job(8, None, 1), *(Job(1, 0.5, 0.5) for _ in range(30))]))
def test_the_head_never_starts_later_than_under_strict_fifo(scenario):
    # ... than by the slack a backfiller may overstay its reservation by: times here are in
    # quarter seconds, so backfillers do end inside that slack.
    holders, waiters = scenario
    with tempfile.TemporaryDirectory() as fifo_dir, tempfile.TemporaryDirectory() as bf_dir:
        fifo = head_start(fifo_dir, holders, waiters, backfill=False)
        easy = head_start(bf_dir, holders, waiters, backfill=True)
    assert easy <= fifo + allocator.BACKFILL_SLACK, (easy, fifo)


def test_a_waiter_deciding_just_after_a_start_ties_with_it(pattern):
    # Holders started 0.2 s ago expecting 10 s, and a 1-GPU job of 10 s deciding now: it
    # ends 0.2 s after them, inside the slack, so it backfills; 1 s after, it would not.
    for ago, starts in ((0.2, True), (allocator.BACKFILL_SLACK + 0.5, False)):
        with held(pattern, range(4, 8), since=time.time() - ago, expect=10), queued(pattern, 8):
            try:
                allocator.release(allocator.acquire(count=1, total_gpus=8, timeout=0,
                                                    lock_path_pattern=pattern, expect=10))
            except WaitTimeout:
                assert not starts
            else:
                assert starts


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
