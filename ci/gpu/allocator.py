"""Per-GPU `flock` allocator with one fair FIFO queue shared by every process on the host.

Layout for a pattern P (default `/dev/shm/custom_gpu_lock_{gpu_id}.lock`):

- `P.format(gpu_id=i)`: GPU i. Its holder keeps an exclusive `flock` on it and writes a
  holder record (pid, command, start time) into it. The kernel frees the lock when the
  last descriptor closes, so a dead holder can never keep a GPU, and a record whose lock
  is not held reads as free.
- `P.format(gpu_id="queue")`: the queue lock. Every decision (who may take which GPUs)
  is made under its `flock`, so GPUs are only ever probed with non-blocking locks while
  it is held: all-or-nothing, no deadlock. Its content is a ticket counter and a
  generation counter; waiters poll the generation with one `pread` and re-evaluate when
  it moves, so a release is noticed within one poll interval without busy work.
- `P.format(gpu_id="queue") + ".d/<ticket>.json"`: one file per waiter, flocked by the
  waiter while it waits. A ticket whose lock is free belongs to a dead waiter and is
  dropped; flocks (unlike pids) mean the same thing across containers sharing /dev/shm.
  The directory is sticky (01777): nobody removes another user's ticket. Anything else in
  it (a directory, a link, a record that is no ticket) is skipped and shown by `gpu-status`.

Every one of these files is opened through `ci/gpu/safe_open.py`: never through a symbolic
link, never another user's file (any local user can create names in /dev/shm).

Fairness: waiters are served in ticket order. Walking the queue, every earlier waiter
claims the free GPUs it needs (a `--count` waiter claims up to its count, a `--devices`
waiter its listed ones), and a later request may only use what is left, so an 8-GPU
request collects GPUs as they free up.

Backfilling (EASY, as batch schedulers do it): the first waiter that cannot start, the
head, gets a reservation: the earliest time enough GPUs free up, from the holders'
expected ends (`since + expect` in their records). A later waiter that declared how long it
expects to hold (`expect`) may borrow the GPUs the head has claimed if it is expected to end
by that reservation (give or take BACKFILL_SLACK, so that waiters woken by one release tie),
so the head never starts later than it would have (beyond that slack). GPUs lent by the
head count as free in its reservation, so backfillers never push it back. A holder with no
expectation, or one past it (an overrun), counts as ending now: its GPUs may free up any
moment, so nothing is lent against them. Each waiter can be passed by backfilling at most
MAX_PASSES times (counts in the queue file after its header); a waiter that asked for strict
FIFO (`backfill=False`, `--no-backfill`, SLIME_CI_NO_BACKFILL) never backfills.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from ci.args import seconds
from ci.errors import UsageError, WaitTimeout
from ci.gpu.safe_open import FILE_MODE, open_lock, read_capped, trusted_owners
from ci.proc import alive

DEFAULT_PATTERN = "/dev/shm/custom_gpu_lock_{gpu_id}.lock"
DEFAULT_TOTAL_GPUS = 8
DEFAULT_TIMEOUT = 86400.0
# A pread every POLL seconds is cheap (~µs); a full re-evaluation runs only when the
# generation moves, or every FULL_CHECK seconds to notice holders that died without
# telling anyone (SIGKILL: the kernel frees the flock but nobody bumps the generation).
POLL = 0.01
FULL_CHECK = 0.2
# How often a waiter may be passed by backfilling before nobody may pass it any more: a
# bound on what wrong expectations can cost it (honest ones cost the head nothing).
MAX_PASSES = 16
# A backfiller may be expected to end this long after the head's reservation: waiters woken
# by one release decide one after another, milliseconds to a few hundred apart on a busy
# host, and without it one deciding just after another started would lose every tie. It
# is the most the head can start later than under strict FIFO (with honest expectations).
BACKFILL_SLACK = 0.5
NO_BACKFILL_ENV = "SLIME_CI_NO_BACKFILL"

_HEADER = 64
# Largest holder record or ticket read: ours are a few hundred bytes; a bigger one was not
# written by us and is never read whole.
_RECORD_LIMIT = 65536
_TICKET_NAME = re.compile(r"(\d{12})\.json")
# Sticky and world-writable, like /dev/shm itself: runners of several users may queue here,
# and nobody can remove or replace another user's ticket.
_TICKETS_MODE = 0o1777
# One lock file per GPU stays open while a request is decided: a bound that no real host
# reaches keeps a typo (--total-gpus 20000) from creating thousands of files.
MAX_TOTAL_GPUS = 256


class Abandoned(Exception):
    """The waiter was told to stop waiting (its run was interrupted)."""


@dataclass(frozen=True, kw_only=True)
class Request:
    """A validated request: a count of any GPUs, or an exact device list."""

    count: int | None
    devices: tuple[int, ...] | None
    total_gpus: int

    @property
    def size(self) -> int:
        return self.count if self.count is not None else len(self.devices or ())

    def describe(self) -> str:
        if self.devices is not None:
            return f"GPU(s) {','.join(map(str, self.devices))}"
        return f"{self.count} GPU(s)"


@dataclass(frozen=True, kw_only=True)
class Lease:
    """GPUs held by this process: `devices` (sorted) and the open, locked `fds`."""

    devices: tuple[int, ...]
    fds: tuple[int, ...]
    paths: tuple[str, ...]
    pattern: str
    ticket: int
    # Set by release(); guards against closing descriptor numbers the OS reused.
    _released: threading.Event = field(default_factory=threading.Event, repr=False)

    def note_child(self, pid: int) -> None:
        """Record the pid of the command that runs on these GPUs in their holder records."""
        # Under the queue lock, so `gpu-status` never reads a half-written record.
        with _queue_locked(self.pattern):
            for fd in self.fds:
                record = _read_record_fd(fd)
                record["child_pid"] = pid
                _write_record_fd(fd, record)


@dataclass(frozen=True, kw_only=True)
class Holder:
    """Who holds a GPU, read from its lock file's holder record."""

    pid: int | None
    command: str
    since: float | None
    host: str
    child_pid: int | None
    expect: float | None = None  # seconds it said it would hold
    ticket: int | None = None
    passed: tuple[int, ...] = ()  # tickets it started ahead of by backfilling

    def overrun(self, now: float) -> float | None:
        """Seconds past its expected end, or None while within it (or without one)."""
        if self.expect is None or self.since is None:
            return None
        late = now - (self.since + self.expect)
        return late if late > 0 else None

    @property
    def local(self) -> bool:
        """Recorded on this host (pids mean something here)."""
        return not self.host or self.host == socket.gethostname()

    @property
    def acting_pid(self) -> int | None:
        """The process that holds the GPU now.

        The recorded holder, unless it is gone while the command it started still holds
        the lock through the inherited descriptor (a SIGKILLed runner or wrapper): then
        that command, so nobody is sent after a pid that no longer exists.
        """
        if (self.child_pid is not None and self.pid is not None and self.local
                and not alive(self.pid) and alive(self.child_pid)):
            return self.child_pid
        return self.pid

    def describe(self) -> str:
        pid = self.acting_pid
        who = f"pid {pid}" if pid is not None else "an unknown process"
        if self.host and self.host != socket.gethostname():
            who += f" on {self.host}"
        parts = [who]
        if self.command:
            parts.append(f"(`{_shorten(self.command)}`)")
        if self.since is not None:
            parts.append(f"since {time.strftime('%H:%M:%S', time.localtime(self.since))}")
        return " ".join(parts)


