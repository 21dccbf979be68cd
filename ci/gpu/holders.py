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


