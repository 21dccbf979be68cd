"""Process groups: start a command in a group of its own, wait for it, stop all of it.

The one place that supervises processes for the runner (`ci.run.runner`), `lock-gpus`
(`ci.gpu.lock_gpus`) and the e2e helpers (`U.exec_command`, the private Ray head).
Standard library only: it runs in containers that have nothing but Python. `U`, which
runs inside test entries where the toolkit is not installed, imports a generated copy
(slime/utils/external_utils/proc_utils.py; see ci/registry/u_files.py).

- `start` runs a command as the leader of a new session, so signalling its group
  reaches everything it started and nothing else.
- `wait_unreaped` waits for the leader without reaping it: while the leader is an
  unreaped zombie its pid, which is also the group id, cannot be reused, so a later
  `killpg` can only reach this command's processes.
- `wait_exit` waits, with an optional timeout, for a process to exit, leaving a child of
  ours unreaped.
- `stop_group` is the one way to stop a process group: SIGTERM, up to `grace` seconds
  for it to finish, then SIGKILL. `Groups` does the same for every group a supervisor
  tracks at once (Ctrl-C of a run), signalling only groups whose leaders are unreaped.
  Every supervisor in the toolkit and in slime stops its groups through these two.
- `exit_code` maps "killed by signal N" to 128+N, as shells do.
- `Guard` makes groups die with their supervisor, however it dies (SIGKILL, OOM):
  a watcher process reads a pipe only the supervisor can write to; at end-of-file it
  SIGKILLs every group still registered. The kernel's parent-death signal is no
  substitute: it reaches only the leader, not its group, and fires when the *thread*
  that forked it exits, which in a threaded runner is not when the runner dies.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import IO, Any

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_code(returncode: int) -> int:
    """A Popen returncode as a shell reports it: killed by signal N -> 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def signal_group(pgid: int, sig: int) -> None:
    """Signal a process group; a group that is already gone is not an error."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_members(pgid: int, *, leader: int | None = None) -> list[int]:
    """Live (non-zombie) pids in process group `pgid`, other than `leader`."""
    members = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    for name in names:
        if not name.isdigit() or int(name) == leader:
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            members.append(int(name))
    return members


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != b"Z"


def wait_unreaped(pid: int) -> None:
    """Block until child `pid` exits, leaving it unreaped (its pid cannot be reused yet)."""
    while True:
        try:
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
            return
        except ChildProcessError:
            return  # already reaped elsewhere
        except InterruptedError:  # pragma: no cover - PEP 475 retries; kept for clarity
            continue


def _exited(pid: int) -> bool:
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # not our child (a worker's fork), or reaped already
        return not alive(pid)


def wait_exit(pid: int, timeout: float | None = None) -> bool:
    """Wait up to `timeout` seconds (None: for ever) for process `pid` to exit; True when it has.

    A child of ours is left unreaped, so its pid (its group id) stays ours. Works for a
    process forked by someone else too (a pre-imported worker's child), by its pidfd.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # gone already, or no pidfd on this kernel: poll
        pidfd = -1
    try:
        while not _exited(pid):
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            if pidfd >= 0:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(0.05 if left is None else min(0.05, left))
        return True
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def wait_until(done: Callable[[], bool], seconds: float) -> bool:
    """Poll `done()` for up to `seconds`; True as soon as it is."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def terminate(send: Callable[[int], object], finished: Callable[[float], bool], grace: float) -> bool:
    """The stopping protocol itself: `send(SIGTERM)`, `finished(grace)` (waits up to that many
    seconds, says whether all is done), else `send(SIGKILL)`. True when SIGTERM sufficed."""
    send(signal.SIGTERM)
    if finished(grace):
        return True
    send(signal.SIGKILL)
    return False


def stop_group(pgid: int, grace: float, *, finished: Callable[[float], bool] | None = None) -> None:
    """SIGTERM the group, give it up to `grace` seconds to finish, then SIGKILL what is left.

    `finished(seconds)` waits that long at most for the group to be done and says whether
    it is; by default, done is "no live member left" (and an empty group is not signalled).
    Call it while the leader is unreaped (see `wait_exit`), so `pgid` is still ours.
    """
    if finished is None:
        if not group_members(pgid):
            return
        finished = lambda seconds: wait_until(lambda: not group_members(pgid), seconds)  # noqa: E731
    terminate(lambda sig: signal_group(pgid, sig), finished, grace)


class Groups:
    """The process groups a supervisor runs, so that one call can stop them all (and only them).

    A group is added right after it starts and discarded before its leader is reaped;
    signals are sent under the lock that discarding takes, so a group id that may already
    name a stranger's process is never signalled. Once `stop` has begun, `add` says so and
    the caller kills the group it just started.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()
        self.stopping = threading.Event()

    def add(self, pgid: int) -> bool:
        """Track a running group; False when stopping has begun (the caller kills it)."""
        with self._lock:
            self._pgids.add(pgid)
            # Under the lock `stop` signals with: a group added after its signal sees
            # `stopping` set here, so no group can start unnoticed.
            return not self.stopping.is_set()

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def _signal(self, sig: int) -> None:
        with self._lock:
            for pgid in self._pgids:
                signal_group(pgid, sig)

    def _empty(self) -> bool:
        with self._lock:
            return not self._pgids

    def stop(self, grace: float) -> None:
        """Every tracked group: SIGTERM, up to `grace` seconds for their leaders to exit, SIGKILL."""
        with self._lock:
            self.stopping.set()
        terminate(self._signal, lambda seconds: wait_until(self._empty, seconds), grace)


_GUARD_CODE = """
import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
groups = set()
for line in sys.stdin.buffer:
    word = line.strip()
    if word[:1] == b"+":
        groups.add(int(word[1:]))
    elif word[:1] == b"-":
        groups.discard(int(word[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Guard:
    """Kills registered process groups when this process dies, by any means.

    One watcher per supervising process, started on first use, in a session of its
    own (a Ctrl-C or a `killpg` aimed at the supervisor's group does not reach it).
    Register a group right after starting it; unregister it before reaping its leader.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._owner = -1

    def _pipe(self) -> IO[bytes] | None:
        # A forked child (multiprocessing) inherits the object but not the watcher's loyalty.
        if self._proc is None or self._owner != os.getpid():
            try:
                self._proc = subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _GUARD_CODE], stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
            except OSError:
                return None  # supervision still works; only death-by-SIGKILL is uncovered
            self._owner = os.getpid()
        return self._proc.stdin

    def _send(self, text: str) -> None:
        with self._lock:
            pipe = self._pipe()
            if pipe is None:
                return
            with suppress(OSError, ValueError):
                pipe.write(text.encode())
                pipe.flush()

    def register(self, pgid: int) -> None:
        self._send(f"+{pgid}\n")

    def unregister(self, pgid: int) -> None:
        self._send(f"-{pgid}\n")

    @property
    def pid(self) -> int | None:
        """The watcher's pid (tests), once started."""
        return self._proc.pid if self._proc is not None else None


_GUARD = Guard()


def process_guard() -> Guard:
    """This process's guard (one watcher per process, shared by every thread)."""
    return _GUARD


def start(argv: Sequence[str], *, cwd: str | Path | None = None, env: Mapping[str, str] | None = None,
          stdin: int | IO[Any] | None = None, stdout: int | IO[Any] | None = None,
          stderr: int | IO[Any] | None = None, pass_fds: Sequence[int] = (), text: bool = False,
          guard: Guard | None = None) -> subprocess.Popen[Any]:
    """Start `argv` as the leader of a new session (its own process group).

    With `guard`, the group is registered with it at once, so it dies with this process.
    """
    proc: subprocess.Popen[Any] = subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env) if env is not None else None, stdin=stdin,
        stdout=stdout, stderr=stderr, pass_fds=tuple(pass_fds), text=text, start_new_session=True)
    if guard is not None:
        guard.register(proc.pid)
    return proc


def finish(proc: subprocess.Popen[Any], *, guard: Guard | None = None) -> int:
    """Unregister the group and reap the leader; returns its exit code as a shell would."""
    if guard is not None:
        guard.unregister(proc.pid)
    return exit_code(proc.wait())