@dataclass(frozen=True, kw_only=True)
class GpuState:
    """One GPU as `gpu-status` shows it; `holder` is None when the GPU is free."""

    gpu: int
    path: str
    holder: Holder | None


@dataclass(frozen=True, kw_only=True)
class Waiter:
    """One queued request, in arrival order."""

    ticket: int
    pid: int | None
    command: str
    since: float | None
    count: int | None
    devices: tuple[int, ...] | None
    host: str
    expect: float | None = None
    backfill: bool = True  # False: asked for strict FIFO
    passes: int = 0  # times later waiters started ahead of it by backfilling


@dataclass(frozen=True, kw_only=True)
class Status:
    """Every GPU and the queue of waiters, read consistently under the queue lock."""

    gpus: tuple[GpuState, ...]
    waiters: tuple[Waiter, ...]
    ignored: tuple[str, ...] = ()  # queue entries that are no ticket of a live waiter, and why
    head: int | None = None  # the first waiter that cannot start now
    reservation: float | None = None  # when the head's GPUs are expected free (epoch seconds)
    now: float = 0.0  # when it was read


# ---------------------------------------------------------------- validation


def validate_pattern(pattern: str) -> str:
    """Check that a lock path pattern names one file per GPU through `{gpu_id}`."""
    if "{gpu_id}" not in pattern:
        raise UsageError(f"--lock-path-pattern {pattern!r} must contain {{gpu_id}}, "
                         f"e.g. {DEFAULT_PATTERN}")
    if "\0" in pattern:
        raise UsageError("--lock-path-pattern contains a NUL byte; give a file path")
    try:
        # The queue's file is the pattern with the word `queue`: a format spec such as
        # {gpu_id:02d} works for numbers only and would fail in the middle of a run.
        first, second, queue = (pattern.format(gpu_id=0), pattern.format(gpu_id=1),
                                pattern.format(gpu_id="queue"))
    except (KeyError, IndexError, ValueError, AttributeError, TypeError) as exc:
        raise UsageError(f"--lock-path-pattern {pattern!r} may use only the plain field "
                         f"{{gpu_id}} ({exc}); write other braces as {{{{ }}}}") from None
    if first == second:
        raise UsageError(f"--lock-path-pattern {pattern!r} gives the same file for every GPU")
    if queue.endswith("/") or first.endswith("/"):
        raise UsageError(f"--lock-path-pattern {pattern!r} names a directory; name a file in it, "
                         f"e.g. {DEFAULT_PATTERN}")
    return pattern


