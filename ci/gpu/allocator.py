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
FIFO (`backfill=False`, `--no-backfill`, SLIME_CI_NO_BACKFILL) never backfills, and neither
does a command that overran its last expectations (`overruns.py`).

The pieces live beside this module: the holder record's format (`holders.py`), the ticket
queue (`tickets.py`) and the backfilling decision (`backfill.py`); here are the request's
validation, the acquire loop that acts on the decision, release and `read_status`.
"""

from __future__ import annotations

import fcntl
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from ci.args import seconds
from ci.errors import UsageError, WaitTimeout
from ci.gpu import overruns
from ci.gpu.backfill import BACKFILL_SLACK, MAX_PASSES, Schedule, claim, schedule
from ci.gpu.holders import (
    MAX_EXPECT,
    Holder,
    _holder_from,
    _int_or_none,
    _open,
    _read_record_fd,
    _shorten,
    _text,
    _time_or_none,
    _try_lock,
    _write_record_fd,
    expected_end,
    gpu_path,
)
from ci.gpu.tickets import (
    Request,
    _bump,
    _drop_ticket,
    _ensure_tickets_dir,
    _live_tickets,
    _new_ticket,
    _queue_entries,
    _queue_locked,
    _read_gen,
    _read_overruns,
    _read_passes,
    _Ticket,
    _write_overruns,
    _write_passes,
    queue_path,
    tickets_dir,
)

# The allocator's pieces, importable from here as before the split.
__all__ = ["BACKFILL_SLACK", "MAX_EXPECT", "MAX_PASSES", "Holder", "Request", "Schedule", "_Ticket", "claim",
           "expected_end", "gpu_path", "queue_path", "schedule", "tickets_dir"]

DEFAULT_PATTERN = "/dev/shm/custom_gpu_lock_{gpu_id}.lock"
DEFAULT_TOTAL_GPUS = 8
DEFAULT_TIMEOUT = 86400.0
# A pread every POLL seconds is cheap (~µs); a full re-evaluation runs only when the
# generation moves, or every FULL_CHECK seconds to notice holders that died without
# telling anyone (SIGKILL: the kernel frees the flock but nobody bumps the generation).
POLL = 0.01
FULL_CHECK = 0.2
NO_BACKFILL_ENV = "SLIME_CI_NO_BACKFILL"

# One lock file per GPU stays open while a request is decided: a bound that no real host
# reaches keeps a typo (--total-gpus 20000) from creating thousands of files.
MAX_TOTAL_GPUS = 256


class Abandoned(Exception):
    """The waiter was told to stop waiting (its run was interrupted)."""


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
    trusted: bool = True  # False: its command overran its last expectations (no backfilling)


@dataclass(frozen=True, kw_only=True)
class Status:
    """Every GPU and the queue of waiters, read consistently under the queue lock."""

    gpus: tuple[GpuState, ...]
    waiters: tuple[Waiter, ...]
    ignored: tuple[str, ...] = ()  # queue entries that are no ticket of a live waiter, and why
    head: int | None = None  # the first waiter that cannot start now
    reservation: float | None = None  # when the head's GPUs are expected free (epoch seconds)
    now: float = 0.0  # when it was read
    distrusted: tuple[str, ...] = ()  # commands whose expectations backfilling ignores


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




def _probe(pattern: str, total: int) -> tuple[dict[int, int], dict[int, Holder]]:
    """Lock every free GPU (non-blocking): (gpu -> locked fd, held gpu -> its holder).
    Queue lock held."""
    free: dict[int, int] = {}
    held: dict[int, Holder] = {}
    try:
        for gpu in range(total):
            fd = _open(gpu_path(pattern, gpu))
            if _try_lock(fd):
                free[gpu] = fd
            else:
                held[gpu] = _holder_from(_read_record_fd(fd))
                os.close(fd)
    except BaseException:
        for fd in free.values():
            os.close(fd)
        raise
    return free, held


@dataclass(frozen=True, kw_only=True)
class _Plan:
    """What the decision reads from the holders and the queue's book, besides the tickets."""

    ends: dict[int, float]  # held GPU -> expected end
    lent: dict[int, tuple[int, ...]]  # held GPU -> tickets its holder backfilled past
    distrusted: frozenset[int]  # tickets whose command overran its expectations
    book: dict[str, tuple[int, ...]]  # the overruns, with the ones seen now


