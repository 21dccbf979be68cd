"""The allocator's API (ci.gpu.allocator) as the runner uses it: many threads of one process."""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ci.errors import UsageError, WaitTimeout
from ci.gpu import allocator
from ci.gpu.allocator import Lease, hold

NUM_GPUS = 0


@pytest.fixture
def pattern(tmp_path: Path) -> str:
    return str(tmp_path / "locks" / "gpu_{gpu_id}.lock")


def _held_elsewhere(pattern: str, gpu: int) -> bool:
    """True when another open file description cannot take GPU `gpu`'s lock."""
    fd = os.open(allocator.gpu_path(pattern, gpu), os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "--count N or --devices"),
    ({"count": 1, "devices": (0,)}, "not both"),
    ({"count": 0}, "at least 1"),
    ({"count": -2}, "at least 1"),
    ({"count": 5}, "more than the 4 GPU"),
    ({"devices": (0, 4)}, "GPU 4 does not exist"),
    ({"devices": (-1,)}, "GPU -1 does not exist"),
    ({"devices": (1, 2, 1)}, "GPU 1 is listed twice"),
    ({"devices": ()}, "empty"),
    ({"count": 1, "timeout": -1.0}, "--timeout"),
])
def test_impossible_requests_fail_at_once(pattern: str, kwargs: dict[str, object],
                                          message: str) -> None:
    started = time.monotonic()
    with pytest.raises(UsageError, match=message), hold(total_gpus=4, lock_path_pattern=pattern,
                                                        **kwargs):  # type: ignore[arg-type]
        pass
    assert time.monotonic() - started < 1.0
    # Nothing queued behind: a failed request leaves no ticket that would block others.
    assert allocator.read_status(pattern, 4).waiters == ()


@pytest.mark.parametrize("bad", ["/tmp/no_field.lock", "/tmp/{gpu}.lock", "/tmp/{gpu_id}{x}.lock"])
def test_pattern_must_name_one_file_per_gpu(bad: str) -> None:
    with pytest.raises(UsageError, match="lock-path-pattern"), hold(
            count=1, total_gpus=2, lock_path_pattern=bad):
        pass


def test_total_gpus_must_be_positive(pattern: str) -> None:
    with pytest.raises(UsageError, match="total-gpus"), hold(
            count=1, total_gpus=0, lock_path_pattern=pattern):
        pass


def test_lease_holds_real_locks_and_records_the_holder(pattern: str) -> None:
    with hold(devices=(3, 1), total_gpus=4, lock_path_pattern=pattern,
              command="python tests/e2e/test_x.py") as lease:
        assert lease.devices == (1, 3)
        assert len(lease.fds) == 2
        assert _held_elsewhere(pattern, 1) and _held_elsewhere(pattern, 3)
        assert not _held_elsewhere(pattern, 0)
        st = allocator.read_status(pattern, 4)
        held = {g.gpu: g.holder for g in st.gpus if g.holder is not None}
        assert set(held) == {1, 3}
        assert held[1] is not None and held[1].pid == os.getpid()
        assert held[1].command == "python tests/e2e/test_x.py"
        assert held[1].since is not None and abs(held[1].since - time.time()) < 60
    assert not _held_elsewhere(pattern, 1)
    # The record is still in the file, but its lock is free: it must read as free.
    assert all(g.holder is None for g in allocator.read_status(pattern, 4).gpus)


def test_stale_record_of_a_dead_holder_reads_as_free(pattern: str) -> None:
    path = Path(allocator.gpu_path(pattern, 0))
    path.parent.mkdir(parents=True)
    path.write_text('{"pid": 999999, "command": "gone", "since": 1.0}\n')
    st = allocator.read_status(pattern, 2)
    assert st.gpus[0].holder is None
    with hold(count=2, total_gpus=2, lock_path_pattern=pattern, timeout=2.0) as lease:
        assert lease.devices == (0, 1)


def test_count_takes_lowest_free_gpus_all_at_once(pattern: str) -> None:
    with hold(devices=(0, 2), total_gpus=4, lock_path_pattern=pattern) as first:
        assert first.devices == (0, 2)
        with hold(count=2, total_gpus=4, lock_path_pattern=pattern, timeout=2.0) as second:
            assert second.devices == (1, 3)
        # Only one GPU left free of four: a request for two must wait, holding nothing.
        with hold(devices=(1,), total_gpus=4, lock_path_pattern=pattern):
            with pytest.raises(WaitTimeout), hold(count=2, total_gpus=4,
                                                   lock_path_pattern=pattern, timeout=0.2):
                pass
            assert not _held_elsewhere(pattern, 3)  # not kept while waiting


