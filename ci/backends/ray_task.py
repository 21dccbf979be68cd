"""The node side of a cluster run: one entry, run as a Ray streaming task on the node Ray chose.

Runs the same argv and environment a local run would (`ci.runner.base_argv`,
`entry_env` and the local or emulated backend's `launch`), in this node's
checkout, on the GPUs Ray assigned, after taking this
node's GPU lock files for them, so someone using `lock-gpus` on the box is respected.
It yields messages the driver turns into a live log and a result:

    ("start", node_id, hostname, devices, pid)   the GPUs are held, the process started
    ("log", text)                                 output, a few lines at a time
    ("end", returncode, timed_out, seconds, junit_text)
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, suppress
from dataclasses import dataclass
from pathlib import Path

from ci.backends.base import Backend
from ci.backends.emulated import EmulatedBackend
from ci.backends.local import LocalBackend
from ci.plan import PlannedEntry
from ci.runner import RunConfig, base_argv, entry_env

Message = tuple[object, ...]

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

    entry: PlannedEntry
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


def _kill_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _pump(stream: object, out: queue.Queue[bytes | None]) -> None:
    assert hasattr(stream, "readline")
    for line in iter(stream.readline, b""):
        out.put(line)
    out.put(None)


def run_on_node(job: NodeJob) -> Iterator[Message]:
    """Run one attempt on this node; a generator, so Ray streams each message to the driver."""
    import ray

    from ci.gpu_lock import hold

    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    host = socket.gethostname()
    devices = tuple(sorted(int(g) for g in ray.get_gpu_ids()))
    scratch = Path(tempfile.gettempdir()) / f"slime-ci-{job.run_token}" / job.attempt_name
    tmp_dir, out_dir = scratch / "tmp", scratch / "out"
    tmp_dir.mkdir(parents=True, exist_ok=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    junit = scratch / "junit.xml"
    cfg = RunConfig(root=Path(job.root), work_dir=scratch, jobs=job.jobs, python=sys.executable,
                    base_env={**os.environ, **job.env}, pytest_args=job.pytest_args)
    # The same backend a run on this box would use; its lock is taken below, on Ray's GPUs.
    here: Backend = (EmulatedBackend(gpus=len(devices), lock_path_pattern="unused")
                     if job.emulate_gpus else LocalBackend(gpus=len(devices)))
    if not Path(job.root).is_dir():
        yield ("start", node_id, host, devices, 0)
        yield ("log", f"checkout {job.root} does not exist on {host} (node {node_id[:8]})\n")
        yield ("end", 2, False, 0.0, "")
        return
    launch = here.launch(job.entry, tuple(base_argv(job.entry, cfg, junit)),
                         entry_env(job.entry, cfg, devices=devices, out_dir=out_dir, tmp_dir=tmp_dir),
                         devices)
    argv, env = launch.argv, dict(launch.env)
    with ExitStack() as stack:
        if devices and job.lock_pattern:
            pattern = job.lock_pattern.replace("{node}", node_id)
            Path(pattern.format(gpu_id=0)).parent.mkdir(parents=True, exist_ok=True)
            stack.enter_context(hold(devices=devices, total_gpus=max(job.node_gpus, max(devices) + 1),
                                     lock_path_pattern=pattern, timeout=job.lock_timeout,
                                     command=f"{job.entry.id} (cluster run {job.run_token})"))
        start = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", _LAUNCHER, str(os.getpid()), *argv], cwd=job.root, env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        lines: queue.Queue[bytes | None] = queue.Queue()
        threading.Thread(target=_pump, args=(proc.stdout, lines), daemon=True).start()
        timed_out = False
        deadline = start + job.entry.timeout
        try:
            yield ("start", node_id, host, devices, proc.pid)
            done = False
            while not done:
                chunk: list[bytes] = []
                try:
                    item = lines.get(timeout=0.2)
                    while True:
                        if item is None:
                            done = True
                            break
                        chunk.append(item)
                        item = lines.get_nowait()
                except queue.Empty:
                    pass
                if chunk:
                    yield ("log", b"".join(chunk).decode("utf-8", "replace"))
                if not timed_out and time.monotonic() > deadline:
                    timed_out = True
                    _kill_group(proc.pid, signal.SIGTERM)
                    threading.Timer(job.grace, _kill_group, (proc.pid, signal.SIGKILL)).start()
            proc.wait()
        finally:
            # Cancelled (Ctrl-C on the driver) or done: nothing of the entry outlives the task.
            _kill_group(proc.pid, signal.SIGTERM)
            if proc.poll() is None:
                with suppress(subprocess.TimeoutExpired):
                    proc.wait(job.grace)
            _kill_group(proc.pid, signal.SIGKILL)
            proc.wait()
        seconds = time.monotonic() - start
        junit_text = junit.read_text(encoding="utf-8", errors="replace") if junit.is_file() else ""
    shutil.rmtree(tmp_dir, ignore_errors=True)
    if proc.returncode == 0 and not timed_out:
        shutil.rmtree(scratch, ignore_errors=True)
    yield ("end", proc.returncode, timed_out, seconds, junit_text)
