"""The local-process executor: one attempt as a process group of this host (`ci.proc`).

Shared by every backend whose entries are processes here: local, Docker (the process
is `docker run`), emulated GPUs, and pre-forked pytest files (a child forked by a
pre-imported worker, `ci.backends.prefork`, supervised exactly like a fresh interpreter).

One attempt: create its output and temp dirs, assemble its launch (`Backend.plan`),
start the group (or have this thread's worker fork it), track it in the run's
`Groups` so a Ctrl-C stops it, wait up to the entry's timeout, then stop the group
(`ci.proc.stop_group`), kill what the file left behind, and reap the leader only
after the group was forgotten, so a reused pid is never signalled.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from dataclasses import replace

from ci.backends.base import AttemptEvents, Backend, Lease, RunContext
from ci.backends.launch import AttemptPaths, Launch, worker_env
from ci.backends.prefork import ForkedChild, Slots
from ci.proc import exit_code, finish, process_guard, signal_group, stop_group, wait_exit
from ci.proc import start as start_group
from ci.results import Attempt
from ci.select.entries import ResolvedEntry


class ProcessExecutor:
    """Runs attempts as local process groups for one backend during one run."""

    def __init__(self, backend: Backend, run: RunContext) -> None:
        self.backend = backend
        self.run = run
        s = run.settings
        self.slots = Slots(python=s.python, root=s.root, env=worker_env(s), preload=s.prefork.preload,
                           logs=run.logs, note=run.note)

    def attempt(self, entry: ResolvedEntry, lease: Lease | None, paths: AttemptPaths,
                events: AttemptEvents) -> Attempt:
        paths.out_dir.mkdir(parents=True, exist_ok=True)
        paths.tmp_dir.mkdir(parents=True, exist_ok=True)
        devices = tuple(lease.devices) if lease is not None else ()
        started_at = time.time()
        try:
            plan = self.backend.launch_spec(entry, self.run.settings, devices=devices, paths=paths)
            events.started()
            forked = (self.slots.fork(plan.launch.argv, env=plan.launch.env, log=paths.log)
                      if plan.forked else None)
            attempt = self._supervise(plan.launch, paths, timeout=entry.timeout, lease=lease,
                                      forked=forked)
            if attempt.timed_out or attempt.interrupted:
                self.backend.abort(plan.launch)
        finally:
            shutil.rmtree(paths.tmp_dir, ignore_errors=True)
        return replace(attempt, devices=devices, started_at=started_at)

    def _supervise(self, launch: Launch, paths: AttemptPaths, *, timeout: float,
                   lease: Lease | None, forked: ForkedChild | None) -> Attempt:
        groups, guard = self.run.groups, process_guard()
        start = time.monotonic()
        child: subprocess.Popen[bytes] | None = None
        if forked is not None:
            # Already running, forked by a worker that keeps it unreaped until `reap`.
            pgid = forked.pid
            guard.register(pgid)
        else:
            with paths.log.open("wb") as out:
                # The child inherits the lock descriptors: while any process of the entry lives,
                # its flocks stay held, never freed under a running test. The guard kills the
                # group if this runner dies without cleaning up (SIGKILL, OOM).
                child = start_group(launch.argv, cwd=self.run.settings.root, env=launch.env,
                                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                    guard=guard, pass_fds=tuple(lease.fds) if lease is not None else ())
            pgid = child.pid
        if not groups.add(pgid):
            signal_group(pgid, signal.SIGKILL)  # started just as the run was being stopped
        if lease is not None:
            lease.note_child(pgid)
        timed_out = False
        try:
            if not wait_exit(pgid, timeout):
                timed_out = True
                stop_group(pgid, self.run.grace)  # the leader is unreaped: the group is ours
                wait_exit(pgid)
            if forked is not None:
                forked.wait_exited()
        finally:
            signal_group(pgid, signal.SIGKILL)  # whatever the file left behind
            groups.discard(pgid)  # before reaping: afterwards the group id may name a stranger
            if forked is not None:
                guard.unregister(pgid)
                returncode = exit_code(forked.reap())
            else:
                assert child is not None
                returncode = finish(child, guard=guard)
        return Attempt(returncode=returncode, seconds=time.monotonic() - start, timed_out=timed_out,
                       interrupted=groups.stopping.is_set())

    def close(self) -> None:
        self.slots.close()



class LocalProcessBackend(Backend):
    """A backend whose attempts are process groups of this host, run by `ProcessExecutor`."""

    def __init__(self, *, gpus: int = 0) -> None:
        super().__init__(gpus=gpus)
        self._executor: ProcessExecutor | None = None

    def open_run(self, run: RunContext) -> None:
        super().open_run(run)
        self._executor = ProcessExecutor(self, run)

    def run_attempt(self, entry: ResolvedEntry, lease: Lease | None, paths: AttemptPaths,
                    events: AttemptEvents) -> Attempt:
        if self._executor is None:
            raise RuntimeError(f"{type(self).__name__}.run_attempt before open_run")
        return self._executor.attempt(entry, lease, paths, events)

    def close_run(self) -> None:
        if self._executor is not None:
            self._executor.close()
            self._executor = None
