"""The node side of a cluster run: one entry, run as a Ray streaming task on the node Ray chose.

Runs the same launch a local run would (`Backend.plan` of the local or emulated
backend), in this node's checkout, on the GPUs Ray assigned, after taking this node's
GPU lock files for them, so someone using `lock-gpus` on the box is respected; its
process group is stopped with `ci.proc.stop_group`, as on the driver's host. While the
entry runs, `HeadWatch` checks that the head still answers; cut off from it for
`head_timeout` seconds, the task stops the entry and lets go of the GPUs (nobody can
collect this result any more, and the driver may already run the entry elsewhere). It yields
typed messages the driver turns into a live log and a result:

    Started(node_id, host, devices, pid)    the GPUs are held, the process started
    Output(text)                            output, a few lines at a time
    Ended(returncode, timed_out, seconds, junit_text)
"""

from __future__ import annotations

import os
import queue
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Generator, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ci.backends.base import Backend
from ci.backends.emulated import EmulatedBackend
from ci.backends.launch import AttemptPaths, Launch, LaunchSettings
from ci.backends.local import LocalBackend
from ci.proc import start, stop_group, wait_exit
from ci.select.entries import ResolvedEntry


@dataclass(frozen=True)
class Started:
    """The node holds the entry's GPUs and started its process."""

    node_id: str
    host: str
    devices: tuple[int, ...]
    pid: int


@dataclass(frozen=True)
class Output:
    """A few lines of the entry's output."""

    text: str


@dataclass(frozen=True)
class Ended:
    """The entry's process ended (or was stopped)."""

    returncode: int
    timed_out: bool
    seconds: float
    junit_text: str


Message = Started | Output | Ended

# The child takes SIGKILL when the worker that started it dies (a lost node, a killed
# worker): nothing is left running on a node whose driver no longer knows about it.
_LAUNCHER = ("import ctypes, os, sys\n"
             "ctypes.CDLL(None, use_errno=True).prctl(1, 9)\n"
             "if os.getppid() != int(sys.argv[1]):\n"
             "    os._exit(137)\n"
             "os.execvp(sys.argv[2], sys.argv[2:])\n")


@dataclass(frozen=True, kw_only=True)
class NodeJob:
    """What the driver sends for one attempt (plain data; pickled to the node)."""

    entry: ResolvedEntry
    root: str  # the checkout on the node (the driver's path: shared, or cloned at the same path)
    env: Mapping[str, str]  # the driver's SLIME_* flags; the node's own environment supplies the rest
    jobs: int
    pytest_args: tuple[str, ...]
    emulate_gpus: bool
    lock_pattern: str | None  # GPU lock files on the node; "{node}" is its Ray node id (None: no lock)
    lock_timeout: float
    node_gpus: int  # GPUs of the largest node: bounds the ids the node's lock accepts
    grace: float
    run_token: str  # names this run's scratch directory on the node
    attempt_name: str
    head: str = ""  # the cluster's address (host:port) as the driver joined it
    head_timeout: float = 120.0  # seconds without an answer from the head before the entry is stopped


class HeadWatch(threading.Thread):
    """Tries a TCP connection to the head every `period` seconds; `cut_off` is set once none
    has succeeded for `timeout` seconds in a row."""

    def __init__(self, head: str, timeout: float, period: float = 1.0) -> None:
        super().__init__(daemon=True, name="head-watch")
        host, _, port = head.rpartition(":")
        self.target = (host, int(port)) if host and port.isdigit() else None
        self.timeout, self.period = timeout, period
        self.cut_off = threading.Event()
        self.done = threading.Event()

    def run(self) -> None:
        if self.target is None:
            return  # "auto", ray://…: nothing to dial here
        last = time.monotonic()
        while not self.done.wait(self.period):
            try:
                socket.create_connection(self.target, timeout=min(2.0, self.timeout)).close()
                last = time.monotonic()
            except OSError:
                if time.monotonic() - last >= self.timeout:
                    self.cut_off.set()
                    return


def _pump(stream: IO[bytes], out: queue.Queue[bytes | None]) -> None:
    for line in iter(stream.readline, b""):
        out.put(line)
    out.put(None)


def _drain(lines: queue.Queue[bytes | None], wait: float) -> tuple[bytes, bool]:
    """What the pump read within `wait` seconds, and whether the output has ended."""
    chunk: list[bytes] = []
    try:
        item = lines.get(timeout=wait)
        while item is not None:
            chunk.append(item)
            item = lines.get_nowait()
        return b"".join(chunk), True
    except queue.Empty:
        return b"".join(chunk), False


