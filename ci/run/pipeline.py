"""The run command as a pipeline: select → acquire → run → judge → report → record.

Each stage is a function from one record to the next — `Options` (+ the observers'
`Hints`) → `Selection` → `Setup` → `Held` → `Ran` → `Judged` → `Reported` → `RunEnd` —
and `ci.run.command.main` calls them in that order. A dry run stops at `Setup` and shows
it. The history, the metric gates, the quarantine and the timeline observe the run
through one interface (`ci.history.run_observer`); `registered` is the one list of them.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from ci.backends import BackendOptions, checkout, select_backend
from ci.backends.base import AttemptPaths, Lease
from ci.backends.prefork import BASE_PRELOAD, Policy
from ci.durations import DURATIONS_FILE, DurationStore
from ci.durations import baseline as baseline_durations
from ci.errors import UsageError
from ci.gpu.allocator import check_files, nvml_gpu_count
from ci.gpu.ports import claimed_floor
from ci.history.observer import HistoryRecorder, MetricGates, Quarantine
from ci.history.run_observer import Hints, Judgement, RunEnd, RunObserver, RunStart
from ci.interrupts import Interrupts
from ci.log import Log
from ci.results import UNMEASURED, Result, closing, no_test_ran, run_exit_code
from ci.run.options import Options
from ci.run.record_executed import ExecutedRecorder
from ci.run.report import markdown, merge_junit, table
from ci.run.runner import Acquire, RunConfig, Runner
from ci.run.timeline import TimelinePage
from ci.select import entries as selection
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry


def registered() -> tuple[RunObserver, ...]:
    """Every run's observers, in the order their hooks are called: one line each.

    Made afresh for each run (each keeps what `begin` told it). The gates and the
    quarantine judge by what the recorder read, and a judge that amends results (the
    gates) comes before one that changes only how they are shown (the quarantine).
    """
    history = HistoryRecorder()
    return (
        history,  # estimates and failure-first order for selection; records the run
        MetricGates(history),  # a gated e2e entry fails when a metric strays from its history
        Quarantine(history),  # held entries shown as such, failing nothing
        TimelinePage(),  # a GPU run's timeline page and chart
        ExecutedRecorder(),  # --record-executed: the repository functions each entry ran
    )


def start(opts: Options, log: Log, env: Mapping[str, str]) -> RunStart:
    """What the observers are told as the run begins."""
    args = opts.args
    return RunStart(suite=opts.suite, root=opts.root, env=env, history_url=args.history_url,
                    emulated=args.emulate_gpus, order=args.order, base=args.base,
                    include_quarantined=args.include_quarantined,
                    measured=DurationStore(_durations_path(opts)).load(), log=log,
                    record_executed=args.record_executed)


# --- select ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Selection:
    """The entries this invocation runs, in run order."""

    opts: Options
    entries: tuple[ResolvedEntry, ...]
    estimates: Mapping[str, float]  # the observers' expected seconds per entry: the heartbeat's ETA
    # Seconds each GPU entry is expected to hold its GPUs: what lets the lock backfill.
    expectations: Mapping[str, float] = field(default_factory=dict)


def select(opts: Options, hints: Hints, *, measured: Mapping[str, float]) -> Selection:
    """The suite's entries (or the diff's), narrowed by paths, --only and --shard, then ordered.

    `hints.first` (entries that failed on this branch, test files its diff changes or
    affects): those run first, in that order, then the rest longest first. Without it,
    files that take several cores first (`selection.widest_first`). Durations: the
    history's estimates where it has them, else what `measured` holds, else the checkout's
    committed baseline (`ci.durations.BASELINE_FILES`).
    """
    args, suite = opts.args, opts.suite
    # Committed seconds order a fresh clone's first run; what was measured here overrides them.
    durations = {**baseline_durations(opts.root), **measured, **hints.estimates}
    if suite.dynamic:
        from ci.select.changed import changed_entries

        entries = changed_entries(opts.root, args.base, affected=args.affected,
                                  timeout=suite.timeout, registry=opts.registry,
                                  warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    else:
        entries = selection.resolve(suite, discover(opts.root), registry=opts.registry.name)
    if args.paths:
        entries = selection.select_paths(entries, args.paths, suite=suite.name)
    if args.only:
        entries = selection.select_only(entries, args.only)
    if args.by_executed:
        from ci.history.record import executed_records
        from ci.select.job_entries import narrow

        def say(message: str) -> None:
            print(message, file=sys.stderr)

        # The store's newest trusted record per entry (in a GPU job: the restored snapshot of
        # main's runs), else the checkout's records file.
        records = executed_records(args.history_url, opts.root, warn=lambda m: say(f"warning: {m}"))
        entries = narrow(opts.root, entries, args.by_executed, opts.registry.selection,
                         note=say, records=records)
    if args.shard:
        index, count = selection.parse_shard(args.shard)
        entries = selection.shard(entries, index, count, durations)
    if args.timeout is not None:
        entries = [replace(e, timeout=args.timeout) for e in entries]
    elif args.record_executed:  # coverage in every process: a recorded entry runs longer
        factor = opts.registry.selection.recording_timeout_factor
        entries = [replace(e, timeout=e.timeout * factor) for e in entries]
    first = hints.first
    ordered = (selection.failure_first(entries, durations, failed=first.failed, changed=first.changed)
               if first is not None else selection.widest_first(entries, durations))
    # The lock's expectations: the history's estimate where it has one, else the seconds
    # measured here or committed. A fresh clone has no history, and without expectations its
    # lock is strict FIFO: a 2-GPU entry queued behind a waiting 8-GPU one leaves GPUs idle
    # that it could have used and given back before the wide one could start.
    expectations = {e.id: durations[e.id] for e in ordered if e.num_gpus and e.id in durations}
    return Selection(opts=opts, entries=tuple(ordered), estimates=hints.estimates,
                     expectations=expectations)


# --- acquire --------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Setup:
    """Where and how the selection runs, decided but nothing held: all a dry run shows."""

    selection: Selection
    cfg: RunConfig
    gpus: int  # GPUs this run may use (0: none, or a cluster's that only Ray knows)
    junit: Path  # the merged JUnit file
    durations: Path  # the durations store

    @property
    def gpu_run(self) -> bool:
        """Some entry takes GPUs."""
        return any(e.num_gpus for e in self.selection.entries)


def default_jobs(entries: int, *, gpu_run: bool, emulated: bool, cores: int) -> int:
    """Entries run at once when `-j` does not say: the GPUs decide on real ones, the cores else.

    An emulated GPU is a CPU process: the ranks of more emulated-GPU entries than there are
    cores starve one another, and a Ray head starting among them misses the raylet's fixed
    15 s for its dashboard agent, however its start is serialized (ray_head.start_turn). On 2
    cores the ckpt suite ran 4 entries at once (8 emulated GPUs, 2 each) and one entry's head
    missed it in all three attempts, its agent's first log line 17 s after its spawn.
    """
    if not gpu_run:
        return max(1, cores)
    at_once = min(entries, 64)
    return max(1, min(at_once, cores)) if emulated else max(1, at_once)


def setup(chosen: Selection, *, log: Log, env: Mapping[str, str], infinite: bool) -> Setup:
    """The GPU budget, the job slots, the backend and the run's config.

    `env`: the entries' base environment; `infinite`: repeat until a failure.
    """
    opts, entries = chosen.opts, chosen.entries
    args, suite, root = opts.args, opts.suite, opts.root
    gpu_run = any(e.num_gpus for e in entries)
    # On a cluster, Ray knows the GPUs: the backend checks entries against its nodes.
    gpus = (_gpu_budget(opts, entries) if (suite.needs_gpus or gpu_run) and not args.ray_address
            else 0)
    jobs = args.jobs or default_jobs(len(entries), gpu_run=gpu_run, emulated=args.emulate_gpus,
                                     cores=os.cpu_count() or 1)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    cache = root / ".ci-cache"
    work_dir = cache / "runs" / f"{suite.name}-{stamp}-{os.getpid()}"
    backend = select_backend(suite, BackendOptions(
        gpus=gpus, emulate_gpus=args.emulate_gpus, no_docker=args.no_docker,
        lock_path_pattern=args.lock_path_pattern, image=args.image, pull=args.pull, root=str(root),
        note=log.line, ray_address=args.ray_address, env=env, jobs=jobs,
        lock_timeout=args.lock_timeout, largest_entry=max(e.num_gpus for e in entries)))
    cfg = RunConfig(
        root=root, work_dir=work_dir, jobs=jobs, base_env=env,
        pytest_args=(*(("-k", args.keyword) if args.keyword else ()), *opts.pytest_args),
        filtering=bool(args.keyword), retries=args.retries, infinite=infinite,
        keep_outputs=args.keep_outputs, backend=backend,
        prefork=_prefork_policy(opts, files=len(entries), jobs=jobs),
        estimates=chosen.estimates, expectations=chosen.expectations,
    )
    return Setup(selection=chosen, cfg=cfg, gpus=gpus,
                 junit=args.junit or cache / "junit" / f"{suite.name}.xml",
                 durations=_durations_path(opts))


def show(ready: Setup, log: Log) -> None:
    """The dry run: each entry, its GPUs, timeout and the argv it would run."""
    opts, entries, cfg = ready.selection.opts, ready.selection.entries, ready.cfg
    suite, backend = opts.suite, cfg.backend
    # A cluster's GPUs are known only once the run joins it, which a dry run does not do.
    gpus = "the cluster's GPUs" if not backend.gpus_known and not backend.gpus else f"{backend.gpus} GPUs"
    log.line(f"plan for {suite.name}: {len(entries)} entries, {cfg.jobs} at a time, "
             f"{gpus}, {backend.describe()}")
    if not cfg.prefork.off:
        log.line(f"  pytest files fork from pre-imported workers ({', '.join(cfg.prefork.preload)}) "
                 "unless marked fresh")
    paths = _placeholder_paths(cfg)
    for e in entries:
        plan = backend.launch_spec(e, cfg, devices=tuple(range(e.num_gpus)), paths=paths)
        why = f"  [{e.why}]" if e.why else ""
        cores = f"  cores={e.cores}" if e.cores > 1 else ""
        mode = plan.mode.describe()
        log.line(f"  {e.id}  gpus={e.num_gpus}{cores}  timeout={e.timeout:.0f}s  run={mode}{why}")
        log.line(f"      $ {shlex.join(plan.launch.argv)}")
    log.line(f"  {_imports_line(opts, entries, cfg)}")
    if backend.gpus and any(e.num_gpus for e in entries):
        log.line("  (GPU ids shown are placeholders: each entry takes whichever GPUs the lock grants)")


@dataclass(frozen=True, kw_only=True)
class Held:
    """What the run holds while its entries run: its config with the ports and lock files."""

    setup: Setup
    cfg: RunConfig


@contextmanager
def acquire(ready: Setup, *, interrupts: Interrupts) -> Iterator[Held]:
    """Check the backend, the writable paths and the checkout, then hold a port block and
    the GPU lock files until the block ends; the backend is closed with them."""
    opts, cfg = ready.selection.opts, ready.cfg
    backend = cfg.backend
    backend.check()  # its preconditions: one line and exit 2 before anything starts
    _check_writable(cfg.work_dir, ready.junit.parent, ready.durations)
    found = _where_from(opts, ready.selection.entries, cfg)
    if found is not None:
        checkout.check(opts.root, found)  # another tree's framework: one line and exit 2
    interrupts.check()
    ports = ExitStack()
    try:
        if ready.gpu_run and backend.emulated:
            cfg = replace(cfg, port_floor=ports.enter_context(claimed_floor(ready.gpus)))
        pattern = backend.lock_pattern if ready.gpu_run else None
        if pattern is not None:
            check_files(pattern, ready.gpus)  # an unusable lock path: one line now, not per entry
            cfg = replace(cfg, acquire=_acquirer(ready.gpus, pattern, opts.args.lock_timeout))
        yield Held(setup=ready, cfg=cfg)
    finally:
        ports.close()
        backend.close()


# --- run ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Ran:
    """The runner's results, one per entry in selection order, as the backend left them."""

    setup: Setup
    results: tuple[Result, ...]
    wall: float  # seconds the runner took
    gpu_rows: tuple[str, ...]  # the run's GPUs as `node:gpu` (a GPU run only)


