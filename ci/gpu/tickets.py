"""The ticket queue: the queue lock, its counters, and one ticket file per waiter.

`queue_path(P)` holds a ticket counter and a generation counter (a fixed header), then the
times each waiter was passed by backfilling; every decision is taken under its flock.
`tickets_dir(P)` holds one `<ticket>.json` per waiter, flocked while it waits: a ticket
whose lock is free belongs to a dead waiter and is dropped. Anything else in it is skipped
with a reason (`gpu-status` lists them): any local user can create names there.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from ci.errors import UsageError
from ci.gpu.holders import (
    _RECORD_LIMIT,
    _expect_or_none,
    _int_or_none,
    _ints,
    _open,
    _read_record_fd,
    _try_lock,
    _write_record_fd,
)
from ci.gpu.safe_open import TICKET_MODE, trusted_owners

_HEADER = 64
_OVERRUNS = "overruns"  # the book's one key that is no ticket number (ci/gpu/overruns.py)

_TICKET_NAME = re.compile(r"(\d{12})\.json")
# Sticky and world-writable, like /dev/shm itself: runners of several users may queue here,
# and nobody can remove or replace another user's ticket.
_TICKETS_MODE = 0o1777


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


def queue_path(pattern: str) -> str:
    """The queue lock file: ticket and generation counters, guarded by its own flock."""
    return pattern.format(gpu_id="queue")


def tickets_dir(pattern: str) -> str:
    """The directory holding one ticket file per waiter."""
    return queue_path(pattern) + ".d"


@contextmanager
def _queue_locked(pattern: str, *, write: bool = True) -> Iterator[int]:
    # A fresh open per use: flocks belong to the open file description, so two threads of
    # one process exclude each other exactly as two processes do.
    path = queue_path(pattern)
    fd = _open(path)
    try:
        if write:
            _check_writable(fd, path)
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield fd
    finally:
        os.close(fd)


def _check_writable(fd: int, path: str) -> None:
    # The opener falls back to read-only for a trusted user's file we may not write (a lock
    # directory another user's umask made 0644): flocks work, but the counters cannot move,
    # which surfaced as "Bad file descriptor" from the first write.
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE == os.O_RDONLY:
        st = os.fstat(fd)
        raise UsageError(f"{path}: the GPU queue belongs to uid {st.st_uid} with mode "
                         f"{stat.S_IMODE(st.st_mode):o}, so you cannot queue in it; its owner "
                         "can `chmod 666` it, or pass a --lock-path-pattern of your own")


def _read_counters(fd: int) -> tuple[int, int]:
    parts = os.pread(fd, _HEADER, 0).split()
    try:
        return int(parts[1]), int(parts[2])
    except (IndexError, ValueError):
        return 0, 0


def _write_counters(fd: int, ticket: int, gen: int) -> None:
    os.pwrite(fd, f"v1 {ticket:020d} {gen:020d}\n".encode().ljust(_HEADER - 1) + b"\n", 0)


def _read_book(fd: int) -> dict[str, object]:
    # After the counters' header: {"<ticket>": times passed, ..., "overruns": {command: [..]}}.
    try:
        raw = json.loads(os.pread(fd, _RECORD_LIMIT, _HEADER).decode("utf-8", "replace") or "{}")
    except (ValueError, RecursionError):
        return {}
    return raw if isinstance(raw, dict) else {}


def _passes_in(book: dict[str, object]) -> dict[int, int]:
    passes = {}
    for key, value in book.items():
        n = _int_or_none(value)
        # isascii: "²".isdigit() is true, and int("²") raises.
        if key.isascii() and key.isdigit() and n is not None:
            passes[int(key)] = n
    return passes


def _overruns_in(book: dict[str, object]) -> dict[str, tuple[int, ...]]:
    raw = book.get(_OVERRUNS)
    if not isinstance(raw, dict):
        return {}
    return {k: _ints(v) for k, v in raw.items() if isinstance(k, str) and _ints(v)}


def _read_passes(fd: int) -> dict[int, int]:
    """Times each waiter was passed by backfilling, kept after the counters' header."""
    return _passes_in(_read_book(fd))


def _read_overruns(fd: int) -> dict[str, tuple[int, ...]]:
    """Per command, its last holdings (tickets) in a row that ran past their expectation."""
    return _overruns_in(_read_book(fd))


def _write_book(fd: int, passes: dict[int, int], overruns: dict[str, tuple[int, ...]]) -> None:
    book: dict[str, object] = {str(k): v for k, v in sorted(passes.items())}
    if overruns:
        book[_OVERRUNS] = {k: list(v) for k, v in sorted(overruns.items())}
    data = json.dumps(book).encode()
    os.ftruncate(fd, _HEADER)
    os.pwrite(fd, data, _HEADER)


def _write_passes(fd: int, passes: dict[int, int]) -> None:
    _write_book(fd, passes, _read_overruns(fd))


def _write_overruns(fd: int, overruns: dict[str, tuple[int, ...]]) -> None:
    _write_book(fd, _read_passes(fd), overruns)


def _bump(fd: int) -> None:
    ticket, gen = _read_counters(fd)
    _write_counters(fd, ticket, gen + 1)


def _read_gen(fd: int) -> int:
    return _read_counters(fd)[1]



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
    devs = _ints(devices) if isinstance(devices, list) else None
    if (count is None) == (devs is None) or count == 0:
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
                             | os.O_CLOEXEC, TICKET_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise UsageError(f"{path}: cannot queue for GPUs ({exc.strerror}); pass a "
                                 "--lock-path-pattern in a directory you can write") from None
            break
        else:
            raise UsageError(f"{directory}: a thousand ticket names in a row are taken; "
                             "empty the directory")
        with suppress(OSError):
            os.fchmod(fd, TICKET_MODE)  # readable by every waiter, whatever the umask
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

