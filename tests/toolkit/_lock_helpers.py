"""Helpers for the GPU lock tests: run `python -m ci lock-gpus` and read what commands recorded."""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from _ci import REPO

from ci.gpu.allocator import gpu_path

# The command run under the lock: records (monotonic clock, system-wide on Linux) when it
# starts and ends and which GPUs it was given. `-S` keeps its start-up to a few ms.
RECORDER = (
    "import os, sys, time\n"
    "log, tag, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
    "devs = os.environ.get('CUDA_VISIBLE_DEVICES', '')\n"
    "def put(what):\n"
    "    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)\n"
    "    os.write(fd, f'{time.monotonic():.6f} {what} {tag} {devs}\\n'.encode())\n"
    "    os.close(fd)\n"
    "put('start')\n"
    "time.sleep(secs)\n"
    "put('end')\n"
)


def recorder(log: Path, tag: str, secs: float) -> list[str]:
    """argv of a command that logs its start, sleeps, logs its end."""
    return [sys.executable, "-S", "-c", RECORDER, str(log), tag, str(secs)]


def lock_argv(pattern: str, flags: Sequence[str], command: Sequence[str]) -> list[str]:
    """argv of `python -m ci lock-gpus FLAGS -- COMMAND`."""
    return [sys.executable, "-m", "ci", "lock-gpus", "--lock-path-pattern", pattern,
            *flags, "--", *command]


def spawn(argv: Sequence[str]) -> subprocess.Popen[str]:
    """Start a process in its own group, text pipes, from the repository root."""
    return subprocess.Popen(list(argv), cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)


def descendants(pid: int) -> list[int]:
    """Pids of every live descendant of `pid` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rfind(b")") + 2:].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a process we started and everything under it (the command runs in its own
    process group), then reap it."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
    proc.communicate(timeout=10)


@dataclass(frozen=True, kw_only=True)
class Run:
    """One recorded command: its tag, GPUs and [start, end] on the monotonic clock."""

    tag: str
    devices: tuple[int, ...]
    start: float
    end: float


def read_runs(log: Path) -> list[Run]:
    """Pair the start/end lines a recorder wrote."""
    starts: dict[str, tuple[float, tuple[int, ...]]] = {}
    runs = []
    for line in log.read_text().splitlines():
        parts = line.split()
        when, what, tag = float(parts[0]), parts[1], parts[2]
        devs = tuple(int(d) for d in parts[3].split(",")) if len(parts) > 3 else ()
        if what == "start":
            starts[tag] = (when, devs)
        else:
            t0, d0 = starts.pop(tag)
            assert d0 == devs
            runs.append(Run(tag=tag, devices=devs, start=t0, end=when))
    assert not starts, f"commands that started but never ended: {sorted(starts)}"
    return runs


def overlaps(runs: Sequence[Run]) -> list[tuple[str, str, int]]:
    """Pairs of runs that used the same GPU at the same time."""
    bad = []
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            shared = set(a.devices) & set(b.devices)
            if shared and a.start < b.end and b.start < a.end:
                bad.append((a.tag, b.tag, min(shared)))
    return bad


def wait_for(predicate: Callable[[], object], timeout: float = 10.0, step: float = 0.01) -> float:
    """Poll until predicate() is true; returns the monotonic time it became true."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(step)


@contextlib.contextmanager
def held_with(pattern: str, gpu: int, record: bytes) -> Iterator[None]:
    """GPU `gpu` locked by this process (another open file) with `record` as its holder record."""
    path = Path(gpu_path(pattern, gpu))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(record)
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