def run(held: Held, *, log: Log, interrupts: Interrupts, observer: RunObserver) -> Ran:
    """Run every entry through the runner, which tells `observer` as each attempt ends."""
    ready, cfg = held.setup, held.cfg
    entries = ready.selection.entries
    log.line(f"{ready.selection.opts.suite.name}: {len(entries)} entries, {cfg.jobs} at a time"
             + (f", {ready.gpus} GPUs" + (" (emulated)" if cfg.backend.emulated else "")
                if ready.gpu_run else "")
             + (" — repeating until a failure (SLIME_TEST_ENABLE_INFINITE_RUN)"
                if cfg.infinite else ""))
    began = time.monotonic()
    results = Runner(cfg, log, observer).run(entries, interrupts)
    wall = time.monotonic() - began
    rows = cfg.backend.gpu_rows(cfg.node) if ready.gpu_run else []
    return Ran(setup=ready, results=tuple(results), wall=wall, gpu_rows=tuple(rows))


# --- judge ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Judged:
    """The results as the observers judged them (gates, quarantine)."""

    ran: Ran
    judgement: Judgement


def judge(ran: Ran, *, observer: RunObserver) -> Judged:
    """Each observer's judge hook in registration order, on the runner's results."""
    return Judged(ran=ran, judgement=observer.judge(Judgement.of(ran.results)))


