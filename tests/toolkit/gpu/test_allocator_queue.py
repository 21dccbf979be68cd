"""What `gpu-status` and a timed-out request say about the GPUs and the queue, read from real
lock files: holder records of any shape, tickets of dead waiters, files that are no ticket,
and the files `check_files` prepares before a run."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from _lock_helpers import held_with

from ci.errors import UsageError, WaitTimeout
from ci.gpu import allocator
from ci.gpu.allocator import hold

NUM_GPUS = 0


@pytest.fixture
def pattern(tmp_path: Path) -> str:
    return str(tmp_path / "locks" / "gpu_{gpu_id}.lock")


def _holder(pattern: str, gpu: int, total: int = 2) -> allocator.Holder:
    holder = allocator.read_status(pattern, total).gpus[gpu].holder
    assert holder is not None
    return holder


def _timeout_text(**request: object) -> str:
    with pytest.raises(WaitTimeout) as info, hold(timeout=0.1, **request):  # type: ignore[arg-type]
        pass
    return str(info.value)


# --- holder records ---------------------------------------------------------------------------


def test_a_record_written_by_acquire_names_host_and_the_child(pattern: str) -> None:
    with hold(count=1, total_gpus=2, lock_path_pattern=pattern) as lease:
        holder = _holder(pattern, 0)
        assert holder.host == socket.gethostname() and holder.local
        assert holder.command == "" and holder.child_pid is None
        lease.note_child(os.getpid())
        assert _holder(pattern, 0).child_pid == os.getpid()


@pytest.mark.parametrize(("record", "pid", "command", "since", "host"), [
    # Fields of the wrong type read as unknown, never as a crash of gpu-status.
    (b'{"pid": "12", "since": "noon", "command": 7, "host": "n2"}', None, "7", None, "n2"),
    (b'{"pid": true, "since": false}', None, "", None, ""),
    (b'{"pid": 5, "since": 3}', 5, "", 3.0, ""),
    (b'[1, 2]', None, "", None, ""),  # JSON, but not a record
    (b"", None, "", None, ""),
    (b"not json", None, "", None, ""),
    # Bytes that are no UTF-8 inside a string: the rest of the record still counts.
    (b'{"pid": 9, "command": "run \xff"}', 9, "run \ufffd", None, ""),
])
def test_holder_records_of_any_shape_are_read_as_far_as_they_go(
        pattern: str, record: bytes, pid: int | None, command: str, since: float | None,
        host: str) -> None:
    with held_with(pattern, 1, record):
        holder = _holder(pattern, 1)
    assert (holder.pid, holder.command, holder.since, holder.host) == (pid, command, since, host)
    assert holder.child_pid is None


def test_a_holder_on_another_host_is_named_with_it(pattern: str) -> None:
    with held_with(pattern, 0, b'{"pid": 4242, "host": "node-7", "child_pid": 4243}'):
        holder = _holder(pattern, 0)
    assert not holder.local and holder.child_pid == 4243
    # Pids of another host are not looked up here: the recorded holder is named.
    assert holder.describe() == "pid 4242 on node-7"


def test_status_lists_every_gpu_without_creating_missing_files(pattern: str) -> None:
    with held_with(pattern, 2, b'{"pid": 77}'):
        st = allocator.read_status(pattern, 3)
    assert [(g.gpu, g.path) for g in st.gpus] == [(i, allocator.gpu_path(pattern, i)) for i in range(3)]
    assert [g.holder is None for g in st.gpus] == [True, True, False]
    assert not Path(allocator.gpu_path(pattern, 0)).exists()
    assert not Path(allocator.gpu_path(pattern, 1)).exists()


# --- the queue --------------------------------------------------------------------------------


def _tickets(pattern: str) -> Path:
    path = Path(allocator.tickets_dir(pattern))
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_the_ticket_of_a_dead_waiter_is_dropped(pattern: str) -> None:
    ticket = _tickets(pattern) / "000000000003.json"
    ticket.write_text(json.dumps({"ticket": 3, "count": 2, "devices": None, "pid": 999999}))
    # Nobody holds its lock: its waiter is gone, so it claims nothing and is removed.
    st = allocator.read_status(pattern, 2)
    assert st.waiters == () and st.ignored == ()
    assert not ticket.exists()
    assert allocator.free_now(pattern, 2) == (0, 1)


def test_a_fifo_in_the_queue_is_skipped_without_blocking(pattern: str) -> None:
    fifo = _tickets(pattern) / "000000000001.json"
    os.mkfifo(fifo)
    done: list[allocator.Status] = []
    reader = threading.Thread(target=lambda: done.append(allocator.read_status(pattern, 1)),
                              daemon=True)
    reader.start()
    reader.join(timeout=10)
    if not done:  # the reader is stuck in open(): give it a writer so the thread can end
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("reading the queue blocked on a FIFO")
    assert done[0].ignored == (f"{fifo}: not a regular file",)


def test_names_and_links_in_the_queue_are_skipped_with_the_reason(pattern: str,
                                                                 tmp_path: Path) -> None:
    tickets = _tickets(pattern)
    (tickets / "notes.txt").write_text("hello")
    real = tmp_path / "elsewhere.json"
    real.write_text(json.dumps({"ticket": 5, "count": 1, "devices": None}))
    (tickets / "000000000005.json").symlink_to(real)
    st = allocator.read_status(pattern, 1)
    assert st.ignored == (f"{tickets / '000000000005.json'}: a symbolic link",
                          f"{tickets / 'notes.txt'}: not a ticket name")


def test_a_ticket_record_needs_exactly_one_of_count_and_devices(pattern: str) -> None:
    tickets = _tickets(pattern)
    fds = []
    try:
        for number, record in ((1, {"count": 1, "devices": [0]}), (2, {"count": None, "devices": None}),
                               (3, {"count": None, "devices": [1, True, "x"]})):
            path = tickets / f"{number:012d}.json"
            path.write_text(json.dumps(dict(record, ticket=number, pid=os.getpid(), command="w")))
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)  # a live waiter's
            fds.append(fd)
        st = allocator.read_status(pattern, 2)
    finally:
        for fd in fds:
            os.close(fd)
    assert st.ignored == (f"{tickets / '000000000001.json'}: not a ticket record",
                          f"{tickets / '000000000002.json'}: not a ticket record")
    # Only integer devices count: `True` and "x" are dropped from the list.
    assert [(w.ticket, w.devices, w.command, w.pid) for w in st.waiters] == [(3, (1,), "w", os.getpid())]


def test_free_now_leaves_out_held_gpus_and_what_earlier_waiters_claim(pattern: str) -> None:
    stop = threading.Event()
    outcome: list[BaseException] = []

    def wait_for_two() -> None:
        try:
            with hold(devices=(0, 1), total_gpus=4, lock_path_pattern=pattern, timeout=20,
                      stop=stop.is_set):
                pass
        except BaseException as exc:  # looked at in the test's thread
            outcome.append(exc)

    with hold(devices=(0,), total_gpus=4, lock_path_pattern=pattern):
        assert allocator.free_now(pattern, 4) == (1, 2, 3)
        waiter = threading.Thread(target=wait_for_two)
        waiter.start()
        deadline = time.monotonic() + 5
        while not allocator.read_status(pattern, 4).waiters:
            assert time.monotonic() < deadline, "the waiter never queued"
            time.sleep(0.01)
        # It waits for GPUs 0 and 1 and has claimed 1: only 2 and 3 are free for a newcomer.
        assert allocator.free_now(pattern, 4) == (2, 3)
        (w,) = allocator.read_status(pattern, 4).waiters
        assert (w.pid, w.host, w.command, w.count, w.devices) == (os.getpid(), socket.gethostname(),
                                                                  "", None, (0, 1))
        assert w.since is not None and abs(w.since - time.time()) < 60
        stop.set()
        waiter.join(timeout=10)
    assert [type(e) for e in outcome] == [allocator.Abandoned]
    assert str(outcome[0]) == "stopped waiting for GPU(s) 0,1"
    assert allocator.free_now(pattern, 4) == (0, 1, 2, 3)



def test_a_waiter_queued_for_a_count_is_shown_with_it(pattern: str) -> None:
    tickets = _tickets(pattern)
    path = tickets / "000000000009.json"
    path.write_text(json.dumps({"ticket": 9, "count": 2, "devices": None, "pid": 12, "since": 5,
                                "host": "node-3", "command": "big job"}))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (w,) = allocator.read_status(pattern, 4).waiters
    finally:
        os.close(fd)
    assert (w.ticket, w.pid, w.since, w.host, w.command, w.count, w.devices) == (
        9, 12, 5.0, "node-3", "big job", 2, None)


def test_a_bare_ticket_claims_its_count_and_names_nobody(pattern: str) -> None:
    path = _tickets(pattern) / "000000000002.json"
    path.write_text(json.dumps({"ticket": 2, "count": 2}))
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        (w,) = allocator.read_status(pattern, 4).waiters
        # The waiter ahead will take the two lowest GPUs: a newcomer gets only the others.
        assert allocator.free_now(pattern, 4) == (2, 3)
    finally:
        os.close(fd)
    assert (w.pid, w.since, w.host, w.command, w.count, w.devices) == (None, None, "", "", 2, None)


def test_a_holder_starts_when_it_gets_the_gpus_not_when_it_asked(pattern: str) -> None:
    lease = allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern)
    got: list[float | None] = []

    def later() -> None:
        with hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=20):
            got.append(_holder(pattern, 0, 1).since)

    waiter = threading.Thread(target=later)
    waiter.start()
    time.sleep(0.5)
    released = time.time()
    allocator.release(lease)
    waiter.join(timeout=20)
    assert got and got[0] is not None and got[0] >= released - 0.05


def test_a_thousand_taken_ticket_names_are_one_clear_error(pattern: str) -> None:
    tickets = _tickets(pattern)
    for number in range(1, 1001):
        (tickets / f"{number:012d}.json").mkdir()
    with pytest.raises(UsageError) as info:
        allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1)
    assert str(info.value) == (f"{tickets}: a thousand ticket names in a row are taken; "
                               "empty the directory")
    (tickets / "000000000001.json").rmdir()  # one name free: the next request queues there
    with hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1) as lease:
        assert lease.ticket == 1


def test_a_linked_queue_directory_is_refused_and_nothing_is_left_open(pattern: str,
                                                                      tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(pattern).parent.mkdir()
    Path(allocator.tickets_dir(pattern)).symlink_to(elsewhere)
    before = len(os.listdir("/proc/self/fd"))
    with pytest.raises(UsageError) as info:
        allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1)
    assert str(info.value) == (f"{allocator.tickets_dir(pattern)} is a symbolic link; it must be the "
                               "directory of the GPU queue's tickets: remove it")
    assert len(os.listdir("/proc/self/fd")) == before
    Path(allocator.tickets_dir(pattern)).unlink()
    Path(allocator.tickets_dir(pattern)).write_text("")
    with pytest.raises(UsageError, match="is not a directory; it must be the directory"):
        allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1)


def test_a_linked_gpu_file_met_mid_probe_is_refused_and_the_probed_gpus_let_go(
        pattern: str, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    Path(pattern).parent.mkdir()
    Path(allocator.gpu_path(pattern, 1)).symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        allocator.acquire(count=2, total_gpus=2, lock_path_pattern=pattern, timeout=1)
    assert victim.read_text() == "precious\n"
    # GPU 0 was locked by the probe before GPU 1 was refused: it is free again.
    assert allocator.read_status(pattern, 1).gpus[0].holder is None
    with hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=1) as lease:
        assert lease.devices == (0,)


@pytest.mark.parametrize(("timeout", "held", "outcome"), [
    (0.0, False, "lease"),  # zero: take them if free, never wait
    (0.0, True, "timeout"),
    (float("inf"), False, "lease"),  # forever is a documented wait
])
def test_zero_and_forever_are_timeouts_a_request_may_give(pattern: str, timeout: float, held: bool,
                                                          outcome: str) -> None:
    blocker = allocator.acquire(count=1, total_gpus=1, lock_path_pattern=pattern) if held else None
    try:
        if outcome == "lease":
            with hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=timeout) as lease:
                assert lease.devices == (0,)
                assert lease.paths == (allocator.gpu_path(pattern, 0),)
                assert lease.ticket >= 1
        else:
            with pytest.raises(WaitTimeout, match="timed out after 0s"), hold(
                    count=1, total_gpus=1, lock_path_pattern=pattern, timeout=timeout):
                pass
    finally:
        if blocker is not None:
            allocator.release(blocker)


def test_a_negative_timeout_names_its_flag() -> None:
    with pytest.raises(UsageError) as info:
        allocator.acquire(count=1, total_gpus=1, lock_path_pattern="/nonexistent/{gpu_id}", timeout=-1)
    assert str(info.value) == "--timeout -1: must be 0 or more seconds"


@pytest.mark.parametrize(("request_", "message"), [
    ({"total_gpus": 2}, "say how many GPUs: pass --count N or --devices 0,1"),
    ({"count": 1, "devices": (0,), "total_gpus": 2}, "pass either --count or --devices, not both"),
    ({"count": 3, "total_gpus": 2}, "--count 3 is more than the 2 GPU(s) on this machine; lower it or "
                                    "pass --total-gpus"),
    ({"devices": (), "total_gpus": 2}, "--devices is empty; list GPU indices such as 0,1"),
    ({"devices": (5,), "total_gpus": 4}, "GPU 5 does not exist: devices are 0..3"),
    ({"count": 1, "total_gpus": 257}, "--total-gpus 257: must be between 1 and 256"),
])
def test_impossible_requests_say_exactly_what_to_do(request_: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as info:
        allocator.make_request(**request_)  # type: ignore[arg-type]
    assert str(info.value) == message


def test_the_largest_machine_is_allowed() -> None:
    assert allocator.make_request(count=256, total_gpus=256).size == 256


@pytest.mark.parametrize(("bad", "message"), [
    ("/tmp/x\0{gpu_id}", "--lock-path-pattern contains a NUL byte; give a file path"),
    ("/tmp/{{gpu_id}}.lock", "--lock-path-pattern '/tmp/{{gpu_id}}.lock' gives the same file for every GPU"),
    ("/tmp/{gpu_id}/", "--lock-path-pattern '/tmp/{gpu_id}/' names a directory; name a file in it, "
                       "e.g. /dev/shm/custom_gpu_lock_{gpu_id}.lock"),
])
def test_bad_patterns_say_what_is_wrong(bad: str, message: str) -> None:
    with pytest.raises(UsageError) as info:
        allocator.validate_pattern(bad)
    assert str(info.value) == message


def test_a_holder_describes_itself() -> None:
    since = 1_700_000_000.0
    clock = time.strftime("%H:%M:%S", time.localtime(since))
    here = socket.gethostname()
    assert allocator.Holder(pid=None, command="", since=None, host="", child_pid=None).describe() == \
        "an unknown process"
    assert allocator.Holder(pid=7, command="job", since=since, host=here, child_pid=None).describe() == \
        f"pid 7 (`job`) since {clock}"
    assert allocator.Holder(pid=7, command="", since=None, host="far", child_pid=None).describe() == \
        "pid 7 on far"

# --- the timeout message ----------------------------------------------------------------------


def test_timeout_names_several_gpus_of_one_holder_and_the_way_out(pattern: str) -> None:
    with hold(count=2, total_gpus=3, lock_path_pattern=pattern, command="train"):
        text = _timeout_text(count=3, total_gpus=3, lock_path_pattern=pattern)
    assert text.startswith("timed out after 0.1s waiting for 3 GPU(s): GPUs 0,1 are held by pid ")
    assert "(`train`)" in text
    assert text.endswith("; wait, free them, or pass a longer --timeout")
    assert "queued ahead" not in text  # the request itself is not ahead of itself


def test_timeout_reads_every_gpu_of_a_big_machine(pattern: str) -> None:
    with held_with(pattern, 9, b'{"pid": 31337, "command": "on gpu nine"}'):
        text = _timeout_text(devices=(9,), total_gpus=10, lock_path_pattern=pattern)
    assert "GPU 9 is held by pid 31337 (`on gpu nine`)" in text


def test_timeout_names_the_first_waiter_ahead(pattern: str) -> None:
    tickets = _tickets(pattern)
    fds = []
    try:
        for number, command in ((1, "first in line"), (2, "")):
            path = tickets / f"{number:012d}.json"
            path.write_text(json.dumps({"ticket": number, "count": 1, "devices": None,
                                        "pid": 100 + number, "command": command}))
            fd = os.open(path, os.O_RDONLY)
            fcntl.flock(fd, fcntl.LOCK_EX)
            fds.append(fd)
        # The request's own ticket skips the names 1 and 2, which are taken.
        with held_with(pattern, 0, b'{"pid": 55}'):
            text = _timeout_text(count=1, total_gpus=1, lock_path_pattern=pattern)
        assert ("GPU 0 is held by pid 55; 2 earlier request(s) queued ahead "
                "(first: pid 101 `first in line`); wait,") in text
        os.close(fds.pop(0))  # the first waiter leaves: the one ahead now has no command
        with held_with(pattern, 0, b'{"pid": 55}'):
            text = _timeout_text(count=1, total_gpus=1, lock_path_pattern=pattern)
        assert "1 earlier request(s) queued ahead (first: pid 102); wait," in text
    finally:
        for fd in fds:
            os.close(fd)


@pytest.mark.parametrize(("length", "shown"), [(80, "c" * 80), (81, "c" * 79 + "…")])
def test_long_commands_are_shortened_to_eighty_characters(pattern: str, length: int,
                                                          shown: str) -> None:
    with hold(count=1, total_gpus=1, lock_path_pattern=pattern, command="c" * length):
        text = _timeout_text(count=1, total_gpus=1, lock_path_pattern=pattern)
    assert f"(`{shown}`)" in text


# --- files prepared before a run --------------------------------------------------------------


def test_check_files_creates_the_queue_its_sticky_directory_and_every_gpu_file(pattern: str) -> None:
    Path(pattern).parent.mkdir()
    allocator.check_files(pattern, 3)
    for gpu in range(3):
        assert Path(allocator.gpu_path(pattern, gpu)).is_file()
    assert not Path(allocator.gpu_path(pattern, 3)).exists()
    locks = Path(pattern).parent
    assert (locks / "gpu_queue.lock").is_file()
    assert stat.S_IMODE(os.stat(locks / "gpu_queue.lock.d").st_mode) == 0o1777
    with pytest.raises(UsageError, match="--total-gpus 0"):
        allocator.check_files(pattern, 0)
    with pytest.raises(UsageError, match="must contain"):
        allocator.check_files(str(Path(pattern).parent / "x.lock"), 1)


def test_an_old_open_queue_directory_of_ours_is_made_sticky(pattern: str) -> None:
    tickets = _tickets(pattern)
    tickets.chmod(0o777)
    allocator.check_files(pattern, 1)
    assert stat.S_IMODE(tickets.stat().st_mode) == 0o1777


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_queue_directory_of_the_directorys_owner_is_left_as_it_is(tmp_path: Path) -> None:
    # The lock directory and its queue belong to uid 65534 (trusted: the directory's owner);
    # root uses them but never changes another user's mode.
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chown(shared, 65534, 65534)
    tickets = shared / "gpu_queue.lock.d"
    tickets.mkdir(mode=0o755)
    tickets.chmod(0o755)
    os.chown(tickets, 65534, 65534)
    allocator.check_files(str(shared / "gpu_{gpu_id}.lock"), 1)
    assert stat.S_IMODE(tickets.stat().st_mode) == 0o755


def test_a_queue_directory_that_cannot_be_read_is_one_clear_error(tmp_path: Path) -> None:
    # The queue file's name fits (254 bytes) but its directory's (+ ".d") does not.
    pattern = str(tmp_path / ("q" * (254 - len("queue")) + "{gpu_id}"))
    with pytest.raises(UsageError) as info:
        allocator.check_files(pattern, 1)
    assert str(info.value) == (f"{allocator.tickets_dir(pattern)}: cannot read the GPU queue "
                               "(File name too long); pass a --lock-path-pattern in a directory "
                               "you can write")


SETPRIV = shutil.which("setpriv")


@pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                    reason="needs root and setpriv to act as a second user (uid 65534)")
@pytest.mark.parametrize(("tickets_dir", "what"), [
    (False, "{shared}/gpu_queue.lock.d: cannot create the GPU queue"),
    (True, "{shared}/gpu_queue.lock.d/000000000001.json: cannot queue for GPUs"),
])
def test_a_queue_another_user_cannot_write_is_one_clear_error(tickets_dir: bool, what: str) -> None:
    # The second user runs this checkout's toolkit with this interpreter: a checkout (or venv)
    # under a directory closed to other users cannot be, and then there is nothing to test.
    probe = subprocess.run([str(SETPRIV), "--reuid=65534", "--regid=65534", "--clear-groups",
                            sys.executable, "-c", "import ci.gpu.lock_gpus"],
                           cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    if probe.returncode != 0:
        pytest.skip(f"uid 65534 cannot run this checkout's toolkit here: {probe.stderr.strip()[-120:]}")
    # Another user may use the queue file, but not create the queue's directory beside it, or
    # (when root made it without the sticky mode) a ticket in it.
    # /dev/shm, not tmp_path: pytest's temporary root is closed to other users.
    shared = Path(tempfile.mkdtemp(prefix="slime-ci-queue-", dir="/dev/shm"))
    try:
        shared.chmod(0o755)
        queue = shared / "gpu_queue.lock"
        queue.touch()
        queue.chmod(0o666)
        if tickets_dir:
            (shared / "gpu_queue.lock.d").mkdir()
            (shared / "gpu_queue.lock.d").chmod(0o755)
        pattern = str(shared / "gpu_{gpu_id}.lock")
        proc = subprocess.run(
            [str(SETPRIV), "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
             "ci", "lock-gpus", "--count", "1", "--total-gpus", "1", "--lock-path-pattern", pattern,
             "--", "true"],
            cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"error: {what.format(shared=shared)} (Permission denied); pass a "
                           "--lock-path-pattern in a directory you can write\n")


# --- GPU count from the driver ----------------------------------------------------------------


class _FakeNvml:
    """Stands in for nvidia-ml-py, which needs a driver and GPUs this machine lacks."""

    def __init__(self, count: int | None, *, shutdown_fails: bool = False) -> None:
        self.count, self.shutdown_fails, self.shut = count, shutdown_fails, False

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        if self.count is None:
            raise RuntimeError("NVML: GPU is lost")
        return self.count

    def nvmlShutdown(self) -> None:
        self.shut = True
        if self.shutdown_fails:
            raise RuntimeError("NVML: uninitialized")


@pytest.mark.parametrize(("fake", "count", "total"), [
    (_FakeNvml(4), 4, 4),
    (_FakeNvml(1), 1, 1),
    (_FakeNvml(0), None, 8),  # a driver that sees no GPU: the default
    (_FakeNvml(None), None, 8),
    (_FakeNvml(2, shutdown_fails=True), 2, 2),
])
def test_the_gpu_count_comes_from_nvml_when_it_answers(monkeypatch: pytest.MonkeyPatch,
                                                       fake: _FakeNvml, count: int | None,
                                                       total: int) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert allocator.nvml_gpu_count() == count
    assert allocator.detect_total_gpus() == total
    assert fake.shut


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
