"""The holder record: who holds a GPU, as written into its lock file and read back.

A GPU's lock file (`gpu_path`) is flocked by its holder, which writes one JSON record
(pid, command, host, start time, expectation, the tickets it backfilled past) into it.
Records are read capped and parsed defensively: any local user can write a lock file of
their own, so a field of the wrong type reads as absent, never as an error.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import socket
import time
from contextlib import suppress
from dataclasses import dataclass

from ci.gpu.safe_open import open_lock, read_capped
from ci.proc import alive

# Largest holder record or ticket read: ours are a few hundred bytes; a bigger one was not
# written by us and is never read whole.
_RECORD_LIMIT = 65536
# The longest expectation a request may declare (`--expect`) and a record may carry: a week.
# Past it a number means nothing for planning, and 1e300 seconds overflowed every clock
# that `gpu-status` and the timeout message print.
MAX_EXPECT = 7 * 86400.0
# Times in records are epoch seconds; one outside [0, 2**32) (year 2106) was not written by a
# clock, and `time.localtime` cannot print NaN or 1e300.
_LAST_TIME = float(2**32)
# Pids, ticket numbers and GPU indices are small non-negative ints; a forged 10**400 must not
# reach float() or a comparison that assumes a machine integer.
_LARGEST_INT = 2**63 - 1


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

    def expected_end(self, now: float) -> float:
        """When its GPUs are expected free: `since + expect`, but never before `now`.

        Without an expectation, or past it (an overrun), its GPUs may free up any moment: now.
        """
        if self.since is None or self.expect is None:
            return now
        return max(now, self.since + self.expect)

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
            parts.append(f"since {clock(self.since)}")
        return " ".join(parts)


def clock(ts: float | None) -> str:
    """A record's time as HH:MM:SS; '?' for none or one no clock can show."""
    if ts is None:
        return "?"
    try:
        return time.strftime("%H:%M:%S", time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return "?"


def gpu_path(pattern: str, gpu: int) -> str:
    """The lock file of one GPU."""
    return pattern.format(gpu_id=gpu)


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
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= _LARGEST_INT:
        return value
    return None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and abs(value) > _LARGEST_INT:
        return None  # float() of a 400-digit int raises
    got = float(value)
    return got if math.isfinite(got) else None


def _time_or_none(value: object) -> float | None:
    got = _float_or_none(value)
    return got if got is not None and 0 <= got < _LAST_TIME else None


def _expect_or_none(value: object) -> float | None:
    got = _float_or_none(value)
    return got if got is not None and 0 < got <= MAX_EXPECT else None


def _text(value: object) -> str:
    # A scalar reads as its text; a list or an object as nothing: str() of a deeply nested
    # one can itself recurse too deep, and its text would be nobody's command.
    if isinstance(value, str):
        return value
    return str(value) if isinstance(value, (int, float)) else ""


def _ints(value: object) -> tuple[int, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(v for v in (_int_or_none(item) for item in value) if v is not None)


def _holder_from(record: dict[str, object]) -> Holder:
    return Holder(pid=_int_or_none(record.get("pid")), command=_text(record.get("command")),
                  since=_time_or_none(record.get("since")), host=_text(record.get("host")),
                  child_pid=_int_or_none(record.get("child_pid")),
                  expect=_expect_or_none(record.get("expect")),
                  ticket=_int_or_none(record.get("ticket")), passed=_ints(record.get("passed")))


def expected_end(record: dict[str, object], now: float) -> float:
    """When a holder record's GPUs are expected free (see `Holder.expected_end`)."""
    return _holder_from(record).expected_end(now)


def _shorten(text: str, limit: int = 80) -> str:
    """A holder's command for one line: its program by name (a venv's interpreter path would
    use up the line before what it runs), then clipped."""
    program, sep, rest = text.partition(" ")
    if "/" in program and not program.startswith(("'", '"')):
        text = program.rsplit("/", 1)[1] + sep + rest
    return text if len(text) <= limit else text[: limit - 1] + "…"


