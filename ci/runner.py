"""Run planned entries: one process per test file, each in its own process group.

Each file gets a fresh interpreter, or — CPU pytest entries on the local backend, when
the run allows it — a child forked from a pre-imported worker (`ci.prefork`): the
same isolation without paying for the torch import once per file.

Why one process group per file: import-time stubs in one test file must never
leak into another, and a timeout must kill everything the file started — the
original CI's `pkill -9 <name>` clean-up killed other people's processes instead.

What an entry's process is (its command, environment, abort) is the backend's
(`ci.backends`, chosen once per run); groups are started, waited for and stopped by
`ci.proc`, whose guard kills them should the runner itself die; signals reach the
run through `ci.interrupts`; outcomes are judged by `ci.results`.
"""

from __future__ import annotations

import getpass
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ci.backends.base import Backend, EntryEnv
from ci.backends.local import LocalBackend
from ci.errors import CIError, WaitTimeout
from ci.gpu_lock import Abandoned
from ci.history.records import read_metrics
from ci.interrupts import Interrupts
from ci.log import Log
from ci.plan import PlannedEntry
from ci.ports import PORT_FLOOR, port_base
from ci.prefork import FRESH_ONLY, Choice, ForkedChild, Policy, Slots, choose
from ci.proc import exit_code, finish, process_guard, signal_group, wait_unreaped
from ci.proc import start as start_group
from ci.results import NOT_RUN, Attempt, Result, judge
from ci.results import interrupted as interrupted_result


class Lease(Protocol):
    """GPUs held for one entry, and the locked file descriptors that hold them."""

    @property
    def devices(self) -> tuple[int, ...]: ...

    @property
    def fds(self) -> tuple[int, ...]: ...

    def note_child(self, pid: int) -> None: ...