def check_files(lock_path_pattern: str, total_gpus: int) -> None:
    """Open (creating) the queue, its ticket directory and every GPU's lock file once.

    Any refusal or unwritable path is one UsageError now, before a run starts entries
    that would each meet it while waiting for GPUs.
    """
    pattern = validate_pattern(lock_path_pattern)
    check_total(total_gpus)
    with _queue_locked(pattern):
        _ensure_tickets_dir(tickets_dir(pattern))
        for gpu in range(total_gpus):
            os.close(_open(gpu_path(pattern, gpu)))


def check_total(total_gpus: int) -> int:
    """`--total-gpus` between 1 and MAX_TOTAL_GPUS."""
    if not 1 <= total_gpus <= MAX_TOTAL_GPUS:
        raise UsageError(f"--total-gpus {total_gpus}: must be between 1 and {MAX_TOTAL_GPUS}")
    return total_gpus


def make_request(*, count: int | None = None, devices: Sequence[int] | None = None,
                 total_gpus: int) -> Request:
    """Validate a request; impossible ones raise UsageError at once instead of waiting forever."""
    check_total(total_gpus)
    if count is None and devices is None:
        raise UsageError("say how many GPUs: pass --count N or --devices 0,1")
    if count is not None and devices is not None:
        raise UsageError("pass either --count or --devices, not both")
    if count is not None:
        if count <= 0:
            raise UsageError(f"--count must be at least 1 (got {count})")
        if count > total_gpus:
            raise UsageError(f"--count {count} is more than the {total_gpus} GPU(s) on this "
                             "machine; lower it or pass --total-gpus")
        return Request(count=count, devices=None, total_gpus=total_gpus)
    assert devices is not None
    devs = tuple(devices)
    if not devs:
        raise UsageError("--devices is empty; list GPU indices such as 0,1")
    seen: set[int] = set()
    for dev in devs:
        if dev < 0 or dev >= total_gpus:
            raise UsageError(f"GPU {dev} does not exist: devices are 0..{total_gpus - 1}")
        if dev in seen:
            raise UsageError(f"GPU {dev} is listed twice in --devices; list each GPU once")
        seen.add(dev)
    return Request(count=None, devices=tuple(sorted(devs)), total_gpus=total_gpus)