def run_on_node(job: NodeJob) -> Iterator[Message]:
    """Run one attempt on this node; a generator, so Ray streams each message to the driver."""
    import ray

    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    host = socket.gethostname()
    devices = tuple(sorted(int(g) for g in ray.get_gpu_ids()))
    scratch = Path(tempfile.gettempdir()) / f"slime-ci-{job.run_token}" / job.attempt_name
    paths = AttemptPaths(name=job.attempt_name, log=scratch / "entry.log", junit=scratch / "junit.xml",
                         out_dir=scratch / "out", tmp_dir=scratch / "tmp")
    paths.tmp_dir.mkdir(parents=True, exist_ok=True)
    paths.out_dir.mkdir(parents=True, exist_ok=True)
    if not Path(job.root).is_dir():
        yield Started(node_id, host, devices, 0)
        yield Output(f"checkout {job.root} does not exist on {host} (node {node_id[:8]})\n")
        yield Ended(2, False, 0.0, "")
        return
    settings = LaunchSettings(root=Path(job.root), python=sys.executable, base_env={**os.environ, **job.env},
                              jobs=job.jobs, pytest_args=job.pytest_args)
    # The same backend a run on this box would use; its lock is taken below, on Ray's GPUs.
    here: Backend = (EmulatedBackend(gpus=len(devices), lock_path_pattern="unused")
                     if job.emulate_gpus else LocalBackend(gpus=len(devices)))
    launch = here.launch_spec(job.entry, settings, devices=devices, paths=paths).launch
    with ExitStack() as stack:
        if devices and job.lock_pattern:
            from ci.gpu.allocator import hold

            pattern = job.lock_pattern.replace("{node}", node_id)
            Path(pattern.format(gpu_id=0)).parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(hold(devices=devices, total_gpus=max(job.node_gpus, max(devices) + 1),
                                     lock_path_pattern=pattern, timeout=job.lock_timeout,
                                     command=f"{job.entry.id} (cluster run {job.run_token})"))
        ended = yield from _supervise(job, launch, Started(node_id, host, devices, 0))
        junit_text = (paths.junit.read_text(encoding="utf-8", errors="replace")
                      if paths.junit.is_file() else "")
    shutil.rmtree(paths.tmp_dir, ignore_errors=True)
    if ended.returncode == 0 and not ended.timed_out:
        shutil.rmtree(scratch, ignore_errors=True)
    yield Ended(ended.returncode, ended.timed_out, ended.seconds, junit_text)


def _supervise(job: NodeJob, launch: Launch, started: Started) -> Generator[Message, None, Ended]:
    """Start the entry's group, stream its output, stop it at its timeout or when cancelled.

    Returns (as the generator's value) an `Ended` without the JUnit text."""
    begin = time.monotonic()
    proc: subprocess.Popen[bytes] = start(
        [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *launch.argv], cwd=job.root, env=launch.env,
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    lines: queue.Queue[bytes | None] = queue.Queue()
    threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
    deadline = begin + job.entry.timeout
    timed_out = False
    head = HeadWatch(job.head, job.head_timeout)
    head.start()
    try:
        yield Started(started.node_id, started.host, started.devices, proc.pid)
        done = False
        while not done:
            chunk, done = _drain(lines, 0.2)
            if chunk:
                yield Output(chunk.decode("utf-8", "replace"))
            if not timed_out and time.monotonic() > deadline:
                timed_out = True
                stop_group(proc.pid, job.grace)  # the leader is unreaped: the group is ours
            if head.cut_off.is_set():
                yield Output(f"[slime-ci] the head at {job.head} has not answered for "
                             f"{job.head_timeout:.0f}s: entry stopped on {started.host}\n")
                stop_group(proc.pid, job.grace)
                break
        if not wait_exit(proc.pid, max(0.0, deadline - time.monotonic())) and not timed_out:
            timed_out = True  # the output ended, the process did not, and its time is up
    finally:
        # Cancelled (Ctrl-C on the driver) or done: nothing of the entry outlives the task.
        head.done.set()
        stop_group(proc.pid, job.grace)
        returncode = proc.wait()
    return Ended(returncode, timed_out, time.monotonic() - begin, "")