# --- report ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Reported:
    """The run reported, and the exit code it decided."""

    judged: Judged
    exit_code: int


def report(judged: Judged, *, log: Log) -> Reported:
    """The table, JUnit, durations, step summary and closing lines of what is shown; the
    exit code from the shown results and misdeclared gates. A -k run times only part of
    each file, so the durations store (what the next selection orders and shards by)
    keeps what it had."""
    ready = judged.ran.setup
    name, shown = ready.selection.opts.suite.name, judged.judgement.shown
    log.line("")
    log.line(table(shown))
    log.line("")
    merge_junit(shown, ready.junit)
    try:
        if not ready.selection.opts.args.keyword:
            DurationStore(ready.durations).update(
                {r.entry.id: r.seconds for r in shown if r.outcome not in UNMEASURED})
    except UsageError as exc:  # the results stand; only the next selection's order suffers
        log.line(f"warning: {exc}")
    line = closing(name, shown)
    bad = [r for r in shown if not r.ok]
    log.summary(markdown(name, shown, line))
    for r in shown:
        if r.outcome == "flaky":
            log.line(f"flaky: {r.entry.id} ({r.reason})")
    for r in shown:
        if r.outcome == "quarantined":
            log.line(f"QUARANTINED {r.entry.id}: {r.reason}")
    for r in bad:
        log.line(f"FAILED {r.entry.id}: {r.outcome}: {r.reason}")
    log.line(line)
    log.line(f"{len(shown)} entries in {judged.ran.wall:.1f}s; JUnit: {ready.junit}")
    if not bad and no_test_ran(shown) and not any(r.outcome == "interrupted" for r in shown):
        log.line(f"{name}: no test ran")
    # A gate that names a metric its entry never writes turns "failed" into "fix the registry".
    return Reported(judged=judged, exit_code=run_exit_code(shown, misdeclared=judged.judgement.misdeclared))