def nvml_gpu_count() -> int | None:
    """The GPU count NVML reports (nvidia-ml-py); None without a driver, library or GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no library: not a GPU machine
        return None
    try:
        count = int(pynvml.nvmlDeviceGetCount())
    except Exception:
        return None
    finally:
        with suppress(Exception):
            pynvml.nvmlShutdown()
    return count if count > 0 else None


def detect_total_gpus() -> int:
    """The GPU count NVML reports, else 8."""
    return nvml_gpu_count() or DEFAULT_TOTAL_GPUS


# ---------------------------------------------------------------- files and records


def gpu_path(pattern: str, gpu: int) -> str:
    """The lock file of one GPU."""
    return pattern.format(gpu_id=gpu)


def queue_path(pattern: str) -> str:
    """The queue lock file: ticket and generation counters, guarded by its own flock."""
    return pattern.format(gpu_id="queue")


def tickets_dir(pattern: str) -> str:
    """The directory holding one ticket file per waiter."""
    return queue_path(pattern) + ".d"


def _open(path: str, *, create: bool = True) -> int:
    # Never through a link, never another user's file: see ci/gpu/safe_open.py.
    return open_lock(path, create=create)


def _try_lock(fd: int, kind: int = fcntl.LOCK_EX) -> bool:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def _read_record_fd(fd: int) -> dict[str, object]:
    data = read_capped(fd, _RECORD_LIMIT)
    if data is None:
        return {}
    try:
        record = json.loads(data.decode("utf-8", "replace") or "{}")
    except (ValueError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def _write_record_fd(fd: int, record: dict[str, object]) -> None:
    data = (json.dumps(record, sort_keys=True) + "\n").encode()
    with suppress(OSError):  # a read-only lock file just has no record
        os.ftruncate(fd, 0)
        os.pwrite(fd, data, 0)


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _expect_or_none(value: object) -> float | None:
    got = _float_or_none(value)
    return got if got is not None and 0 < got < float("inf") else None


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in value if isinstance(v, int) and not isinstance(v, bool))


def _holder_from(record: dict[str, object]) -> Holder:
    return Holder(pid=_int_or_none(record.get("pid")), command=str(record.get("command", "")),
                  since=_float_or_none(record.get("since")), host=str(record.get("host", "")),
                  child_pid=_int_or_none(record.get("child_pid")),
                  expect=_expect_or_none(record.get("expect")),
                  ticket=_int_or_none(record.get("ticket")), passed=_ints(record.get("passed")))


def expected_end(record: dict[str, object], now: float) -> float:
    """When a holder's GPUs are expected free: `since + expect`, but never before `now`.

    Without an expectation, or past it (an overrun), its GPUs may free up any moment: now.
    """
    since, expect = _float_or_none(record.get("since")), _expect_or_none(record.get("expect"))
    if since is None or expect is None:
        return now
    return max(now, since + expect)


def _shorten(text: str, limit: int = 80) -> str:
    """A holder's command for one line: its program by name (a venv's interpreter path would
    use up the line before what it runs), then clipped."""
    program, sep, rest = text.partition(" ")
    if "/" in program and not program.startswith(("'", '"')):
        text = program.rsplit("/", 1)[1] + sep + rest
    return text if len(text) <= limit else text[: limit - 1] + "…"


@contextmanager
def _queue_locked(pattern: str) -> Iterator[int]:
    # A fresh open per use: flocks belong to the open file description, so two threads of
    # one process exclude each other exactly as two processes do.
    fd = _open(queue_path(pattern))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _read_counters(fd: int) -> tuple[int, int]:
    parts = os.pread(fd, _HEADER, 0).split()
    try:
        return int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        return 0, 0


def _write_counters(fd: int, ticket: int, gen: int) -> None:
    os.pwrite(fd, f"v1 {ticket:020d} {gen:020d}\n".encode().ljust(_HEADER - 1) + b"\n", 0)


def _read_passes(fd: int) -> dict[int, int]:
    """Times each waiter was passed by backfilling, kept after the counters' header."""
    try:
        raw = json.loads(os.pread(fd, _RECORD_LIMIT, _HEADER).decode("utf-8", "replace") or "{}")
    except (ValueError, RecursionError):
        return {}
    if not isinstance(raw, dict):
        return {}
    passes = {}
    for key, value in raw.items():
        n = _int_or_none(value)
        if key.isdigit() and n is not None:
            passes[int(key)] = n
    return passes


def _write_passes(fd: int, passes: dict[int, int]) -> None:
    data = json.dumps({str(k): v for k, v in sorted(passes.items())}).encode()
    os.ftruncate(fd, _HEADER)
    os.pwrite(fd, data, _HEADER)


def _bump(fd: int) -> None:
    ticket, gen = _read_counters(fd)
    _write_counters(fd, ticket, gen + 1)


def _read_gen(fd: int) -> int:
    return _read_counters(fd)[1]


# ---------------------------------------------------------------- the queue


@dataclass(frozen=True, kw_only=True)
class _Ticket:
    number: int
    count: int | None
    devices: tuple[int, ...] | None
    record: dict[str, object]
    expect: float | None = None
    backfill: bool = True

    @property
    def size(self) -> int:
        return self.count if self.count is not None else len(self.devices or ())