def test_timeout_names_the_holders(pattern: str) -> None:
    with hold(count=2, total_gpus=2, lock_path_pattern=pattern, command="python long_job.py"):
        started = time.monotonic()
        with pytest.raises(WaitTimeout) as info, hold(
                devices=(1,), total_gpus=2, lock_path_pattern=pattern, timeout=0.3):
            pass
        waited = time.monotonic() - started
    text = str(info.value)
    assert info.value.exit_code == 124
    assert "GPU 1 is held by pid" in text and str(os.getpid()) in text
    assert "python long_job.py" in text and "since" in text
    assert "GPU 0" not in text  # only the GPUs the request waited for
    assert 0.3 <= waited < 2.0
    assert allocator.read_status(pattern, 2).waiters == ()


def test_threads_never_share_a_gpu_and_never_deadlock(pattern: str) -> None:
    """Overlapping device lists in every order, counts too, from 12 threads of one process."""
    total = 4
    busy: dict[int, int] = {}
    guard = threading.Lock()
    errors: list[str] = []
    done: list[tuple[int, ...]] = []
    rng = random.Random(7)
    plans = []
    for i in range(12):
        if i % 3 == 0:
            plans.append({"count": rng.randint(1, total)})
        else:
            devs = rng.sample(range(total), rng.randint(1, 3))
            plans.append({"devices": tuple(devs)})

    def worker(plan: dict[str, object]) -> None:
        try:
            with hold(total_gpus=total, lock_path_pattern=pattern, timeout=20.0,
                      **plan) as lease:  # type: ignore[arg-type]
                with guard:
                    for d in lease.devices:
                        if busy.get(d):
                            errors.append(f"GPU {d} double-booked")
                        busy[d] = busy.get(d, 0) + 1
                time.sleep(0.03)
                with guard:
                    for d in lease.devices:
                        busy[d] -= 1
                done.append(lease.devices)
        except Exception as exc:  # reported below, in the test thread
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(p,)) for p in plans]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "deadlock: threads still waiting"
    assert errors == []
    assert len(done) == 12


def _wait_until_queued(pattern: str, total: int, n: int) -> None:
    deadline = time.monotonic() + 5
    while len(allocator.read_status(pattern, total).waiters) < n:
        assert time.monotonic() < deadline, "waiter never queued"
        time.sleep(0.01)


def test_big_request_is_not_starved_by_a_stream_of_small_ones(pattern: str) -> None:
    """FIFO with backfill only where harmless: the 4-GPU request starts when the job running
    when it arrived ends, although 1-GPU requests keep arriving the whole time."""
    total = 4
    events: list[tuple[str, float]] = []
    stop = threading.Event()
    long_job = hold(devices=(0,), total_gpus=total, lock_path_pattern=pattern)
    long_job.__enter__()
    long_job_end = time.monotonic() + 0.6

    def small(i: int) -> None:
        with hold(count=1, total_gpus=total, lock_path_pattern=pattern, timeout=20.0):
            events.append((f"small{i}", time.monotonic()))
            time.sleep(0.15)

    def stream() -> None:
        i = 0
        smalls = []
        while not stop.is_set():
            t = threading.Thread(target=small, args=(i,))
            t.start()
            smalls.append(t)
            i += 1
            time.sleep(0.05)
        for t in smalls:
            t.join(timeout=20)

    streamer = threading.Thread(target=stream)
    streamer.start()
    time.sleep(0.2)  # the stream is running: GPUs 1-3 keep turning over
    big_arrived = time.monotonic()
    big_started: list[float] = []

    def big() -> None:
        with hold(count=4, total_gpus=total, lock_path_pattern=pattern, timeout=20.0):
            big_started.append(time.monotonic())
            time.sleep(0.05)

    big_thread = threading.Thread(target=big)
    big_thread.start()
    time.sleep(max(0.0, long_job_end - time.monotonic()))
    long_job.__exit__(None, None, None)
    big_thread.join(timeout=20)
    stop.set()
    streamer.join(timeout=30)
    assert big_started, "the 4-GPU request never started"
    waited = big_started[0] - big_arrived
    # Longest remaining job when it arrived: 0.4 s (GPU 0) and 0.15 s for small ones.
    # The margin absorbs scheduling jitter on a loaded 2-core CI machine; starvation
    # (the original's behaviour) means waiting until the stream stops, seconds later.
    assert waited < 0.4 + 1.0, f"4-GPU request waited {waited:.2f}s behind 1-GPU requests"
    # Requests that arrived after it (0.1 s later, to be sure of the order) started after it.
    late = [when for name, when in events if when > big_arrived + 0.1]
    assert all(when >= big_started[0] for when in late) or not late