def _plan_inputs(held: dict[int, Holder], tickets: Sequence[_Ticket],
                 book: dict[str, tuple[int, ...]], now: float) -> _Plan:
    # A holder past its expectation is counted here, by whoever looks first, so one that is
    # killed (and never releases) counts too; its ticket makes it once per holding.
    for h in held.values():
        if h.ticket is not None and h.overrun(now) is not None:
            book = overruns.noted(book, h.command, h.ticket)
    untrusted = overruns.distrusted(book)
    ends = {g: now if overruns.key(h.command) in untrusted else h.expected_end(now)
            for g, h in held.items()}
    return _Plan(ends=ends, lent={g: h.passed for g, h in held.items()},
                 distrusted=frozenset(t.number for t in tickets
                                      if overruns.key(_text(t.record.get("command"))) in untrusted),
                 book=book)


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
        free, held = _probe(pattern, req.total_gpus)
        queue = _live_tickets(pattern)
        tickets = [t for t in queue if t.number <= ticket]  # later ones do not matter here
        passes, book = _read_passes(qfd), _read_overruns(qfd)
        inputs = _plan_inputs(held, tickets, book, now)
        if inputs.book != book:
            _write_overruns(qfd, inputs.book)
        plan = schedule(tickets, sorted(free), inputs.ends, now, passes, lent=inputs.lent,
                        distrusted=inputs.distrusted)
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
        seconds("--expect", expect, most=MAX_EXPECT)
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
    mine = _holder_from(_read_record_fd(lease.fds[0])) if lease.fds else None
    now = time.time()
    for fd in lease.fds:
        # The record stays: while a process that inherited the descriptor still holds
        # the lock it says whose GPU this is, and once the lock is free it reads as free.
        with suppress(OSError):
            os.close(fd)
    with suppress(OSError), _queue_locked(lease.pattern) as qfd:
        if mine is not None and mine.expect is not None and mine.ticket is not None:
            # Ended within its expectation: its command is trusted again; past it: one more.
            book = _read_overruns(qfd)
            after = (overruns.noted(book, mine.command, mine.ticket)
                     if mine.overrun(now) is not None else overruns.forgiven(book, mine.command))
            if after != book:
                _write_overruns(qfd, after)
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
    # Probing takes a lock for an instant; under the queue lock no allocator of ours is
    # looking at the same moment, so the probe never makes a request fail. Reading writes
    # nothing, so a queue one may only read still shows.
    with _queue_locked(pattern, write=False) as qfd:
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
            gpus.append(GpuState(gpu=gpu, path=path, holder=None if free else _holder_from(record)))
        tickets, ignored = _queue_entries(pattern)
        passes, book = _read_passes(qfd), _read_overruns(qfd)
    held = {g.gpu: g.holder for g in gpus if g.holder is not None}
    inputs = _plan_inputs(held, tickets, book, now)
    plan = schedule(tickets, [g.gpu for g in gpus if g.holder is None], inputs.ends, now, passes,
                    lent=inputs.lent, distrusted=inputs.distrusted)
    waiters = tuple(
        Waiter(ticket=t.number, pid=_int_or_none(t.record.get("pid")),
               command=_text(t.record.get("command")),
               since=_time_or_none(t.record.get("since")), count=t.count, devices=t.devices,
               host=_text(t.record.get("host")), expect=t.expect, backfill=t.backfill,
               passes=passes.get(t.number, 0), trusted=t.number not in inputs.distrusted)
        for t in tickets)
    return Status(gpus=tuple(gpus), waiters=waiters, ignored=tuple(ignored), head=plan.head,
                  reservation=plan.reservation, now=now,
                  distrusted=tuple(sorted(overruns.distrusted(inputs.book))))


def free_now(lock_path_pattern: str = DEFAULT_PATTERN,
             total_gpus: int = DEFAULT_TOTAL_GPUS) -> tuple[int, ...]:
    """GPUs neither held nor claimed by a waiter: what a new request could take at once."""
    st = read_status(lock_path_pattern, total_gpus)
    avail = [g.gpu for g in st.gpus if g.holder is None]
    for w in st.waiters:
        _, avail = claim(w.count, w.devices, avail)
    return tuple(avail)