def _tickets_dir_state(directory: str) -> bool:
    """Whether the ticket directory exists; refuses one that is a link, a file or untrusted."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise UsageError(f"{directory}: cannot read the GPU queue ({exc.strerror}); pass a "
                         "--lock-path-pattern in a directory you can write") from None
    if not stat.S_ISDIR(st.st_mode):
        kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise UsageError(f"{directory} is {kind}; it must be the directory of the GPU queue's "
                         "tickets: remove it")
    if st.st_uid not in trusted_owners(os.path.dirname(directory) or "."):
        raise UsageError(f"{directory} belongs to uid {st.st_uid}, not to you, root or the "
                         "directory's owner, so it could drop anyone's place in the queue; "
                         "remove it")
    return True


def _ensure_tickets_dir(directory: str) -> None:
    if not _tickets_dir_state(directory):
        try:
            os.mkdir(directory)
        except FileExistsError:
            pass
        except OSError as exc:
            raise UsageError(f"{directory}: cannot create the GPU queue ({exc.strerror}); pass "
                             "a --lock-path-pattern in a directory you can write") from None
        _tickets_dir_state(directory)
    st = os.lstat(directory)
    if st.st_uid == os.geteuid() and stat.S_IMODE(st.st_mode) != _TICKETS_MODE:
        with suppress(OSError):
            os.chmod(directory, _TICKETS_MODE)  # also upgrades a 0777 one from an older version


def _read_ticket(directory: str, name: str) -> _Ticket | str | None:
    """The ticket in `name`; None when its waiter is gone; a reason when it is no ticket."""
    match = _TICKET_NAME.fullmatch(name)
    if match is None:
        return "not a ticket name"
    path = os.path.join(directory, name)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return "a symbolic link" if exc.errno == errno.ELOOP else f"unreadable ({exc.strerror})"
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "not a regular file"
        if _try_lock(fd):
            # Nobody holds the ticket: its waiter died (SIGKILL, crash). Drop it (the sticky
            # directory lets only its owner or root do so; others just skip it).
            with suppress(OSError):
                os.unlink(path)
            return None
        record = _read_record_fd(fd)
    finally:
        os.close(fd)
    number = int(match.group(1))
    # The number is the file's name, which the queue lock handed out; a record that claims
    # another one (an earlier place in the queue) is not ours.
    if _int_or_none(record.get("ticket")) != number:
        return "not a ticket record"
    count = _int_or_none(record.get("count"))
    devices = record.get("devices")
    devs = (tuple(d for d in devices if isinstance(d, int) and not isinstance(d, bool))
            if isinstance(devices, list) else None)
    if (count is None) == (devs is None):
        return "not a ticket record"
    return _Ticket(number=number, count=count, devices=devs, record=record,
                   expect=_expect_or_none(record.get("expect")),
                   backfill=record.get("backfill") is not False)


def _queue_entries(pattern: str) -> tuple[list[_Ticket], list[str]]:
    """(tickets of live waiters in arrival order, entries skipped and why); queue lock held.

    Anything else in the directory (a directory, a link, garbage, a record that is no
    ticket) is skipped, never fatal: any local user can put names there.
    """
    directory = tickets_dir(pattern)
    if not _tickets_dir_state(directory):
        return [], []
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise UsageError(f"{directory}: cannot list the GPU queue ({exc.strerror})") from None
    tickets, ignored = [], []
    for name in sorted(names):
        got = _read_ticket(directory, name)
        if isinstance(got, _Ticket):
            tickets.append(got)
        elif isinstance(got, str):
            ignored.append(f"{os.path.join(directory, name)}: {got}")
    tickets.sort(key=lambda t: t.number)
    return tickets, ignored


def _live_tickets(pattern: str) -> list[_Ticket]:
    """Tickets of live waiters in arrival order; call with the queue lock held."""
    return _queue_entries(pattern)[0]


def claim(count: int | None, devices: tuple[int, ...] | None,
          avail: list[int]) -> tuple[list[int], list[int]]:
    """(GPUs a request takes or reserves from `avail`, GPUs left for later requests)."""
    if devices is not None:
        wanted = set(devices)
        return [g for g in avail if g in wanted], [g for g in avail if g not in wanted]
    n = count or 0
    return avail[:n], avail[n:]


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """What the queue decides at one moment: who may start now on which GPUs.

    `starts` maps a ticket to the GPUs it may take now; `passed` a backfilling ticket to the
    earlier waiters it starts ahead of; `head` is the first waiter that must wait and
    `reservation` when its GPUs are expected free.
    """

    starts: dict[int, tuple[int, ...]]
    passed: dict[int, tuple[int, ...]]
    head: int | None
    reservation: float | None


def _reservation(ticket: _Ticket, ends: dict[int, float]) -> float:
    """When `ticket` could start if nobody else took a GPU: from each GPU's expected end."""
    never = float("inf")  # a GPU this machine lacks: a request that can never start
    if ticket.devices is not None:
        return max(ends.get(g, never) for g in ticket.devices)
    ordered = sorted(ends.values())
    return ordered[ticket.size - 1] if ticket.size <= len(ordered) else never


