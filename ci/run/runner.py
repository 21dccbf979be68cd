"""Run planned entries: schedule them on `jobs` threads, retry them, report progress.

Where and how an attempt executes is the backend's (`ci.backends`, chosen once per
run): `Backend.run_attempt` runs one attempt — a process group of this host
(`ci.backends.process`, pre-forked or fresh), a container, a cluster task — and says
how it ended. The runner never asks which backend it has. It keeps, each in a class
of its own: the attempt directory layout (`AttemptLayout`), core slots (`CoreSlots`),
GPU leases (`GpuQueue`), the retry, lost-node and flaky policy (`RetryPolicy`),
progress and heartbeat lines (`Progress`) and the Actions annotations of a failure
(`annotate`). Signals reach the run through `ci.interrupts`; outcomes are judged by
`ci.results`; the run's observer hears of each attempt as it ends.

Why one process group per file: import-time stubs in one test file must never
leak into another, and a timeout must kill everything the file started — the
original CI's `pkill -9 <name>` clean-up killed other people's processes instead.
"""

from __future__ import annotations

import os
import queue
import re
import shutil
import socket
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

from ci.backends.base import AttemptEvents, AttemptPaths, Backend, Lease, RunContext
from ci.backends.local import LocalBackend
from ci.backends.prefork import FRESH_ONLY, Policy
from ci.errors import CIError, WaitTimeout
from ci.gpu.allocator import Abandoned
from ci.gpu.ports import PORT_FLOOR
from ci.history.rows import read_metrics
from ci.history.run_observer import AttemptEnded, RunObserver
from ci.interrupts import Interrupts
from ci.log import Log
from ci.proc import Groups
from ci.results import NOT_RUN, Result, judge
from ci.results import interrupted as interrupted_result
from ci.select.entries import ResolvedEntry