def test_backfill_only_where_it_delays_nobody(pattern: str) -> None:
    total = 4
    with hold(devices=(0,), total_gpus=total, lock_path_pattern=pattern):
        got: list[Lease] = []
        ready = threading.Event()

        def earlier() -> None:
            with hold(devices=(0, 1), total_gpus=total, lock_path_pattern=pattern,
                      timeout=20.0) as lease:
                got.append(lease)
                ready.wait(5)

        waiting = threading.Thread(target=earlier)
        waiting.start()
        _wait_until_queued(pattern, total, 1)
        # GPUs 2 and 3 are needed by no earlier waiter: a later request may start now.
        with hold(devices=(2, 3), total_gpus=total, lock_path_pattern=pattern,
                  timeout=0.5) as backfill:
            assert backfill.devices == (2, 3)
        # GPU 1 is claimed by the earlier waiter: taking it could delay it, so no.
        with pytest.raises(WaitTimeout, match="earlier request"), hold(
                devices=(1,), total_gpus=total, lock_path_pattern=pattern, timeout=0.3):
            pass
    ready.set()
    waiting.join(timeout=10)
    assert got and got[0].devices == (0, 1)


def test_hand_off_is_prompt(pattern: str) -> None:
    """A waiter starts within a few poll intervals of its GPU's release (goal: p95 100 ms)."""
    gaps = []
    for _ in range(8):
        started: list[float] = []
        release_at: list[float] = []
        lease = allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern)

        def waiter(started: list[float]) -> None:
            with hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=10.0):
                started.append(time.monotonic())

        t = threading.Thread(target=waiter, args=(started,))
        t.start()
        _wait_until_queued(pattern, 1, 1)
        time.sleep(0.03)
        release_at.append(time.monotonic())
        allocator.release(lease)
        t.join(timeout=10)
        gaps.append(started[0] - release_at[0])
    gaps.sort()
    # The median shows the hand-off; the worst case only has to stay far below the
    # original's 0-5 s random backoff (a loaded CI machine can delay one thread wake-up).
    assert gaps[len(gaps) // 2] < 0.1, gaps
    assert gaps[-1] < 1.0, gaps


def test_fds_passed_to_a_child_keep_the_gpus_held(pattern: str) -> None:
    """What the runner does: pass_fds, so the child's tree holds the locks on its own."""
    with hold(count=2, total_gpus=2, lock_path_pattern=pattern, command="child") as lease:
        child = subprocess.Popen([sys.executable, "-S", "-c", "import time; time.sleep(30)"],
                                 pass_fds=lease.fds, start_new_session=True)
    try:
        # The parent let go, but the child still holds both locks: nobody can take them.
        assert _held_elsewhere(pattern, 0) and _held_elsewhere(pattern, 1)
        with pytest.raises(WaitTimeout, match="held by pid"), hold(
                count=1, total_gpus=2, lock_path_pattern=pattern, timeout=0.2):
            pass
    finally:
        child.kill()
        child.wait(timeout=10)
    started = time.monotonic()
    with hold(count=2, total_gpus=2, lock_path_pattern=pattern, timeout=5.0):
        assert time.monotonic() - started < 0.5


def test_release_is_idempotent(pattern: str) -> None:
    lease = allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern)
    allocator.release(lease)
    other = allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1.0)
    allocator.release(lease)  # must not close descriptors that now belong to `other`
    assert _held_elsewhere(pattern, 0)
    allocator.release(other)


def test_detect_total_gpus_falls_back_to_eight() -> None:
    n = allocator.detect_total_gpus()
    assert isinstance(n, int) and n >= 1
    if not Path("/dev/nvidiactl").exists():
        assert n == 8


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
