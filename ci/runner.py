"""Run planned entries: one subprocess per test file, each in its own process group.

Why one process group per file: import-time stubs in one test file must never
leak into another, and a timeout must kill everything the file started — the
original CI's `pkill -9 <name>` clean-up killed other people's processes instead.
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, Protocol

from ci.log import Log
from ci.plan import PlannedEntry
from ci.report import parse_junit

Outcome = Literal["passed", "failed", "timeout", "empty", "deselected", "flaky", "interrupted", "lost"]
OK_OUTCOMES: frozenset[str] = frozenset({"passed", "deselected", "flaky"})

PORT_BLOCK = 200  # ports reserved per GPU entry (Ray head, dashboard, workers…)
PORT_FLOOR = 20000
PYTEST_NO_TESTS = 5  # pytest's exit code when it collected (or selected) nothing


@dataclass(frozen=True, kw_only=True)
class Result:
    """What happened to one entry."""

    entry: PlannedEntry
    outcome: Outcome
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    returncode: int | None = None
    attempts: int = 1
    devices: tuple[int, ...] = ()
    reason: str = ""  # one line for the summary: the error the file raised, the timeout…
    output_tail: str = ""
    log_path: Path | None = None
    junit_path: Path | None = None
    # Wall-clock (epoch seconds) for the run timeline: when the entry began waiting for
    # its GPUs (None: it needed none), when it got them and started, when it ended.
    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    node: str = ""  # where it ran: the hostname, or the cluster node
    earlier: tuple[Result, ...] = ()  # attempts before this one (retries), oldest first

    @property
    def ok(self) -> bool:
        return self.outcome in OK_OUTCOMES


class Lease(Protocol):
    """GPUs held for one entry, and the locked file descriptors that hold them."""

    @property
    def devices(self) -> tuple[int, ...]: ...

    @property
    def fds(self) -> tuple[int, ...]: ...

    def note_child(self, pid: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class RemoteAttempt:
    """One attempt of an entry on another machine (a Ray cluster node), as the driver saw it."""

    returncode: int | None
    seconds: float
    timed_out: bool
    interrupted: bool
    queued_at: float
    ended_at: float
    started_at: float | None = None
    node: str = ""
    devices: tuple[int, ...] = ()
    lost: str = ""  # the node died under the entry: why, naming it (the runner retries once)
    error: str = ""  # the remote side failed for another reason


class Remote(Protocol):
    """Runs entries elsewhere (ci.cluster): placement, GPUs and process live on the node."""

    def run(self, entry: PlannedEntry, *, name: str, log_path: Path, junit: Path,
            stopping: threading.Event, on_start: Callable[[], None],
            on_output: Callable[[str], None]) -> RemoteAttempt: ...

    def cancel_all(self) -> None: ...


# Acquires GPUs for an entry; blocks until they are free. Given (count, command).
Acquire = Callable[[int, str], AbstractContextManager[Lease]]
# Wraps the local argv of an entry (e.g. into `docker run`), given the GPUs it holds.
Wrap = Callable[[PlannedEntry, Sequence[str], Mapping[str, str], tuple[int, ...]], Sequence[str]]


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
    grace: float = 5.0  # seconds between SIGTERM and SIGKILL
    acquire: Acquire | None = None  # None: GPU entries run without a lock (dry runs, tests)
    wrap: Wrap | None = None
    # Called with the argv of an entry that was killed (timeout, interrupt): e.g. to
    # `docker kill` its container, which outlives the killed `docker run` client.
    on_abort: Callable[[Sequence[str]], None] | None = None
    emulate_gpus: bool = False
    keep_outputs: bool = False
    node: str = field(default_factory=socket.gethostname)  # names this machine in the timeline
    remote: Remote | None = None  # run entries on a cluster instead of here


@dataclass(frozen=True, kw_only=True)
class _Attempt:
    returncode: int | None
    seconds: float
    timed_out: bool
    interrupted: bool


def base_argv(entry: PlannedEntry, cfg: RunConfig, junit: Path) -> list[str]:
    """The local command of an entry: pytest for pytest files, the script itself for e2e."""
    if entry.kind == "script":
        return [cfg.python, entry.path, *entry.test_args]
    return [
        cfg.python, "-m", "pytest", entry.path, "-q", "-rfE", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_family=xunit2",
        *entry.test_args, *cfg.pytest_args,
    ]


def entry_env(entry: PlannedEntry, cfg: RunConfig, *, devices: tuple[int, ...],
              out_dir: Path, tmp_dir: Path) -> dict[str, str]:
    """The environment of one entry: isolation variables the U helpers read, plus its own env."""
    env = dict(cfg.base_env)
    env.update(dict(entry.env))
    ids = ",".join(map(str, devices))
    env.update({
        "PYTHONUNBUFFERED": "1",
        "SLIME_CI_ENTRY": entry.id,
        "SLIME_CI_OUTPUT_DIR": str(out_dir),
        "TMPDIR": str(tmp_dir),
        "NUM_GPUS": str(entry.num_gpus),
        "SLIME_CI_GPUS": ids,
    })
    if cfg.emulate_gpus:
        env.update({"SLIME_CI_EMULATE_GPUS": "1", "SLIME_CI_DEVICE": "cpu",
                    "CUDA_VISIBLE_DEVICES": ""})
    elif entry.num_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ids
    if devices:
        # GPUs are exclusive on the host, so a port block keyed by the lowest GPU id
        # is too: concurrent entries, even from other runners, never share Ray ports.
        env["SLIME_CI_PORT_BASE"] = str(PORT_FLOOR + min(devices) * PORT_BLOCK)
    else:
        env.pop("SLIME_CI_PORT_BASE", None)
    # Parallel files each spawning a full thread pool oversubscribe the cores.
    cores = os.cpu_count() or 1
    env.setdefault("OMP_NUM_THREADS", str(max(1, cores // max(1, cfg.jobs))))
    return env


def _signal_group(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Active:
    """Process groups of running entries, so an interrupt can end them all (and only them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pgids: set[int] = set()
        self.stopping = threading.Event()

    def add(self, pgid: int) -> None:
        with self._lock:
            self._pgids.add(pgid)

    def discard(self, pgid: int) -> None:
        with self._lock:
            self._pgids.discard(pgid)

    def terminate_all(self, grace: float) -> None:
        self.stopping.set()
        with self._lock:
            pgids = list(self._pgids)
        for pgid in pgids:
            _signal_group(pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pgids:
                    return
            time.sleep(0.05)
        with self._lock:
            pgids = list(self._pgids)
        for pgid in pgids:
            _signal_group(pgid, signal.SIGKILL)


def _run_process(argv: Sequence[str], *, cfg: RunConfig, env: Mapping[str, str], log: Path,
                 timeout: float, lease: Lease | None, active: _Active) -> _Attempt:
    start = time.monotonic()
    timed_out = threading.Event()
    killers: list[threading.Timer] = []
    with log.open("wb") as out:
        proc = subprocess.Popen(
            list(argv), cwd=cfg.root, env=dict(env), stdin=subprocess.DEVNULL, stdout=out,
            # The child inherits the lock descriptors: if this runner dies, the flocks stay
            # held by the entry's processes, never freed under a running test.
            stderr=subprocess.STDOUT, start_new_session=True,
            pass_fds=tuple(lease.fds) if lease is not None else (),
        )
    pgid = proc.pid
    active.add(pgid)
    if lease is not None:
        lease.note_child(proc.pid)

    def on_timeout() -> None:
        timed_out.set()
        _signal_group(pgid, signal.SIGTERM)
        killer = threading.Timer(cfg.grace, _signal_group, (pgid, signal.SIGKILL))
        killer.daemon = True
        killers.append(killer)
        killer.start()

    timer = threading.Timer(timeout, on_timeout)
    timer.daemon = True
    timer.start()
    try:
        # Wait for the leader without reaping it: while it is unreaped its pid cannot be
        # reused, so signalling the group below can only reach processes of this entry.
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)
    finally:
        timer.cancel()
        for killer in killers:
            killer.cancel()
        _signal_group(pgid, signal.SIGKILL)  # whatever the file left behind
        returncode = proc.wait()
        active.discard(pgid)
    return _Attempt(returncode=returncode, seconds=time.monotonic() - start,
                    timed_out=timed_out.is_set(), interrupted=active.stopping.is_set())


_ERROR_LINE = re.compile(r"^E\s+(\w*(?:Error|Exception|Exit)\b.*)$")


def _tail(log: Path, lines: int = 60) -> str:
    try:
        data = log.read_bytes()[-64_000:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


def _reason(output: str) -> str:
    """The one line that says why a file failed: the exception it raised, if it shows one."""
    lines = output.splitlines()
    for line in lines:
        match = _ERROR_LINE.match(line)
        if match:
            return match.group(1).strip()[:200]
    for line in reversed(lines):
        stripped = line.strip()
        if re.match(r"^\w*(Error|Exception)\b", stripped):
            return stripped[:200]
    for line in reversed(lines):
        if line.strip() and not line.startswith("="):
            return line.strip()[:200]
    return ""


def _judge(entry: PlannedEntry, attempt: _Attempt, *, junit: Path, log: Path,
           cfg: RunConfig) -> Result:
    tail = _tail(log)
    base = Result(entry=entry, outcome="failed", seconds=attempt.seconds,
                  returncode=attempt.returncode, output_tail=tail, log_path=log,
                  junit_path=junit if entry.kind == "pytest" else None)
    if attempt.interrupted:
        return replace(base, outcome="interrupted", failed=1, reason="interrupted")
    if attempt.timed_out:
        return replace(base, outcome="timeout", failed=1,
                       reason=f"timed out after {entry.timeout:.0f}s; the whole process group was killed")
    if entry.kind == "script":
        ok = attempt.returncode == 0
        return replace(base, outcome="passed" if ok else "failed", passed=int(ok), failed=int(not ok),
                       reason="" if ok else (_reason(tail) or f"exit code {attempt.returncode}"))
    counts = parse_junit(junit)
    if counts is None:
        return replace(base, failed=1,
                       reason=_reason(tail) or f"pytest wrote no report (exit code {attempt.returncode})")
    result = replace(base, passed=counts.passed, failed=counts.failures + counts.errors,
                     skipped=counts.skipped)
    executed = counts.tests - counts.skipped
    if attempt.returncode == 0 and executed > 0 and result.failed == 0:
        return replace(result, outcome="passed")
    if attempt.returncode == PYTEST_NO_TESTS or (attempt.returncode == 0 and executed == 0):
        if cfg.filtering:
            return replace(result, outcome="deselected", reason="no test matched the filter")
        # The original CI counted files that ran nothing as green; here they fail.
        return replace(result, outcome="empty", failed=max(1, result.failed),
                       reason="ran no test: a test file must execute at least one test")
    return replace(result, failed=max(1, result.failed),
                   reason=_reason(tail) or f"exit code {attempt.returncode}")


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
        self.heartbeat = 30.0  # seconds between "still running" lines on long runs
        self._tmp: str | None = None

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
            self.log.line(f"      … {self._done}/{self._total} done; running: {shown or 'none'}{queued}")

    @contextmanager
    def _gpus(self, entry: PlannedEntry) -> Iterator[Lease | None]:
        if entry.num_gpus == 0 or self.cfg.acquire is None:
            yield None
            return
        command = " ".join((entry.path, *entry.test_args))
        with self._print_lock:
            self._waiting[entry.id] = time.monotonic()
        try:
            with self.cfg.acquire(entry.num_gpus, command) as lease:
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
        if self.cfg.remote is not None:
            return self._remote_attempt(entry, name + suffix, log_path, junit)
        out_dir = self.cfg.work_dir / "out" / name
        out_dir.mkdir(parents=True, exist_ok=True)
        tmp_dir = Path(tempfile.mkdtemp(prefix=f"e{index:03d}-", dir=self._tmp_root()))
        gpus = nullcontext(None) if self.active.stopping.is_set() else self._gpus(entry)
        queued_at = time.time() if entry.num_gpus and self.cfg.acquire is not None else None
        with gpus as lease:
            devices = tuple(lease.devices) if lease is not None else ()
            started_at = time.time()
            if self.active.stopping.is_set():
                return Result(entry=entry, outcome="interrupted", failed=1, reason="interrupted",
                              queued_at=queued_at, ended_at=started_at, node=self.cfg.node)
            env = entry_env(entry, self.cfg, devices=devices, out_dir=out_dir, tmp_dir=tmp_dir)
            argv: Sequence[str] = base_argv(entry, self.cfg, junit)
            if self.cfg.wrap is not None:
                argv = self.cfg.wrap(entry, argv, env, devices)
            with self._print_lock:
                self._running[entry.id] = time.monotonic()
            try:
                attempt = _run_process(argv, cfg=self.cfg, env=env, log=log_path,
                                       timeout=entry.timeout, lease=lease, active=self.active)
                if (attempt.timed_out or attempt.interrupted) and self.cfg.on_abort is not None:
                    self.cfg.on_abort(argv)
            finally:
                with self._print_lock:
                    self._running.pop(entry.id, None)
        result = replace(_judge(entry, attempt, junit=junit, log=log_path, cfg=self.cfg),
                         devices=devices, queued_at=queued_at, started_at=started_at,
                         ended_at=time.time(), node=self.cfg.node)
        shutil.rmtree(tmp_dir, ignore_errors=True)
        if result.ok and not self.cfg.keep_outputs:
            shutil.rmtree(out_dir, ignore_errors=True)
        return result

    def _remote_attempt(self, entry: PlannedEntry, name: str, log_path: Path, junit: Path) -> Result:
        assert self.cfg.remote is not None
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
            ra = self.cfg.remote.run(entry, name=name, log_path=log_path, junit=junit,
                                     stopping=self.active.stopping, on_start=started, on_output=output)
        finally:
            with self._print_lock:
                self._waiting.pop(entry.id, None)
                self._running.pop(entry.id, None)
        attempt = _Attempt(returncode=ra.returncode, seconds=ra.seconds, timed_out=ra.timed_out,
                           interrupted=ra.interrupted or self.active.stopping.is_set())
        result = _judge(entry, attempt, junit=junit, log=log_path, cfg=self.cfg)
        if ra.lost and not attempt.interrupted:
            result = replace(result, outcome="lost", failed=max(1, result.failed), reason=ra.lost)
        elif ra.error and not attempt.interrupted:
            result = replace(result, outcome="failed", failed=max(1, result.failed), reason=ra.error)
        return replace(result, devices=ra.devices, node=ra.node, queued_at=ra.queued_at,
                       started_at=ra.started_at, ended_at=ra.ended_at)

    def run_entry(self, entry: PlannedEntry, index: int) -> Result:
        """Run one entry with its retries (and, on request, forever until it fails)."""
        attempts = 0
        earlier: list[Result] = []
        lost = 0  # a lost node is the cluster's fault, not the entry's: one retry elsewhere, always
        while True:
            attempts += 1
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
        result = replace(result, attempts=attempts, earlier=tuple(earlier))
        if self.cfg.infinite and result.ok and not self.active.stopping.is_set():
            self._report_progress(result)
            return self.run_entry(entry, index)
        return result

    def _report_progress(self, result: Result) -> None:
        with self._print_lock:
            self._done += 1
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

    def run(self, entries: Sequence[PlannedEntry]) -> list[Result]:
        """Run every entry; on Ctrl-C/SIGTERM end all running groups and report what finished."""
        self._total = len(entries)
        todo: queue.Queue[tuple[int, PlannedEntry]] = queue.Queue()
        for item in enumerate(entries):
            todo.put(item)
        results: dict[int, Result] = {}

        def worker() -> None:
            while not self.active.stopping.is_set():
                try:
                    index, entry = todo.get_nowait()
                except queue.Empty:
                    return
                result = self.run_entry(entry, index)
                results[index] = result
                self._report_progress(result)

        workers = [threading.Thread(target=worker, daemon=True, name=f"runner-{i}")
                   for i in range(max(1, min(self.cfg.jobs, len(entries))))]
        previous = signal.getsignal(signal.SIGTERM)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, _raise_interrupt)
        try:
            for w in workers:
                w.start()
            last_beat = time.monotonic()
            for w in workers:
                while w.is_alive():
                    w.join(0.2)
                    if self.heartbeat and time.monotonic() - last_beat >= self.heartbeat:
                        last_beat = time.monotonic()
                        self._beat()
        except KeyboardInterrupt:
            self.log.line("interrupted: stopping running entries…")
            self.active.stopping.set()
            if self.cfg.remote is not None:
                self.cfg.remote.cancel_all()
            self.active.terminate_all(self.cfg.grace)
            for w in workers:
                w.join(self.cfg.grace + 5)
        finally:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, previous)
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
        ordered = []
        for index, entry in enumerate(entries):
            ordered.append(results.get(index) or Result(
                entry=entry, outcome="interrupted", failed=1, reason="did not run: interrupted"))
        return ordered


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