# Acquires GPUs for an entry; blocks until they are free, or until `stop()` says to give up
# (raising allocator.Abandoned). Given (GPUs, command, stop, expected seconds of holding or None).
Acquire = Callable[[int, str, Callable[[], bool], float | None], AbstractContextManager[Lease]]
POLL = 0.1  # seconds between the main thread's looks at its workers and at signals


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Everything a run needs, resolved once at the edge (also the `ci.backends.launch.Settings`
    of its entries)."""

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
    # Where and how entries execute (local, Docker, emulated GPUs, a cluster): chosen once per run.
    backend: Backend = field(default_factory=LocalBackend)
    keep_outputs: bool = False
    prefork: Policy = FRESH_ONLY  # CPU suites: fork pytest files from pre-imported workers
    port_floor: int = PORT_FLOOR  # first port of GPU 0's block (an emulated run claims its own)
    node: str = field(default_factory=socket.gethostname)  # names this machine in the timeline
    # Expected seconds per entry id (the history's p90): the ETA on the heartbeat line.
    estimates: Mapping[str, float] = field(default_factory=dict)
    # Expected seconds each GPU entry holds its GPUs (the history's p90, else measured or
    # committed durations): what the lock backfills with. None for an entry: strict FIFO.
    expectations: Mapping[str, float] = field(default_factory=dict)


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


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_")[:120] or "entry"


class AttemptLayout:
    """Where each attempt of a run writes: logs/, junit/, out/ under the run's directory, and
    a private temp dir under one short root for the run."""

    def __init__(self, work_dir: Path, base_env: Mapping[str, str]) -> None:
        self.work_dir = work_dir
        self.logs = work_dir / "logs"
        self._outer = base_env.get("TMPDIR", "")
        self._lock = threading.Lock()
        self._tmp: str | None = None

    def _tmp_root(self) -> str:
        # Short on purpose: multiprocessing and gloo put AF_UNIX sockets in TMPDIR, and a
        # socket path over 107 bytes fails ("AF_UNIX path too long").
        with self._lock:
            if self._tmp is None:
                outer = self._outer
                base = outer if outer and len(outer) <= 40 and os.path.isdir(outer) else "/tmp"
                self._tmp = tempfile.mkdtemp(prefix="slime-ci-", dir=base)
            return self._tmp

    def paths(self, entry: ResolvedEntry, index: int, attempt_no: int) -> AttemptPaths:
        """The paths of attempt `attempt_no` of the `index`-th entry; its JUnit file starts absent."""
        name = f"{index:03d}-{_safe(entry.id)}"
        junits = self.work_dir / "junit"
        self.logs.mkdir(parents=True, exist_ok=True)
        junits.mkdir(parents=True, exist_ok=True)
        suffix = f".{attempt_no}" if attempt_no > 1 else ""
        junit = junits / f"{name}{suffix}.xml"
        junit.unlink(missing_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"e{index:03d}-", dir=self._tmp_root()))
        return AttemptPaths(name=name + suffix, log=self.logs / f"{name}{suffix}.log", junit=junit,
                            out_dir=self.work_dir / "out" / name, tmp_dir=tmp)

    def close(self) -> None:
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)


class Progress:
    """Progress of a run: the finished/total count, what runs and waits, the heartbeat line."""

    def __init__(self, log: Log, *, jobs: int, estimates: Mapping[str, float]) -> None:
        self.log = log
        self._jobs = jobs
        self._estimates = estimates
        self._lock = threading.Lock()
        self.done = 0
        self.total = 0
        self._running: dict[str, float] = {}
        self._waiting: dict[str, float] = {}  # entries queued for their GPUs (or a cluster's)
        self._left: dict[str, float] = {}  # expected seconds of each entry not yet finished

    def begin(self, entries: Sequence[ResolvedEntry]) -> None:
        self.total = len(entries)
        if self._estimates:
            self._left = {e.id: self._estimates.get(e.id, e.timeout / 10) for e in entries}

    def queued(self, entry_id: str) -> None:
        with self._lock:
            self._waiting[entry_id] = time.monotonic()

    def started(self, entry_id: str) -> None:
        with self._lock:
            self._waiting.pop(entry_id, None)
            self._running[entry_id] = time.monotonic()

    def settled(self, entry_id: str) -> None:
        """The attempt is over (or never got its GPUs)."""
        with self._lock:
            self._waiting.pop(entry_id, None)
            self._running.pop(entry_id, None)

    def beat(self) -> None:
        now = time.monotonic()
        with self._lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
            waiting = len(self._waiting)
        if running or waiting:
            shown = ", ".join(f"{name} ({now - since:.0f}s)" for name, since in running[:6])
            queued = f"; {waiting} waiting for GPUs" if waiting else ""
            eta = self._eta(now, dict(running))
            self.log.line(f"      … {self.done}/{self.total} done; running: {shown or 'none'}{queued}{eta}")

    def _eta(self, now: float, running: Mapping[str, float]) -> str:
        """'; about Ns left' from the estimates of what has not finished, spread over the job slots."""
        if not self._estimates:
            return ""
        left = sum(max(0.0, est - (now - running[k])) if k in running else est
                   for k, est in self._left.items())
        return f"; about {left / max(1, self._jobs):.0f}s left (history estimates)"

    def finished(self, result: Result) -> None:
        with self._lock:
            self.done += 1
            self._left.pop(result.entry.id, None)
            label = {"passed": "PASS", "flaky": "FLAKY", "deselected": "SKIP"}.get(
                result.outcome, result.outcome.upper())
            counts = f"{result.passed} passed" + (f", {result.failed} failed" if result.failed else "")
            running = len(self._running)
            self.log.line(f"[{self.done:>3}/{self.total}] {label:<11} {result.entry.id}  "
                          f"{counts}  {result.seconds:.1f}s" + (f"  ({running} running)" if running else ""))
            if not result.ok:
                annotate(self.log, result)


def annotate(log: Log, result: Result) -> None:
    """A failed entry: its last lines in a collapsible group, and an error annotation on its file."""
    with log.group(f"output of {result.entry.id} (last lines; full log: {result.log_path})"):
        log.line(result.output_tail)
    log.error(result.reason or result.outcome, file=result.entry.path,
              title=f"{result.entry.id}: {result.outcome}")


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """When an entry runs again, and what its final result says about the attempts before.

    A failure is retried up to `retries` times; a lost node is the cluster's fault, not
    the entry's: one retry elsewhere, always, beyond `retries`. Passing on a retry is flaky.
    """

    retries: int

    def again(self, result: Result, attempts: int, lost: int) -> str:
        """"lost" (retry on another node), "retry", or "" (this result is final)."""
        if result.outcome == "lost" and lost == 0:
            return "lost"
        if result.ok or result.outcome == "interrupted" or attempts > self.retries + lost:
            return ""
        return "retry"

    def final(self, result: Result, earlier: Sequence[Result]) -> Result:
        attempts = len(earlier) + 1
        if result.ok and attempts > 1:
            why = "; ".join(r.reason for r in earlier if r.outcome == "lost")
            result = replace(result, outcome="flaky", reason=(
                f"{why}; passed on {result.node}" if why and len(earlier) == 1
                else f"failed {attempts - 1} time(s), then passed"))
        return replace(result, attempts=attempts, earlier=tuple(earlier))


class GpuQueue:
    """The GPUs an entry waits for and holds (the run's lock files), shown on the heartbeat."""

    def __init__(self, acquire: Acquire | None, progress: Progress, stop: Callable[[], bool],
                 expectations: Mapping[str, float] | None = None) -> None:
        self._acquire = acquire
        self._progress = progress
        self._stop = stop
        # Expected seconds per entry: the lock lets an entry with one start early on GPUs
        # a bigger request is still waiting for, when it is expected to be done in time.
        self._expectations = expectations or {}

    def waits(self, entry: ResolvedEntry) -> bool:
        return bool(entry.num_gpus) and self._acquire is not None

    @contextmanager
    def hold(self, entry: ResolvedEntry) -> Iterator[Lease | None]:
        if not self.waits(entry) or self._acquire is None:
            yield None
            return
        command = " ".join((entry.path, *entry.test_args))
        self._progress.queued(entry.id)
        try:
            with self._acquire(entry.num_gpus, command, self._stop,
                               self._expectations.get(entry.id)) as lease:
                self._progress.settled(entry.id)
                yield lease
        finally:
            self._progress.settled(entry.id)


class Runner:
    """Runs entries in parallel on `jobs` workers; GPU entries hold their GPUs while they run."""

    def __init__(self, cfg: RunConfig, log: Log, observer: RunObserver | None = None) -> None:
        self.cfg = cfg
        self.log = log
        self.observer = observer  # told as each attempt ends (`ci.history.run_observer`)
        self.groups = Groups()
        self.heartbeat = 30.0  # seconds between "still running" lines on long runs
        self.progress = Progress(log, jobs=cfg.jobs, estimates=cfg.estimates)
        self.layout = AttemptLayout(cfg.work_dir, cfg.base_env)
        self.policy = RetryPolicy(retries=cfg.retries)
        self._cores = CoreSlots(cfg.jobs)
        self._gpus = GpuQueue(cfg.acquire, self.progress, self.groups.stopping.is_set,
                              cfg.expectations)

    def _stopping(self) -> bool:
        return self.groups.stopping.is_set()

    def _attempt(self, entry: ResolvedEntry, index: int, attempt_no: int) -> Result:
        paths = self.layout.paths(entry, index, attempt_no)
        gpus = nullcontext(None) if self._stopping() else self._gpus.hold(entry)
        queued_at = time.time() if self._gpus.waits(entry) else None
        events = AttemptEvents(queued=lambda: self.progress.queued(entry.id),
                               started=lambda: self.progress.started(entry.id),
                               output=lambda text: self._output(entry, text))
        try:
            with gpus as lease:
                if self._stopping():
                    shutil.rmtree(paths.tmp_dir, ignore_errors=True)
                    return replace(interrupted_result(entry), queued_at=queued_at, ended_at=time.time(),
                                   node=self.cfg.node)
                try:
                    attempt = self.cfg.backend.run_attempt(entry, lease, paths, events)
                finally:
                    self.progress.settled(entry.id)
                if attempt.ended_at is None:
                    # Stamped while the GPUs are still held: stamped after the lease went (and
                    # after judging), the next entry on these GPUs could start "before" this
                    # one ended, and the timeline drew two bars on one GPU at once.
                    attempt = replace(attempt, ended_at=time.time())
        except Abandoned:  # the run was stopped while this entry waited for its GPUs
            shutil.rmtree(paths.tmp_dir, ignore_errors=True)
            return replace(interrupted_result(entry), queued_at=queued_at, ended_at=time.time(),
                           node=self.cfg.node)
        except CIError as exc:
            # --lock-timeout ran out, or a lock file was refused: this entry's result, not a
            # traceback that ended the runner thread and the run as "interrupted".
            shutil.rmtree(paths.tmp_dir, ignore_errors=True)
            paths.log.write_text(f"{exc}\n", encoding="utf-8")
            return Result(entry=entry, outcome="timeout" if isinstance(exc, WaitTimeout) else "failed",
                          reason=str(exc), returncode=exc.exit_code, queued_at=queued_at,
                          ended_at=time.time(), node=self.cfg.node, log_path=paths.log,
                          output_tail=str(exc))
        attempt = replace(attempt, interrupted=attempt.interrupted or self._stopping())
        judged = judge(entry, attempt, junit=paths.junit, log=paths.log, filtering=self.cfg.filtering)
        result = replace(judged, devices=attempt.devices,
                         queued_at=attempt.queued_at if attempt.queued_at is not None else queued_at,
                         started_at=attempt.started_at,
                         ended_at=attempt.ended_at if attempt.ended_at is not None else time.time(),
                         node=self.cfg.node if attempt.node is None else attempt.node)
        if entry.kind == "script":  # e2e scripts leave metrics.jsonl for the history and its gates
            result = replace(result, metrics=read_metrics(entry.id, paths.out_dir))
        shutil.rmtree(paths.tmp_dir, ignore_errors=True)
        if result.ok and not self.cfg.keep_outputs:
            shutil.rmtree(paths.out_dir, ignore_errors=True)
        return result

    def _output(self, entry: ResolvedEntry, text: str) -> None:
        for line in text.splitlines():
            self.log.line(f"[{entry.id}] {line}")

    def run_entry(self, entry: ResolvedEntry, index: int) -> Result:
        """Run one entry with its retries (and, on request, again and again until it fails).

        A loop, never recursion: the long stability runs the infinite mode exists for
        repeat an entry for days, and each pass must leave the stack as it found it.
        """
        passes = 0
        while True:
            passes += 1
            result = self._once(entry, index)
            if not (self.cfg.infinite and result.ok and not self._stopping()):
                return result
            if self.cfg.max_passes is not None and passes >= self.cfg.max_passes:
                return result
            self.progress.finished(result)

    def _once(self, entry: ResolvedEntry, index: int) -> Result:
        """One pass: the entry, retried as the policy says."""
        earlier: list[Result] = []
        lost = 0
        while True:
            attempt_no = len(earlier) + 1
            with self._cores.hold(entry.cores, self.groups.stopping):
                result = self._attempt(entry, index, attempt_no)
            again = self.policy.again(result, attempt_no, lost)
            if self.observer is not None:
                self.observer.attempt_ended(AttemptEnded(result=result, attempt=attempt_no,
                                                         retried=bool(again)))
            if not again:
                return self.policy.final(result, earlier)
            earlier.append(result)
            if again == "lost":
                lost += 1
                self.log.line(f"       LOST {entry.id}: {result.reason}; retrying it on another node")
            else:
                self.log.line(f"       retry {len(earlier)}/{self.cfg.retries}: {entry.id} ({result.reason})")

    def run(self, entries: Sequence[ResolvedEntry],
            interrupts: Interrupts | None = None) -> list[Result]:
        """Run every entry; on SIGINT/SIGTERM end all running groups and report what finished.

        `interrupts` is the caller's (the `run` command installs them before planning);
        without it the runner takes SIGINT/SIGTERM itself for the run and gives them back.
        """
        self.progress.begin(entries)
        todo: queue.Queue[tuple[int, ResolvedEntry]] = queue.Queue()
        for item in enumerate(entries):
            todo.put(item)
        results: dict[int, Result] = {}

        def worker() -> None:
            while not self._stopping():
                try:
                    index, entry = todo.get_nowait()
                except queue.Empty:
                    return
                result = self.run_entry(entry, index)
                results[index] = result
                self.progress.finished(result)

        workers = [threading.Thread(target=worker, daemon=True, name=f"runner-{i}")
                   for i in range(max(1, min(self.cfg.jobs, len(entries))))]
        own = interrupts is None
        signals = Interrupts() if interrupts is None else interrupts
        if own:
            signals.install()  # a signal is only recorded; this thread acts on it below
        backend = self.cfg.backend
        backend.open_run(RunContext(settings=self.cfg, grace=self.cfg.grace, groups=self.groups,
                                    logs=self.layout.logs, note=self.log.line))
        try:
            self._supervise(workers, signals)
        finally:
            backend.close_run()
            if own:
                signals.restore()
        self.layout.close()
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
                self.progress.beat()
        if signals.received:
            self.log.line("interrupted: stopping running entries…")
            self.groups.stopping.set()
            self.cfg.backend.interrupt()  # what stopping the run's groups does not reach
            self.groups.stop(self.cfg.grace)
            deadline = time.monotonic() + self.cfg.grace + 5
            for w in started:
                w.join(max(0.0, deadline - time.monotonic()))