# --- record ---------------------------------------------------------------------------


def record(reported: Reported, *, observer: RunObserver) -> RunEnd:
    """Tell the observers the run has ended (the history records it, the timeline draws it)."""
    ran = reported.judged.ran
    cfg = ran.setup.cfg
    end = RunEnd(judgement=reported.judged.judgement, exit_code=reported.exit_code,
                 backend=cfg.backend.describe(), gpu_run=ran.setup.gpu_run, gpu_rows=ran.gpu_rows,
                 work_dir=cfg.work_dir)
    observer.run_ended(end)
    return end


# --- helpers of the stages ------------------------------------------------------------


def _durations_path(opts: Options) -> Path:
    return opts.args.durations or opts.root / DURATIONS_FILE


def _gpu_budget(opts: Options, entries: Sequence[ResolvedEntry]) -> int:
    args = opts.args
    gpus: int
    if args.gpus is not None:
        gpus = int(args.gpus)
    elif args.emulate_gpus or args.dry_run:
        gpus = nvml_gpu_count() or 8
    else:
        gpus = nvml_gpu_count() or 0
        if any(e.num_gpus for e in entries) and not gpus:
            raise UsageError("no GPU detected; pass --emulate-gpus to run on the CPU, "
                             "or --gpus N if NVML cannot see them")
    too_big = [e for e in entries if e.num_gpus > gpus]
    if too_big:
        e = too_big[0]
        raise UsageError(f"{e.id} needs {e.num_gpus} GPUs but this run may use {gpus} "
                         f"(--gpus); {len(too_big)} entr{'y' if len(too_big) == 1 else 'ies'} too large")
    return gpus