def schedule(tickets: Sequence[_Ticket], free: Sequence[int], ends: dict[int, float],
             now: float, passes: dict[int, int] | None = None, *,
             lent: dict[int, tuple[int, ...]] | None = None, slack: float | None = None,
             max_passes: int = MAX_PASSES) -> Schedule:
    """Walk the queue in ticket order (EASY backfilling).

    `free`: GPUs nobody holds; `ends`: each held GPU's expected end (see `expected_end`).
    A waiter that fits in what earlier waiters left starts. The first that does not is the
    head: it claims the free GPUs it can use and gets a reservation. A later waiter with an
    expectation that ends by the reservation (give or take `slack`, default BACKFILL_SLACK),
    and that passes nobody passed `max_passes` times already, may start on the head's
    claimed GPUs too; any other waits and claims.

    `lent`: per held GPU, the tickets its holder backfilled past. GPUs lent by the head count
    as ending now in its reservation: a backfiller expected to end `slack` after it never
    moves it, so `slack` is all the head can lose, however many backfill one after another.
    """
    passes = passes or {}
    lent = lent or {}
    slack = BACKFILL_SLACK if slack is None else slack
    est = dict(ends)
    est.update((g, now) for g in free)
    avail = sorted(free)
    lend: list[int] = []
    head: _Ticket | None = None
    reservation: float | None = None
    waiting: list[int] = []
    starts: dict[int, tuple[int, ...]] = {}
    passed: dict[int, tuple[int, ...]] = {}
    for t in tickets:
        mine, rest = claim(t.count, t.devices, avail)
        if len(mine) == t.size:
            starts[t.number] = tuple(mine)
            avail = rest
            if head is None:  # starts now, expected to end after its expectation
                est.update((g, now + (t.expect or 0.0)) for g in mine)
            continue
        if head is None:
            number = t.number
            head = t
            reservation = _reservation(t, {g: now if number in lent.get(g, ()) else end
                                           for g, end in est.items()})
            lend, avail = mine, rest
            waiting.append(t.number)
            continue
        assert reservation is not None
        if (t.backfill and t.expect is not None and now + t.expect <= reservation + slack
                and all(passes.get(w, 0) < max_passes for w in waiting)):
            borrowed, _ = claim(t.count, t.devices, avail + lend)
            if len(borrowed) == t.size:
                starts[t.number] = tuple(sorted(borrowed))
                passed[t.number] = tuple(waiting)
                avail = [g for g in avail if g not in borrowed]
                lend = [g for g in lend if g not in borrowed]
                continue
        _, avail = claim(t.count, t.devices, avail)
        waiting.append(t.number)
    return Schedule(starts=starts, passed=passed, head=head.number if head else None,
                    reservation=reservation)


def _probe(pattern: str, total: int, now: float
           ) -> tuple[dict[int, int], dict[int, float], dict[int, tuple[int, ...]]]:
    """Lock every free GPU (non-blocking): (gpu -> locked fd, held gpu -> expected end,
    held gpu -> tickets its holder backfilled past). Queue lock held."""
    free: dict[int, int] = {}
    ends: dict[int, float] = {}
    lent: dict[int, tuple[int, ...]] = {}
    try:
        for gpu in range(total):
            fd = _open(gpu_path(pattern, gpu))
            if _try_lock(fd):
                free[gpu] = fd
            else:
                record = _read_record_fd(fd)
                os.close(fd)
                ends[gpu] = expected_end(record, now)
                lent[gpu] = _ints(record.get("passed"))
    except BaseException:
        for fd in free.values():
            os.close(fd)
        raise
    return free, ends, lent


def _try_take(pattern: str, req: Request, ticket: int, record: dict[str, object],
              now: float | None = None) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """Take the GPUs for `ticket` if fair; returns (devices, fds) or None. Queue lock held.

    `now` (epoch seconds, default the clock) is when the decision is taken: the holder
    records say so, and expectations are measured from it.
    """
    now = time.time() if now is None else now
    free: dict[int, int] = {}
    mine: list[int] = []
    qfd = _open(queue_path(pattern))
    try:
        free, ends, lent = _probe(pattern, req.total_gpus, now)
        queue = _live_tickets(pattern)
        tickets = [t for t in queue if t.number <= ticket]  # later ones do not matter here
        passes = _read_passes(qfd)
        plan = schedule(tickets, sorted(free), ends, now, passes, lent=lent)
        mine = list(plan.starts.get(ticket, ()))
        passed = plan.passed.get(ticket, ())
        if mine and passed:
            live = {t.number for t in queue}  # the counts of waiters gone are dropped
            passes = {k: v for k, v in passes.items() if k in live}
            for w in passed:
                passes[w] = passes.get(w, 0) + 1
            _write_passes(qfd, passes)
    except BaseException:
        mine = []  # nothing is taken: every probed GPU is let go
        raise
    finally:
        os.close(qfd)
        for gpu, fd in free.items():
            if gpu not in mine:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
    if not mine:
        return None
    now_record = dict(record, since=now, passed=list(passed))
    fds = tuple(free[g] for g in mine)
    for gpu, fd in zip(mine, fds, strict=True):
        _write_record_fd(fd, dict(now_record, gpu=gpu))
    return tuple(mine), fds


