"""Run an agent command with a time budget and a done-marker protocol.

The command is wrapped so that, when it exits, its exit status is written to a
marker file (atomically: written aside, then renamed). Completion is the
marker appearing, not the exec call returning, because a remote sandbox's exec
channel can drop or return early while the agent still runs; the same
protocol runs locally so it is tested here. After completion or the budget,
the command's whole process group is ended, so nothing it started lingers.

`Sandbox` is the interface (start, read a file, remove a file); `LocalSandbox`
runs commands as local subprocesses. Spawning goes through a `SpawnGate`: a
bounded slot held only while a sandbox starts, released even when the start
fails or is cancelled, and kept per event loop so one rollout call never
leaves the next one waiting on a lock bound to a loop that is gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import shlex
import signal
import time
import uuid
import weakref
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from slime.utils.external_utils.proc_utils import signal_group, stop_group, wait_until

OUTPUT_TAIL_BYTES = 16 * 1024


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """How an agent command ended."""

    done: bool  # the done marker appeared
    returncode: int | None  # the command's exit status, from the marker; None if unknown
    timed_out: bool
    duration_s: float
    stdout: str  # the tail of it
    stderr: str


class ProcessHandle(Protocol):
    """A started command."""

    async def alive(self) -> bool: ...

    async def terminate(self, grace_s: float) -> None: ...

    async def output(self) -> tuple[str, str]:
        """The tails of stdout and stderr; called once, after the command ended."""
        ...


class Sandbox(Protocol):
    """Where agent commands run: local here, a container or VM elsewhere."""

    workdir: str

    async def start(self, command: str, env: Mapping[str, str]) -> ProcessHandle: ...

    async def read_text(self, path: str) -> str | None: ...

    async def remove(self, path: str) -> None: ...


class SpawnGate:
    """At most `limit` sandboxes starting at once; the slot is held only for the start."""

    def __init__(self, limit: int = 1) -> None:
        if limit < 1:
            raise ValueError("spawn limit must be at least 1")
        self.limit = limit
        self._by_loop: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )
        self.in_use = 0
        self.peak = 0

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one spawn slot for the block."""
        loop = asyncio.get_running_loop()
        sem = self._by_loop.setdefault(loop, asyncio.Semaphore(self.limit))
        async with sem:
            self.in_use += 1
            self.peak = max(self.peak, self.in_use)
            try:
                yield
            finally:
                self.in_use -= 1


class _LocalProcess:
    def __init__(self, proc: asyncio.subprocess.Process, out: Path, err: Path) -> None:
        self._proc = proc
        self._out, self._err = out, err

    async def alive(self) -> bool:
        return self._proc.returncode is None

    async def terminate(self, grace_s: float) -> None:
        # The command runs in its own session: stop its group, never processes by name.
        # Done when the leader has exited (the event loop reaps it and sets returncode).
        proc = self._proc
        await asyncio.to_thread(stop_group, proc.pid, grace_s,
                                finished=lambda s: wait_until(lambda: proc.returncode is not None, s))
        signal_group(proc.pid, signal.SIGKILL)  # the leader is gone; its children may not be
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)

    async def output(self) -> tuple[str, str]:
        tails = _tail(self._out), _tail(self._err)
        self._out.unlink(missing_ok=True)
        self._err.unlink(missing_ok=True)
        return tails


def _tail(path: Path) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, path.stat().st_size - OUTPUT_TAIL_BYTES))
            return f.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


class LocalSandbox:
    """Commands run as local subprocesses in `workdir`, each in its own process group."""

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = str(workdir)

    async def start(self, command: str, env: Mapping[str, str]) -> ProcessHandle:
        """Start `command` under bash; stdout and stderr go to files, so a full pipe never blocks it."""
        tag = uuid.uuid4().hex[:12]
        out, err = Path(self.workdir, f".stdout-{tag}.log"), Path(self.workdir, f".stderr-{tag}.log")
        with out.open("wb") as fo, err.open("wb") as fe:
            proc = await asyncio.create_subprocess_exec(
                "bash", "-c", command, cwd=self.workdir, env=dict(env),
                stdin=asyncio.subprocess.DEVNULL, stdout=fo, stderr=fe, start_new_session=True,
            )  # fmt: skip
        return _LocalProcess(proc, out, err)

    async def read_text(self, path: str) -> str | None:
        """A file's text, or None when it does not exist."""
        try:
            return Path(path).read_text()
        except FileNotFoundError:
            return None

    async def remove(self, path: str) -> None:
        """Delete a file if it exists."""
        Path(path).unlink(missing_ok=True)


def wrap_with_marker(command: str, marker: str) -> str:
    """The command, followed by writing its exit status to `marker` atomically."""
    q = shlex.quote(marker)
    return f"( {command}\n); echo $? > {q}.tmp && mv {q}.tmp {q}"


async def exec_and_wait(
    sandbox: Sandbox,
    command: str,
    *,
    env: Mapping[str, str],
    budget_s: float,
    gate: SpawnGate,
    poll_s: float = 0.05,
    grace_s: float = 2.0,
) -> ExecResult:
    """Run `command` in the sandbox until its done marker appears or `budget_s` runs out."""
    marker = f"{sandbox.workdir}/.done-{uuid.uuid4().hex}"
    start = time.monotonic()
    async with gate.slot():
        handle = await sandbox.start(wrap_with_marker(command, marker), env)
    deadline = start + budget_s
    status: str | None = None
    try:
        while True:
            status = await sandbox.read_text(marker)
            if status is not None or not await handle.alive():
                break
            if time.monotonic() >= deadline:
                break
            await asyncio.sleep(poll_s)
        if status is None:
            status = await sandbox.read_text(marker)  # it may have landed as the process exited
    finally:
        await handle.terminate(grace_s)  # ends whatever the command left running
        await sandbox.remove(marker)
    stdout, stderr = await handle.output()
    code = status.strip() if status is not None else ""
    return ExecResult(
        done=status is not None,
        returncode=int(code) if code.isdigit() else None,
        timed_out=status is None and time.monotonic() >= deadline,
        duration_s=time.monotonic() - start,
        stdout=stdout,
        stderr=stderr,
    )