# Acquires GPUs for an entry; blocks until they are free, or until `stop()` says to give up
# (raising gpu_lock.Abandoned). Given (count, command, stop).
Acquire = Callable[[int, str, Callable[[], bool]], AbstractContextManager[Lease]]
POLL = 0.1  # seconds between the main thread's looks at its workers and at signals
# Variables of the runner's environment that are the project's own settings (feature
# flags, cache locations): they travel with every entry, into a container too.
PROJECT_PREFIXES = ("SLIME_CI_", "SLIME_TEST_")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs, resolved once at the edge."""

    root: Path
    work_dir: Path  # logs, per-entry JUnit files, per-entry output and temp dirs
    jobs: int
    python: str = sys.executable
    base_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    pytest_args: tuple[str, ...] = ()
    filtering: bool = False  # a -k filter is active: an entry with nothing selected is "deselected"
    retries: int = 0
    infinite: bool = False  # SLIME_TEST_ENABLE_INFINITE_RUN: repeat until something fails
    max_passes: int | None = None  # bound on the passes of the infinite mode (tests); None: none
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL
    acquire: Acquire | None = None  # None: GPU entries run without a lock (dry runs, tests)
    # Where and how entries execute (local, Docker, emulated GPUs): chosen once per run.
    backend: Backend = field(default_factory=LocalBackend)
    keep_outputs: bool = False
    prefork: Policy = FRESH_ONLY  # CPU suites: fork pytest files from pre-imported workers
    port_floor: int = PORT_FLOOR  # first port of GPU 0's block (an emulated run claims its own)
    node: str = field(default_factory=socket.gethostname)  # names this machine in the timeline
    # Expected seconds per entry id (the history's p90): the ETA on the heartbeat line.
    estimates: Mapping[str, float] = field(default_factory=dict)


def base_argv(entry: PlannedEntry, cfg: RunConfig, junit: Path) -> list[str]:
    """The local command of an entry: pytest for pytest files, the script itself for e2e."""
    if entry.kind == "script":
        return [cfg.python, entry.path, *entry.test_args]
    return [
        cfg.python, "-m", "pytest", entry.path, "-q", "-rfE", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_family=xunit2",
        *entry.test_args, *cfg.pytest_args,
    ]


def compile_cache_dir(base_env: Mapping[str, str]) -> str:
    """Where torch.compile keeps its kernels: torch's own default, from the runner's TMPDIR.

    Torch derives it from TMPDIR, and each entry gets a private TMPDIR: without this every
    entry would compile from nothing (slime's compiled loss files: 2.4x slower cold).
    """
    base = base_env.get("TMPDIR") or tempfile.gettempdir()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        user = str(os.getuid())
    return str(Path(base) / f"torchinductor_{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}")


def entry_env(entry: PlannedEntry, cfg: RunConfig, *, devices: tuple[int, ...],
              out_dir: Path, tmp_dir: Path) -> EntryEnv:
    """The variables of one entry: the project's settings, its own env, and the isolation
    variables the U helpers read; the backend decides how they reach the process."""
    own = {k: v for k, v in cfg.base_env.items() if k.startswith(PROJECT_PREFIXES)}
    own.update(dict(entry.env))
    own.update({
        "SLIME_CI_ENTRY": entry.id,
        "SLIME_CI_OUTPUT_DIR": str(out_dir),
        "NUM_GPUS": str(entry.num_gpus),
        "SLIME_CI_GPUS": ",".join(map(str, devices)),
    })
    unset = set()
    if devices:
        # GPUs are exclusive on the host, so a port block keyed by the lowest GPU id
        # is too: concurrent entries, even from other runners, never share Ray ports.
        own["SLIME_CI_PORT_BASE"] = str(port_base(devices, cfg.port_floor))
    else:
        own.pop("SLIME_CI_PORT_BASE", None)
        unset.add("SLIME_CI_PORT_BASE")
    return EntryEnv(inherited=cfg.base_env, own=own, unset=frozenset(unset),
                    host={"PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_dir),
                          # torch derives its compile cache from TMPDIR: keep one per run, not per entry
                          "TORCHINDUCTOR_CACHE_DIR": cfg.base_env.get(
                              "TORCHINDUCTOR_CACHE_DIR", compile_cache_dir(cfg.base_env))},
                    threads=_threads(cfg))


def _threads(cfg: RunConfig) -> int:
    # Parallel files each spawning a full thread pool oversubscribe the cores.
    cores = os.cpu_count() or 1
    return max(1, cores // max(1, cfg.jobs))


def worker_env(cfg: RunConfig) -> dict[str, str]:
    """The environment a pre-imported worker starts with: what entries share before their own."""
    env = {**cfg.base_env, "PYTHONUNBUFFERED": "1"}
    env.setdefault("OMP_NUM_THREADS", str(_threads(cfg)))
    return env


def entry_mode(entry: PlannedEntry, cfg: RunConfig, argv: Sequence[str],
               env: Mapping[str, str]) -> Choice:
    """Forked from a pre-imported worker, or a fresh interpreter (and why), for the launched
    argv and environment: pre-forking is a variant of the local backend only."""
    return choose(policy=cfg.prefork, kind=entry.kind, num_gpus=entry.num_gpus,
                  opted_in=entry.prefork, backend=cfg.backend.name, argv=argv,
                  python=cfg.python, env=env, worker_env=worker_env(cfg))


class CoreSlots:
    """The run's `jobs` slots, taken by entries in the order they ask, `cores` slots each.

    Files that run their own process groups (gloo ranks) keep several cores busy; two of
    them side by side on a small machine each take twice as long. First come, first served:
    a heavy entry waiting for its slots is not overtaken by light ones, so it cannot starve.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._free = self.capacity
        self._queue: deque[object] = deque()
        self._cv = threading.Condition()

    @contextmanager
    def hold(self, cores: int, stop: threading.Event) -> Iterator[None]:
        """Hold `cores` slots (at most all of them) while the block runs; give up when `stop` is set."""
        want = max(1, min(cores, self.capacity))
        ticket = object()
        held = 0
        with self._cv:
            self._queue.append(ticket)
            while not (self._queue[0] is ticket and self._free >= want):
                if stop.is_set():  # the caller sees `stop` and reports the entry interrupted
                    break
                self._cv.wait(0.2)
            else:
                held = want
                self._free -= held
            self._queue.remove(ticket)
            self._cv.notify_all()
        try:
            yield
        finally:
            if held:
                with self._cv:
                    self._free += held
                    self._cv.notify_all()


class _Active:
    """Process groups of running entries, so an interrupt can end them all (and only them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()
        self.stopping = threading.Event()

    def add(self, pgid: int) -> bool:
        """Track a running group; False when the run is stopping (the caller kills it)."""
        with self._lock:
            self._pgids.add(pgid)
            # Under the lock that terminate_all snapshots with: a group added after the
            # snapshot sees `stopping` set here, so no entry can start unnoticed.
            return not self.stopping.is_set()

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def terminate_all(self, grace: float) -> None:
        with self._lock:
            self.stopping.set()
            pgids = list(self._pgids)
        for pgid in pgids:
            signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pgids:
                    return
            time.sleep(0.05)
        with self._lock:
            pgids = list(self._pgids)
        for pgid in pgids:
            signal_group(pgid, signal.SIGKILL)


def _run_process(argv: Sequence[str], *, cfg: RunConfig, env: Mapping[str, str], log: Path,
                 timeout: float, lease: Lease | None, active: _Active,
                 forked: ForkedChild | None = None) -> Attempt:
    start = time.monotonic()
    timed_out = threading.Event()
    killers: list[threading.Timer] = []
    guard = process_guard()
    child: subprocess.Popen[bytes] | None = None
    if forked is not None:
        # Already running, forked by a worker that keeps it unreaped until `reap`.
        pgid = forked.pid
        guard.register(pgid)
    else:
        with log.open("wb") as out:
            # The child inherits the lock descriptors: while any process of the entry lives,
            # its flocks stay held, never freed under a running test. The guard kills the
            # group if this runner dies without cleaning up (SIGKILL, OOM).
            child = start_group(argv, cwd=cfg.root, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, guard=guard,
                                pass_fds=tuple(lease.fds) if lease is not None else ())
        pgid = child.pid
    if not active.add(pgid):
        signal_group(pgid, signal.SIGKILL)  # started just as the run was being stopped
    if lease is not None:
        lease.note_child(pgid)

    def on_timeout() -> None:
        timed_out.set()
        signal_group(pgid, signal.SIGTERM)
        killer = threading.Timer(cfg.grace, signal_group, (pgid, signal.SIGKILL))
        killer.daemon = True
        killers.append(killer)
        killer.start()

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        if forked is not None:
            forked.wait_exited()
        else:
            wait_unreaped(pgid)
    finally:
        timer.cancel()
        for killer in killers:
            killer.cancel()
        signal_group(pgid, signal.SIGKILL)  # whatever the file left behind
        active.discard(pgid)  # before reaping: afterwards the group id may name a stranger
        if forked is not None:
            guard.unregister(pgid)
            returncode = exit_code(forked.reap())
        else:
            assert child is not None
            returncode = finish(child, guard=guard)
    return Attempt(returncode=returncode, seconds=time.monotonic() - start,
                   timed_out=timed_out.is_set(), interrupted=active.stopping.is_set())


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:120] or "entry"


class Runner:
    """Runs entries in parallel on `jobs` workers; GPU entries hold their GPUs while they run."""

    def __init__(self, cfg: RunConfig, log: Log) -> None:
        self.cfg = cfg
        self.log = log
        self.active = _Active()
        self._print_lock = threading.Lock()
        self._done = 0
        self._total = 0
        self._running: dict[str, float] = {}
        self._waiting: dict[str, float] = {}  # entries queued for their GPUs
        self._left: dict[str, float] = {}  # expected seconds of each entry not yet finished
        self.heartbeat = 30.0  # seconds between "still running" lines on long runs
        self._tmp: str | None = None
        self._cores = CoreSlots(cfg.jobs)
        self._slots = Slots(python=cfg.python, root=cfg.root, env=worker_env(cfg),
                            preload=cfg.prefork.preload, logs=cfg.work_dir / "logs", note=log.line)

    def _tmp_root(self) -> str:
        # Short on purpose: multiprocessing and gloo put AF_UNIX sockets in TMPDIR, and a
        # socket path over 107 bytes fails ("AF_UNIX path too long").
        with self._print_lock:
            if self._tmp is None:
                outer = self.cfg.base_env.get("TMPDIR", "")
                base = outer if outer and len(outer) <= 40 and os.path.isdir(outer) else "/tmp"
                self._tmp = tempfile.mkdtemp(prefix="slime-ci-", dir=base)
            return self._tmp

    def _beat(self) -> None:
        now = time.monotonic()
        with self._print_lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
            waiting = len(self._waiting)
        if running or waiting:
            shown = ", ".join(f"{name} ({now - since:.0f}s)" for name, since in running[:6])
            queued = f"; {waiting} waiting for GPUs" if waiting else ""
            eta = self._eta(now, dict(running))
            self.log.line(f"      … {self._done}/{self._total} done; running: {shown or 'none'}{queued}{eta}")

    def _eta(self, now: float, running: Mapping[str, float]) -> str:
        """'; about Ns left' from the estimates of what has not finished, spread over the job slots."""
        if not self.cfg.estimates:
            return ""
        left = sum(max(0.0, est - (now - running[k])) if k in running else est
                   for k, est in self._left.items())
        return f"; about {left / max(1, self.cfg.jobs):.0f}s left (history estimates)"

    @contextmanager
    def _gpus(self, entry: PlannedEntry) -> Iterator[Lease | None]:
        if entry.num_gpus == 0 or self.cfg.acquire is None:
            yield None
            return
        command = " ".join((entry.path, *entry.test_args))
        with self._print_lock:
            self._waiting[entry.id] = time.monotonic()
        try:
            with self.cfg.acquire(entry.num_gpus, command, self.active.stopping.is_set) as lease:
                with self._print_lock:
                    self._waiting.pop(entry.id, None)
                yield lease
        finally:
            with self._print_lock:
                self._waiting.pop(entry.id, None)

    def _attempt(self, entry: PlannedEntry, index: int, attempt_no: int) -> Result:
        name = f"{index:03d}-{_safe(entry.id)}"
        logs = self.cfg.work_dir / "logs"
        junits = self.cfg.work_dir / "junit"
        logs.mkdir(parents=True, exist_ok=True)
        junits.mkdir(parents=True, exist_ok=True)
        suffix = f".{attempt_no}" if attempt_no > 1 else ""
        log_path = logs / f"{name}{suffix}.log"
        junit = junits / f"{name}{suffix}.xml"
        junit.unlink(missing_ok=True)
        if self.cfg.backend.remote is not None:
            return self._remote_attempt(entry, name + suffix, log_path, junit)
        out_dir = self.cfg.work_dir / "out" / name
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f"e{index:03d}-", dir=self._tmp_root()))
        gpus = nullcontext(None) if self.active.stopping.is_set() else self._gpus(entry)
        queued_at = time.time() if entry.num_gpus and self.cfg.acquire is not None else None
        try:
            with gpus as lease:
                devices = tuple(lease.devices) if lease is not None else ()
                started_at = time.time()
                if self.active.stopping.is_set():
                    return replace(interrupted_result(entry), queued_at=queued_at, ended_at=started_at,
                                   node=self.cfg.node)
                env = entry_env(entry, self.cfg, devices=devices, out_dir=out_dir, tmp_dir=tmp_dir)
                launch = self.cfg.backend.launch(entry, tuple(base_argv(entry, self.cfg, junit)),
                                                 env, devices)
                prefork = entry_mode(entry, self.cfg, launch.argv, launch.env).mode == "prefork"
                with self._print_lock:
                    self._running[entry.id] = time.monotonic()
                try:
                    forked = (self._slots.fork(launch.argv, env=launch.env, log=log_path)
                              if prefork else None)
                    attempt = _run_process(launch.argv, cfg=self.cfg, env=launch.env, log=log_path,
                                           timeout=entry.timeout, lease=lease, active=self.active,
                                           forked=forked)
                    if attempt.timed_out or attempt.interrupted:
                        self.cfg.backend.abort(launch)
                finally:
                    with self._print_lock:
                        self._running.pop(entry.id, None)
        except Abandoned:  # the run was stopped while this entry waited for its GPUs
            return replace(interrupted_result(entry), queued_at=queued_at, ended_at=time.time(),
                           node=self.cfg.node)
        except CIError as exc:
            # --lock-timeout ran out, or a lock file was refused: this entry's result, not a
            # traceback that ended the runner thread and the run as "interrupted".
            shutil.rmtree(tmp_dir, ignore_errors=True)
            log_path.write_text(f"{exc}\n", encoding="utf-8")
            return Result(entry=entry, outcome="timeout" if isinstance(exc, WaitTimeout) else "failed",
                          reason=str(exc), returncode=exc.exit_code, queued_at=queued_at,
                          ended_at=time.time(), node=self.cfg.node, log_path=log_path,
                          output_tail=str(exc))
        result = replace(judge(entry, attempt, junit=junit, log=log_path, filtering=self.cfg.filtering),
                         devices=devices, queued_at=queued_at, started_at=started_at,
                         ended_at=time.time(), node=self.cfg.node)
        if entry.kind == "script":  # e2e scripts leave metrics.jsonl for the history and its gates
            result = replace(result, metrics=read_metrics(entry.id, out_dir))
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if result.ok and not self.cfg.keep_outputs:
            shutil.rmtree(out_dir, ignore_errors=True)
        return result

    def _remote_attempt(self, entry: PlannedEntry, name: str, log_path: Path, junit: Path) -> Result:
        """One attempt on a cluster: the backend places and runs it; output streams back live."""
        remote = self.cfg.backend.remote
        assert remote is not None
        with self._print_lock:
            self._waiting[entry.id] = time.monotonic()

        def started() -> None:
            with self._print_lock:
                self._waiting.pop(entry.id, None)
                self._running[entry.id] = time.monotonic()

        def output(text: str) -> None:
            for line in text.splitlines():
                self.log.line(f"[{entry.id}] {line}")

        try:
            ra = remote.run(entry, name=name, log_path=log_path, junit=junit,
                            stopping=self.active.stopping, on_start=started, on_output=output)
        finally:
            with self._print_lock:
                self._waiting.pop(entry.id, None)
                self._running.pop(entry.id, None)
        attempt = Attempt(returncode=ra.returncode, seconds=ra.seconds, timed_out=ra.timed_out,
                          interrupted=ra.interrupted or self.active.stopping.is_set())
        result = judge(entry, attempt, junit=junit, log=log_path, filtering=self.cfg.filtering)
        if ra.lost and not attempt.interrupted:
            result = replace(result, outcome="lost", failed=max(1, result.failed), reason=ra.lost)
        elif ra.error and not attempt.interrupted:
            result = replace(result, outcome="failed", failed=max(1, result.failed), reason=ra.error)
        return replace(result, devices=ra.devices, node=ra.node, queued_at=ra.queued_at,
                       started_at=ra.started_at, ended_at=ra.ended_at)

    def run_entry(self, entry: PlannedEntry, index: int) -> Result:
        """Run one entry with its retries (and, on request, again and again until it fails).

        A loop, never recursion: the long stability runs the infinite mode exists for
        repeat an entry for days, and each pass must leave the stack as it found it.
        """
        passes = 0
        while True:
            passes += 1
            result = self._once(entry, index)
            if not (self.cfg.infinite and result.ok and not self.active.stopping.is_set()):
                return result
            if self.cfg.max_passes is not None and passes >= self.cfg.max_passes:
                return result
            self._report_progress(result)

    def _once(self, entry: PlannedEntry, index: int) -> Result:
        """One pass: the entry, retried up to `retries` times; passing on a retry is flaky."""
        attempts = 0
        earlier: list[Result] = []
        lost = 0  # a lost node is the cluster's fault, not the entry's: one retry elsewhere, always
        while True:
            attempts += 1
            with self._cores.hold(entry.cores, self.active.stopping):
                result = self._attempt(entry, index, attempts)
            if result.outcome == "lost" and lost == 0:
                lost += 1
                earlier.append(result)
                self.log.line(f"       LOST {entry.id}: {result.reason}; retrying it on another node")
                continue
            if result.ok or result.outcome == "interrupted" or attempts > self.cfg.retries + lost:
                break
            earlier.append(result)
            self.log.line(f"       retry {attempts}/{self.cfg.retries}: {entry.id} ({result.reason})")
        if result.ok and attempts > 1:
            why = "; ".join(r.reason for r in earlier if r.outcome == "lost")
            result = replace(result, outcome="flaky", reason=(
                f"{why}; passed on {result.node}" if why and len(earlier) == 1
                else f"failed {attempts - 1} time(s), then passed"))
        return replace(result, attempts=attempts, earlier=tuple(earlier))

    def _report_progress(self, result: Result) -> None:
        with self._print_lock:
            self._done += 1
            self._left.pop(result.entry.id, None)
            label = {"passed": "PASS", "flaky": "FLAKY", "deselected": "SKIP"}.get(
                result.outcome, result.outcome.upper())
            counts = f"{result.passed} passed" + (f", {result.failed} failed" if result.failed else "")
            running = len(self._running)
            self.log.line(f"[{self._done:>3}/{self._total}] {label:<11} {result.entry.id}  "
                          f"{counts}  {result.seconds:.1f}s" + (f"  ({running} running)" if running else ""))
            if not result.ok:
                with self.log.group(f"output of {result.entry.id} (last lines; full log: {result.log_path})"):
                    self.log.line(result.output_tail)
                self.log.error(result.reason or result.outcome, file=result.entry.path,
                               title=f"{result.entry.id}: {result.outcome}")

    def run(self, entries: Sequence[PlannedEntry],
            interrupts: Interrupts | None = None) -> list[Result]:
        """Run every entry; on SIGINT/SIGTERM end all running groups and report what finished.

        `interrupts` is the caller's (the `run` command installs them before planning);
        without it the runner takes SIGINT/SIGTERM itself for the run and gives them back.
        """
        self._total = len(entries)
        if self.cfg.estimates:
            self._left = {e.id: self.cfg.estimates.get(e.id, e.timeout / 10) for e in entries}
        todo: queue.Queue[tuple[int, PlannedEntry]] = queue.Queue()
        for item in enumerate(entries):
            todo.put(item)
        results: dict[int, Result] = {}

        def worker() -> None:
            try:
                while not self.active.stopping.is_set():
                    try:
                        index, entry = todo.get_nowait()
                    except queue.Empty:
                        return
                    result = self.run_entry(entry, index)
                    results[index] = result
                    self._report_progress(result)
            finally:
                self._slots.release()

        workers = [threading.Thread(target=worker, daemon=True, name=f"runner-{i}")
                   for i in range(max(1, min(self.cfg.jobs, len(entries))))]
        own = interrupts is None
        signals = Interrupts() if interrupts is None else interrupts
        if own:
            signals.install()  # a signal is only recorded; this thread acts on it below
        try:
            self._supervise(workers, signals)
        finally:
            self._slots.close()
            if own:
                signals.restore()
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        return [results.get(index) or interrupted_result(entry, NOT_RUN)
                for index, entry in enumerate(entries)]

    def _supervise(self, workers: Sequence[threading.Thread], signals: Interrupts) -> None:
        """Start the workers and wait for them, acting on a signal within one poll."""
        last_beat = time.monotonic()
        for w in workers:
            if signals.received:
                break
            w.start()
        started = [w for w in workers if w.ident is not None]
        while any(w.is_alive() for w in started) and not signals.received:
            next(w for w in started if w.is_alive()).join(POLL)
            if self.heartbeat and time.monotonic() - last_beat >= self.heartbeat:
                last_beat = time.monotonic()
                self._beat()
        if signals.received:
            self.log.line("interrupted: stopping running entries…")
            self.active.stopping.set()
            if self.cfg.backend.remote is not None:
                self.cfg.backend.remote.cancel_all()  # every remote entry, wherever it runs
            self.active.terminate_all(self.cfg.grace)
            deadline = time.monotonic() + self.cfg.grace + 5
            for w in started:
                w.join(max(0.0, deadline - time.monotonic()))