def _new_ticket(pattern: str, req: Request, record: dict[str, object]) -> tuple[int, int, str]:
    """Enqueue; returns (ticket number, locked ticket fd, ticket path)."""
    directory = tickets_dir(pattern)
    with _queue_locked(pattern) as qfd:
        _ensure_tickets_dir(directory)
        ticket, gen = _read_counters(qfd)
        for _ in range(1000):
            ticket += 1
            path = os.path.join(directory, f"{ticket:012d}.json")
            # O_EXCL: a name someone planted (a link to a file of ours, a directory) is
            # never opened; the next number is taken instead.
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, FILE_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise UsageError(f"{path}: cannot queue for GPUs ({exc.strerror}); pass a "
                                 "--lock-path-pattern in a directory you can write") from None
            break
        else:
            raise UsageError(f"{directory}: a thousand ticket names in a row are taken; "
                             "empty the directory")
        _write_counters(qfd, ticket, gen + 1)
        # Created and locked under the queue lock, so nobody can see it unlocked and
        # mistake it for the ticket of a dead waiter.
        fcntl.flock(fd, fcntl.LOCK_EX)
        _write_record_fd(fd, dict(record, ticket=ticket, count=req.count,
                                  devices=list(req.devices) if req.devices is not None else None))
    return ticket, fd, path


def _drop_ticket(fd: int, path: str) -> None:
    with suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)


def _gpu_list(gpus: Sequence[int]) -> str:
    return f"GPU {gpus[0]} is" if len(gpus) == 1 else f"GPUs {','.join(map(str, gpus))} are"


def _timeout_message(pattern: str, req: Request, ticket: int, timeout: float) -> str:
    st = read_status(pattern, req.total_gpus)
    by_holder: dict[Holder, list[int]] = {}
    for g in st.gpus:
        if g.holder is not None and (req.devices is None or g.gpu in req.devices):
            by_holder.setdefault(g.holder, []).append(g.gpu)
    parts = [f"{_gpu_list(gpus)} held by {holder.describe()}"
             for holder, gpus in by_holder.items()]
    ahead = [w for w in st.waiters if w.ticket < ticket]
    if ahead:
        first = ahead[0]
        what = f" `{_shorten(first.command)}`" if first.command else ""
        parts.append(f"{len(ahead)} earlier request(s) queued ahead "
                     f"(first: pid {first.pid}{what})")
    why = "; ".join(parts) if parts else "the GPUs were busy"
    return (f"timed out after {timeout:g}s waiting for {req.describe()}: {why}; "
            "wait, free them, or pass a longer --timeout")


def backfill_default() -> bool:
    """Whether to backfill when not told: yes, unless SLIME_CI_NO_BACKFILL is set (not 0)."""
    return os.environ.get(NO_BACKFILL_ENV, "").strip().lower() in ("", "0", "false", "no")


def acquire(*, count: int | None = None, devices: Sequence[int] | None = None,
            total_gpus: int, lock_path_pattern: str = DEFAULT_PATTERN,
            timeout: float = DEFAULT_TIMEOUT, command: str = "",
            poll: float = POLL, stop: Callable[[], bool] | None = None,
            expect: float | None = None, backfill: bool | None = None) -> Lease:
    """Wait in the fair queue, then lock the GPUs all at once; release with `release()`.

    `stop`, polled while waiting, gives up the place in the queue (raises `Abandoned`).
    `expect`: seconds this request expects to hold its GPUs; with it, it may start early on
    GPUs the head of the queue waits for, if it ends by the head's reservation (`backfill`;
    default `backfill_default()`). Without it, it never backfills, and counts as a holder
    that may end any moment.
    """
    pattern = validate_pattern(lock_path_pattern)
    req = make_request(count=count, devices=devices, total_gpus=total_gpus)
    seconds("--timeout", timeout, zero=True, forever=True)
    if expect is not None:
        seconds("--expect", expect)
    record: dict[str, object] = {"pid": os.getpid(), "command": command,
                                 "host": socket.gethostname(), "since": time.time(),
                                 "expect": expect,
                                 "backfill": backfill_default() if backfill is None else backfill}
    deadline = time.monotonic() + timeout
    watch = _open(queue_path(pattern))
    try:
        ticket, tfd, tpath = _new_ticket(pattern, req, record)
    except BaseException:
        os.close(watch)
        raise
    try:
        last_gen = -1
        next_full = 0.0
        while True:
            now = time.monotonic()
            gen = _read_gen(watch)
            if gen != last_gen or now >= next_full:
                with _queue_locked(pattern) as qfd:
                    got = _try_take(pattern, req, ticket, dict(record, ticket=ticket))
                    if got is not None:
                        _drop_ticket(tfd, tpath)
                        tfd = -1
                        _bump(qfd)
                    last_gen = _read_gen(qfd)
                if got is not None:
                    devs, fds = got
                    return Lease(devices=devs, fds=fds, ticket=ticket, pattern=pattern,
                                 paths=tuple(gpu_path(pattern, g) for g in devs))
                next_full = now + FULL_CHECK
            if now >= deadline:
                raise WaitTimeout(_timeout_message(pattern, req, ticket, timeout))
            if stop is not None and stop():
                raise Abandoned(f"stopped waiting for {req.describe()}")
            time.sleep(poll)
    finally:
        os.close(watch)
        if tfd >= 0:
            _drop_ticket(tfd, tpath)
            with suppress(OSError), _queue_locked(pattern) as qfd:
                _bump(qfd)  # later waiters may now backfill what this one had claimed


