"""Process groups: start a command in a group of its own, wait for it, stop all of it.

The one place that supervises processes for the runner (`ci.runner`), `lock-gpus`
(`ci.lock_cli`) and the e2e helpers (`U.exec_command`, the private Ray head).
Standard library only: it runs in containers that have nothing but Python. `U`, which
runs inside test entries where the toolkit is not installed, imports a generated copy
(slime/utils/external_utils/proc_utils.py; see ci/u_files.py).

- `start` runs a command as the leader of a new session, so signalling its group
  reaches everything it started and nothing else.
- `wait_unreaped` waits for the leader without reaping it: while the leader is an
  unreaped zombie its pid, which is also the group id, cannot be reused, so a later
  `killpg` can only reach this command's processes.
- `stop_group` sends SIGTERM, gives the group `grace` seconds, then SIGKILL.
- `exit_code` maps "killed by signal N" to 128+N, as shells do.
- `Guard` makes groups die with their supervisor, however it dies (SIGKILL, OOM):
  a watcher process reads a pipe only the supervisor can write to; at end-of-file it
  SIGKILLs every group still registered. The kernel's parent-death signal is no
  substitute: it reaches only the leader, not its group, and fires when the *thread*
  that forked it exits, which in a threaded runner is not when the runner dies.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
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


def stop_group(pgid: int, grace: float) -> None:
    """SIGTERM the group, wait up to `grace` seconds for it to empty, then SIGKILL what is left.

    Call it while the leader is unreaped (see `wait_unreaped`), so `pgid` is still ours.
    """
    if not group_members(pgid):
        return
    signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if group_members(pgid):
        signal_group(pgid, signal.SIGKILL)


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
