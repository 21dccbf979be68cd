"""The ticket queue: tickets and the queue's book of any content read without a crash, and a
lock directory two users share, each with umask 022, as real second and third users.

A ticket in the sticky queue directory can be anyone's file, and the book after the queue
file's header is written by every user of the directory: both are open-ended input."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from _lock_helpers import held_with

from ci.errors import WaitTimeout
from ci.gpu import allocator, lock_gpus
from ci.gpu.tickets import _HEADER, _queue_locked, _read_overruns, _read_passes

NUM_GPUS = 0
pytestmark = pytest.mark.timeout(120)  # a wait gone wrong fails, never hangs the suite
SETPRIV = shutil.which("setpriv")
# Two users that are not root: nobody, and the uid below it (no account needed for a uid).
FIRST, SECOND = 65534, 65533

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
    | st.sampled_from([1e300, 10**400, 2**64, -1, 0, float("nan")]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
TICKET_FIELDS = ("pid", "command", "since", "host", "count", "devices", "expect", "backfill")


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} in JSON output")


@contextmanager
def planted_ticket(pattern: str, number: int, record: object) -> Iterator[None]:
    """A ticket file with `record`, flocked as a live waiter's would be."""
    allocator.check_files(pattern, 2)
    path = os.path.join(allocator.tickets_dir(pattern), f"{number:012d}.json")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, json.dumps(record).encode())
        yield
    finally:
        os.unlink(path)
        os.close(fd)


def _read_all(pattern: str) -> allocator.Status:
    """gpu-status, its JSON and a waiter's timeout, each of which must not raise."""
    st_ = allocator.read_status(pattern, 2)
    lock_gpus.format_status(st_)
    json.loads(lock_gpus.status_as_json(st_), parse_constant=_no_constant)
    with pytest.raises(WaitTimeout) as info:
        allocator.acquire(count=2, total_gpus=2, lock_path_pattern=pattern, timeout=0)
    assert "\n" not in str(info.value)
    return st_


@settings(max_examples=75, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.dictionaries(st.sampled_from(TICKET_FIELDS), JSON), numbered=st.booleans())
def test_any_ticket_is_read_as_far_as_it_goes(tmp_path, fields, numbered):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    record = dict(fields, ticket=7) if numbered else fields
    # GPU 0 held straight through its lock file: a planted ticket ahead in the queue (one
    # no process will ever act on) cannot keep a request of this test waiting.
    with planted_ticket(pattern, 7, record), held_with(pattern, 0, b'{"pid": 1}'):
        st_ = _read_all(pattern)
    for w in st_.waiters:
        assert w.since is None or 0 <= w.since < 2**32
        assert w.expect is None or 0 < w.expect <= allocator.MAX_EXPECT
        assert (w.count is None) != (w.devices is None) and w.count != 0
        assert isinstance(w.command, str) and isinstance(w.host, str)
    assert len(st_.waiters) + len(st_.ignored) == 1  # a waiter, or skipped with a reason


def test_a_planted_ticket_with_since_nan_is_shown_by_gpu_status(tmp_path):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    with planted_ticket(pattern, 9, {"ticket": 9, "count": 1, "devices": None, "pid": 1,
                                     "since": float("nan")}):
        res = subprocess.run([sys.executable, "-m", "ci", "gpu-status", "--lock-path-pattern",
                              pattern, "--total-gpus", "2"], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
    assert "#9 pid 1 since ? wants 1 GPU(s)" in res.stdout


@settings(max_examples=50, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(book=JSON | st.binary(max_size=64))
def test_any_book_after_the_queue_header_is_read_without_a_crash(tmp_path, book):
    pattern = str(tmp_path / "gpu_{gpu_id}.lock")
    allocator.check_files(pattern, 2)
    data = book if isinstance(book, bytes) else json.dumps(book).encode()
    with _queue_locked(pattern) as qfd:
        os.ftruncate(qfd, _HEADER)
        os.pwrite(qfd, data, _HEADER)
        passes, late = _read_passes(qfd), _read_overruns(qfd)
    assert all(isinstance(k, int) and isinstance(v, int) for k, v in passes.items())
    assert all(isinstance(k, str) and v for k, v in late.items())
    with allocator.hold(count=1, total_gpus=2, lock_path_pattern=pattern, timeout=10), \
            allocator.hold(count=1, total_gpus=2, lock_path_pattern=pattern, expect=1, timeout=10):
        _read_all(pattern)


# ---------------------------------------------------------------- two users, one directory


def _interpreter() -> str | None:
    """A Python the other users can run this checkout with: this one, or the system's when
    this one lives where they cannot reach (a virtual environment under /root)."""
    for python in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run([str(SETPRIV), f"--reuid={FIRST}", f"--regid={FIRST}",
                                "--clear-groups", python, "-c", "import ci.gpu.lock_gpus"],
                               cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
        if probe.returncode == 0:
            return python
    return None


def _as(uid: int, python: str, pattern: str) -> subprocess.CompletedProcess[str]:
    assert SETPRIV is not None
    # `python -m ci` under umask 022, the common default that broke sharing.
    script = "import os, runpy\nos.umask(0o022)\nrunpy.run_module('ci', run_name='__main__', alter_sys=True)"
    return subprocess.run([SETPRIV, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                           python, "-c", script, "lock-gpus", "--count", "1", "--total-gpus",
                           "1", "--timeout", "10", "--lock-path-pattern", pattern, "--", "true"],
                          cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def shared_by_first() -> Iterator[Path]:
    """A sticky lock directory owned by the first user, as `/dev/shm/<team>` would be."""
    if os.geteuid() != 0 or SETPRIV is None:
        pytest.skip("needs root and setpriv to act as two other users")
    path = Path(tempfile.mkdtemp(prefix="slime-ci-two-users-", dir="/dev/shm"))
    os.chown(path, FIRST, FIRST)
    path.chmod(0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_a_lock_directory_two_users_share_works_for_the_second(shared_by_first):
    python = _interpreter()
    if python is None:
        pytest.skip("no Python here that another user can run this checkout with")
    pattern = str(shared_by_first / "gpu_{gpu_id}.lock")
    first = _as(FIRST, python, pattern)  # creates the queue and the lock file, umask 022
    assert first.returncode == 0, first.stderr
    second = _as(SECOND, python, pattern)
    assert second.returncode == 0, second.stderr
    assert "lock-gpus: holding GPU(s) 0" in second.stderr


def test_a_queue_the_user_may_only_read_is_one_line_saying_who_can_fix_it(shared_by_first):
    python = _interpreter()
    if python is None:
        pytest.skip("no Python here that another user can run this checkout with")
    pattern = str(shared_by_first / "gpu_{gpu_id}.lock")
    assert _as(FIRST, python, pattern).returncode == 0
    queue = Path(allocator.queue_path(pattern))
    queue.chmod(0o644)  # as an older release, under umask 022, left it
    res = _as(SECOND, python, pattern)
    assert res.returncode == 2, res.stderr
    assert res.stderr == (f"error: {queue}: the GPU queue belongs to uid {FIRST} with mode 644, "
                          "so you cannot queue in it; its owner can `chmod 666` it, or pass a "
                          "--lock-path-pattern of your own\n")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