def release(lease: Lease) -> None:
    """Unlock the GPUs (this process's descriptors) and wake the waiters; idempotent."""
    if lease._released.is_set():
        return
    lease._released.set()
    for fd in lease.fds:
        # The record stays: while a process that inherited the descriptor still holds
        # the lock it says whose GPU this is, and once the lock is free it reads as free.
        with suppress(OSError):
            os.close(fd)
    with suppress(OSError), _queue_locked(lease.pattern) as qfd:
        _bump(qfd)


@contextmanager
def hold(*, count: int | None = None, devices: Sequence[int] | None = None,
         total_gpus: int, lock_path_pattern: str = DEFAULT_PATTERN,
         timeout: float = DEFAULT_TIMEOUT, command: str = "",
         poll: float = POLL, stop: Callable[[], bool] | None = None,
         expect: float | None = None, backfill: bool | None = None) -> Iterator[Lease]:
    """Hold GPUs exclusively for the `with` block; thread- and process-safe, fair FIFO
    with backfilling (see `acquire`)."""
    lease = acquire(count=count, devices=devices, total_gpus=total_gpus,
                    lock_path_pattern=lock_path_pattern, timeout=timeout, command=command,
                    poll=poll, stop=stop, expect=expect, backfill=backfill)
    try:
        yield lease
    finally:
        release(lease)


# ---------------------------------------------------------------- status


def read_status(lock_path_pattern: str = DEFAULT_PATTERN,
                total_gpus: int = DEFAULT_TOTAL_GPUS) -> Status:
    """Each GPU (free, or who holds it) and the waiters in arrival order."""
    pattern = validate_pattern(lock_path_pattern)
    check_total(total_gpus)
    gpus = []
    now = time.time()
    ends: dict[int, float] = {}
    # Probing takes a lock for an instant; under the queue lock no allocator of ours is
    # looking at the same moment, so the probe never makes a request fail.
    with _queue_locked(pattern) as qfd:
        for gpu in range(total_gpus):
            path = gpu_path(pattern, gpu)
            try:
                fd = _open(path, create=False)
            except FileNotFoundError:
                gpus.append(GpuState(gpu=gpu, path=path, holder=None))
                continue
            try:
                # A record whose lock is free was left by a dead holder: it means nothing.
                free = _try_lock(fd, fcntl.LOCK_SH)
                record = {} if free else _read_record_fd(fd)
            finally:
                os.close(fd)
            holder = None if free else _holder_from(record)
            if holder is not None:
                ends[gpu] = expected_end(record, now)
            gpus.append(GpuState(gpu=gpu, path=path, holder=holder))
        tickets, ignored = _queue_entries(pattern)
        passes = _read_passes(qfd)
    lent = {g.gpu: g.holder.passed for g in gpus if g.holder is not None}
    plan = schedule(tickets, [g.gpu for g in gpus if g.holder is None], ends, now, passes,
                    lent=lent)
    waiters = tuple(
        Waiter(ticket=t.number, pid=_int_or_none(t.record.get("pid")),
               command=str(t.record.get("command", "")),
               since=_float_or_none(t.record.get("since")), count=t.count, devices=t.devices,
               host=str(t.record.get("host", "")), expect=t.expect, backfill=t.backfill,
               passes=passes.get(t.number, 0))
        for t in tickets)
    return Status(gpus=tuple(gpus), waiters=waiters, ignored=tuple(ignored), head=plan.head,
                  reservation=plan.reservation, now=now)


def free_now(lock_path_pattern: str = DEFAULT_PATTERN,
             total_gpus: int = DEFAULT_TOTAL_GPUS) -> tuple[int, ...]:
    """GPUs neither held nor claimed by a waiter: what a new request could take at once."""
    st = read_status(lock_path_pattern, total_gpus)
    avail = [g.gpu for g in st.gpus if g.holder is None]
    for w in st.waiters:
        _, avail = claim(w.count, w.devices, avail)
    return tuple(avail)