# A suite's own preload costs each worker seconds once and saves each file that uses it a
# little: it pays only when every worker forks several files.
SUITE_PRELOAD_MIN_FILES_PER_WORKER = 4


def _prefork_policy(opts: Options, *, files: int, jobs: int) -> Policy:
    """Pre-imported workers for CPU suites; fresh interpreters where forking is wrong."""
    suite = opts.suite
    off = ("GPU suite: CUDA must never be initialised before a fork" if suite.needs_gpus
           else "the suite opted out in the registry" if not suite.prefork
           else "--no-prefork" if opts.args.no_prefork else "")
    extra = suite.preload if files >= SUITE_PRELOAD_MIN_FILES_PER_WORKER * jobs else ()
    preload = tuple(dict.fromkeys((*BASE_PRELOAD, *extra)))
    return Policy(preload=() if off else preload, off=off)


def _placeholder_paths(cfg: RunConfig) -> AttemptPaths:
    """An attempt's paths as the dry run shows them (no attempt, so no real ones)."""
    placeholder = cfg.work_dir / "out" / "<entry>"
    return AttemptPaths(name="<entry>", log=cfg.work_dir / "logs" / "<entry>.log",
                        junit=cfg.work_dir / "junit" / "<entry>.xml", out_dir=placeholder,
                        tmp_dir=placeholder / "tmp")


def _where_from(opts: Options, entries: Sequence[ResolvedEntry],
                cfg: RunConfig) -> dict[str, str | None] | None:
    """Where an entry started by this run would import the checkout's packages from; None
    where no process of this host runs it (a container, a cluster node)."""
    backend = cfg.backend
    if not backend.local_processes:
        return None
    e = entries[0]
    placeholder = cfg.work_dir / "out" / "<entry>"
    paths = replace(_placeholder_paths(cfg), junit=placeholder / "junit.xml")
    env = backend.launch_spec(e, cfg, devices=tuple(range(e.num_gpus)), paths=paths).launch.env
    # A script's sys.path[0] is its own directory; `python -m pytest` puts the cwd (root) there.
    cwd = opts.root / Path(e.path).parent if e.kind == "script" else opts.root
    return checkout.resolve(cfg.python, checkout.packages(opts.root, list(opts.args.package)),
                            env={k: v for k, v in env.items() if k != "TMPDIR"}, cwd=cwd)


def _imports_line(opts: Options, entries: Sequence[ResolvedEntry], cfg: RunConfig) -> str:
    found = _where_from(opts, entries, cfg)
    if found is None:
        return (f"imports the checkout's packages from {opts.root} "
                f"(PYTHONPATH={opts.root} on the {cfg.backend.name} side)")
    bad = checkout.strangers(opts.root, found)
    return checkout.describe(opts.root, found) + (
        f"  REFUSED at run time: {', '.join(bad)} from elsewhere" if bad else "")


def _check_writable(work_dir: Path, junit_dir: Path, durations: Path) -> None:
    """Everything a run writes can be written: else one line now, before any entry runs."""
    for directory in (work_dir, junit_dir, durations.parent):
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"cannot create {directory} ({exc.strerror}): the run writes its logs, "
                             "JUnit and durations there; make the checkout writable or remove "
                             "what is in the way") from None
        if not os.access(directory, os.W_OK | os.X_OK):
            raise UsageError(f"{directory} is not writable: the run writes its logs, JUnit and "
                             "durations there; make the checkout writable")
    if durations.exists() and not durations.is_file():
        raise UsageError(f"{durations} is not a file: it keeps measured durations between runs; "
                         "remove it (or pass --durations FILE)")


def _acquirer(gpus: int, pattern: str, timeout: float) -> Acquire:
    from ci.gpu.allocator import MAX_EXPECT, hold

    def acquire(count: int, command: str, stop: Callable[[], bool],
                expect: float | None) -> AbstractContextManager[Lease]:
        return hold(count=count, total_gpus=gpus, lock_path_pattern=pattern, timeout=timeout,
                    command=command, stop=stop,
                    # Past a week an estimate plans nothing (the lock refuses it): none.
                    expect=expect if expect and 0 < expect <= MAX_EXPECT else None)

    return acquire
