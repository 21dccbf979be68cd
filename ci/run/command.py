"""`python -m ci run --suite NAME`: what every nox session does — plan, run, report.

The nox sessions only forward their posargs here, so `nox -s megatron -- --dry-run`
on a laptop and the CI job print and run exactly the same thing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from ci.args import existing_dir, seconds
from ci.backends import BackendOptions, checkout, select_backend
from ci.backends.base import AttemptPaths, Lease
from ci.backends.launch import TEST_FLAGS
from ci.backends.prefork import BASE_PRELOAD, Policy
from ci.backends.ray import ADDRESS_ENV
from ci.durations import DURATIONS_FILE, DurationStore
from ci.errors import EXIT_OK, StoreError, UsageError
from ci.gpu.allocator import DEFAULT_PATTERN as DEFAULT_LOCK_PATTERN
from ci.gpu.allocator import DEFAULT_TIMEOUT as DEFAULT_LOCK_TIMEOUT
from ci.gpu.allocator import MAX_TOTAL_GPUS, check_files, nvml_gpu_count, validate_pattern
from ci.gpu.ports import claimed_floor
from ci.history import observer as history
from ci.history.store import HISTORY_ENV, HISTORY_FILE, resolve_url
from ci.interrupts import PROCESS
from ci.log import Log
from ci.registry.job_timeouts import LOCK_TIMEOUT_ENV
from ci.registry.loader import Registry, load_registry
from ci.registry.model import Suite
from ci.registry.repo_suites import SUITES
from ci.results import UNMEASURED, Result, closing, no_test_ran, run_exit_code
from ci.run import timeline
from ci.run.report import markdown, merge_junit, table
from ci.run.runner import Acquire, RunConfig, Runner
from ci.select import entries as selection
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry

MAX_JOBS = 256
# As `U.get_bool_env_var` reads the same variables inside an entry: only "1" and "true"
# (any case) are true, so the runner and the entry never disagree about a flag.
TRUE_WORDS = {"1", "true"}


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line and exit 2 through our error family."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci run --help`)")


def build_parser() -> argparse.ArgumentParser:
    names = ", ".join(s.name for s in SUITES)
    p = _Parser(
        prog="python -m ci run", allow_abbrev=False,
        description="Run one suite of the registry (what `nox -s <suite>` does).",
        epilog="Exit codes: 0 all passed, 1 something failed or nothing ran, 2 bad input, "
               "3 nothing registered, 130 interrupted. Unknown options of a CPU suite go to pytest.",
    )
    p.add_argument("--suite", required=True, help=f"one of: {names}")
    p.add_argument("paths", nargs="*", help="only these test files or directories of the suite")
    p.add_argument("-k", dest="keyword", metavar="EXPR", help="pytest -k expression (pytest files)")
    p.add_argument("-j", "--jobs", type=int, help="entries run at once (default: CPU count; "
                   "GPU suites: as many as the GPUs allow)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (entries, GPUs, argv) and stop")
    p.add_argument("--package", action="append", default=[], metavar="NAME",
                   help="a package entries must import from this checkout (repeatable; default: "
                        "every top-level package directory of the root)")
    p.add_argument("--only", metavar="PATTERN", help="only entries whose id matches (glob or substring)")
    p.add_argument("--shard", metavar="I/K", help="run shard I of K (balanced by measured durations)")
    p.add_argument("--timeout", type=float, help="seconds per entry (default: the registry's)")
    p.add_argument("--retries", type=int, default=0, help="re-run a failed entry up to N times; "
                   "one that then passes is reported flaky")
    p.add_argument("--gpus", type=int, help="GPUs this run may use (default: detected; 8 when emulating)")
    p.add_argument("--emulate-gpus", action="store_true",
                   help="allocate logical GPUs and run each entry's ranks on the CPU (no Docker)")
    p.add_argument("--no-docker", action="store_true", help="GPU suites: run in this environment")
    p.add_argument("--image", help="GPU suites: Docker image (default: the registry's)")
    p.add_argument("--pull", choices=("always", "missing", "never"),
                   help="docker run --pull policy (default: SLIME_CI_DOCKER_PULL, else always)")
    p.add_argument("--lock-path-pattern", help=f"GPU lock files (default: {DEFAULT_LOCK_PATTERN}; "
                   "a private temp dir when emulating)")
    p.add_argument("--lock-timeout", type=float, default=None,
                   help=f"seconds an entry may wait for its GPUs (default: {LOCK_TIMEOUT_ENV}, "
                        f"which CI sets below the job's own timeout, else {DEFAULT_LOCK_TIMEOUT:g})")
    p.add_argument("--base", default="origin/main", help="changed suite: compare with this ref")
    p.add_argument("--affected", action="store_true",
                   help="changed suite: also tests that import changed modules")
    p.add_argument("--junit", type=Path, help="merged JUnit file (default: .ci-cache/junit/<suite>.xml)")
    p.add_argument("--durations", type=Path,
                   help=f"durations store (default: {DURATIONS_FILE})")
    p.add_argument("--history", metavar="URL",
                   help=f"run-history store: postgresql://… or sqlite:///… (default: {HISTORY_ENV}, "
                        f"else {HISTORY_FILE}); 'off' records nothing")
    p.add_argument("--include-quarantined", action="store_true",
                   help="quarantined entries gate again (prove a fix before lifting the quarantine)")
    p.add_argument("--order", choices=("auto", "failure-first", "longest"), default="auto",
                   help="run order: longest first, or on a branch (auto) what failed on it before, "
                        "then what its diff changes or affects, then longest first")
    p.add_argument("--keep-outputs", action="store_true", help="keep output dirs of passing entries")
    p.add_argument("--no-prefork", action="store_true",
                   help="CPU suites: a fresh interpreter per file instead of forking each file "
                        "from a worker that imported pytest/numpy/torch once")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="GPU suites: run each entry as a task on this Ray cluster, its GPUs on one "
                        f"node (default: {ADDRESS_ENV}; unset: this machine)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    return p


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """The command line of `python -m ci run`, validated, with its defaults resolved."""

    suite: str
    paths: tuple[str, ...] = ()
    keyword: str | None = None
    jobs: int | None = None
    dry_run: bool = False
    package: tuple[str, ...] = ()
    only: str | None = None
    shard: str | None = None
    timeout: float | None = None
    retries: int = 0
    gpus: int | None = None
    emulate_gpus: bool = False
    no_docker: bool = False
    image: str | None = None
    pull: str | None = None
    lock_path_pattern: str | None = None
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT  # --lock-timeout, else LOCK_TIMEOUT_ENV, else the default
    base: str = "origin/main"
    affected: bool = False
    junit: Path | None = None
    durations: Path | None = None
    history: str | None = None
    history_url: str = ""  # --history resolved against the environment and the root
    include_quarantined: bool = False
    order: str = "auto"
    keep_outputs: bool = False
    no_prefork: bool = False
    ray_address: str | None = None  # --ray-address, else ADDRESS_ENV
    root: Path = Path(".")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **resolved: object) -> RunArgs:
        """The parsed namespace as typed fields; `resolved` overrides what parse() resolved."""
        values = {f: getattr(ns, f) for f in cls.__dataclass_fields__ if hasattr(ns, f)}
        values.update(paths=tuple(ns.paths), package=tuple(ns.package))
        values.update(resolved)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Options:
    """Parsed and validated command line."""

    suite: Suite
    args: RunArgs
    pytest_args: tuple[str, ...]
    root: Path
    registry: Registry


def parse(argv: Sequence[str]) -> Options:
    """Parse and validate; every problem is a one-line UsageError."""
    args, unknown = build_parser().parse_known_args(list(argv))
    root = existing_dir("--root", args.root)
    if not (root / "tests").is_dir():
        raise UsageError(f"{root} has no tests/ directory; run from the repository root or pass --root")
    registry = load_registry(root)
    suite = registry[args.suite]
    if args.jobs is not None and not 1 <= args.jobs <= MAX_JOBS:
        raise UsageError(f"-j {args.jobs}: must be between 1 and {MAX_JOBS}")
    if args.timeout is not None and not 0 < args.timeout <= 7 * 86400:
        raise UsageError(f"--timeout {args.timeout:g}: must be between 0 (exclusive) and 604800 s")
    if not 0 <= args.retries <= 10:
        raise UsageError(f"--retries {args.retries}: must be between 0 and 10")
    if args.gpus is not None and not 0 <= args.gpus <= MAX_TOTAL_GPUS:
        raise UsageError(f"--gpus {args.gpus}: must be between 0 and {MAX_TOTAL_GPUS}")
    lock_timeout = _lock_timeout_from(os.environ) if args.lock_timeout is None else args.lock_timeout
    seconds("--lock-timeout", lock_timeout, forever=True)
    ray_address = args.ray_address if args.ray_address is not None else os.environ.get(ADDRESS_ENV) or None
    if args.lock_path_pattern is not None:
        # The same check as lock-gpus: a bad pattern found by the runner thread of the first
        # GPU entry used to end the run as "interrupted". On a cluster `{node}` is a field too.
        validate_pattern(args.lock_path_pattern.replace("{node}", "node")
                         if ray_address else args.lock_path_pattern)
    if any(not p.strip() for p in args.paths):
        raise UsageError("an empty path was given (`\"\"`); name test files or directories of the "
                         "suite, or none for all of it")
    if ray_address is not None and not suite.needs_gpus:
        raise UsageError(f"--ray-address runs GPU suites on a cluster; {suite.name} runs on this machine")
    try:
        history_url = resolve_url(args.history, os.environ, root)
    except StoreError:  # no SQLAlchemy here: recording warns and spools, the run goes on
        history_url = args.history or f"sqlite:///{root / HISTORY_FILE}"
    if unknown and not suite.takes_pytest_args:
        raise UsageError(f"unknown option(s) for GPU suite {suite.name}: {' '.join(unknown)}")
    typed = RunArgs.from_namespace(args, lock_timeout=lock_timeout, ray_address=ray_address,
                                   history_url=history_url)
    return Options(suite=suite, args=typed, pytest_args=tuple(unknown), root=root, registry=registry)


def select(opts: Options, durations: Mapping[str, float],
           first: tuple[frozenset[str], Mapping[str, int]] | None = None) -> list[ResolvedEntry]:
    """The entries this invocation runs, in run order.

    `first`: (entry ids that failed on this branch, test files its diff changes or
    affects): those run first, in that order, then the rest longest first. Without it,
    files that take several cores first (`selection.widest_first`).
    """
    args, suite = opts.args, opts.suite
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
    if args.shard:
        index, count = selection.parse_shard(args.shard)
        entries = selection.shard(entries, index, count, durations)
    if args.timeout is not None:
        entries = [replace(e, timeout=args.timeout) for e in entries]
    if first is not None:
        return selection.failure_first(entries, durations, failed=first[0], changed=first[1])
    return selection.widest_first(entries, durations)


def _first(opts: Options, run: history.HistoryRun) -> tuple[frozenset[str], Mapping[str, int]] | None:
    order = opts.args.order
    if order == "longest" or (order == "auto" and not run.on_feature_branch):
        return None
    changed = history.changed_tests(opts.root, opts.args.base,
                                    warn=lambda m: print(f"note: {m}", file=sys.stderr))
    return run.before.failed_here, changed


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


def _placeholder_paths(cfg: RunConfig) -> AttemptPaths:
    """An attempt's paths as the dry run shows them (no attempt, so no real ones)."""
    placeholder = cfg.work_dir / "out" / "<entry>"
    return AttemptPaths(name="<entry>", log=cfg.work_dir / "logs" / "<entry>.log",
                        junit=cfg.work_dir / "junit" / "<entry>.xml", out_dir=placeholder,
                        tmp_dir=placeholder / "tmp")


def _print_selection(opts: Options, entries: Sequence[ResolvedEntry], cfg: RunConfig, log: Log) -> None:
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


def _lock_timeout_from(env: Mapping[str, str]) -> float:
    raw = env.get(LOCK_TIMEOUT_ENV)
    if raw is None:
        return DEFAULT_LOCK_TIMEOUT
    try:
        return float(raw)
    except ValueError:
        raise UsageError(f"{LOCK_TIMEOUT_ENV}={raw!r}: expected seconds, e.g. 1800") from None


def _bool_env(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw and raw not in TRUE_WORDS and raw not in ("0", "false"):
        print(f"warning: {name}={env[name]!r} counts as false; use 1 or true", file=sys.stderr)
    return raw in TRUE_WORDS


def main(argv: Sequence[str]) -> int:
    # SIGINT/SIGTERM are recorded; while planning, each step ends the command (exit 130
    # through the CLI) if one came; once entries may run, the runner acts on it.
    interrupts = PROCESS
    interrupts.install()
    opts = parse(argv)
    interrupts.check()
    args, suite, root = opts.args, opts.suite, opts.root
    log = Log.from_env()
    cache = root / ".ci-cache"
    store = DurationStore(args.durations or root / DURATIONS_FILE)
    measured = store.load()
    warn = lambda m: log.line(f"warning: {m}")  # noqa: E731
    run = history.begin(args.history_url, suite=suite, root=root, env=os.environ,
                        emulated=args.emulate_gpus, warn=warn)
    # The history's p90 on this hardware where it has one; the last measurement otherwise.
    durations = {**measured, **run.before.estimates}
    entries = select(opts, durations, _first(opts, run))
    interrupts.check()
    if not entries:
        log.line(f"{suite.name}: nothing selected; nothing to run")
        return EXIT_OK
    gpu_entries = any(e.num_gpus for e in entries)
    # On a cluster, Ray knows the GPUs: the backend checks entries against its nodes.
    gpus = (_gpu_budget(opts, entries) if (suite.needs_gpus or gpu_entries) and not args.ray_address
            else 0)
    jobs = args.jobs or (min(len(entries), 64) if gpu_entries else (os.cpu_count() or 1))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work_dir = cache / "runs" / f"{suite.name}-{stamp}-{os.getpid()}"
    env = {**TEST_FLAGS, **os.environ}
    backend = select_backend(suite, BackendOptions(
        gpus=gpus, emulate_gpus=args.emulate_gpus, no_docker=args.no_docker,
        lock_path_pattern=args.lock_path_pattern, image=args.image, pull=args.pull, root=str(root),
        note=log.line, ray_address=args.ray_address, env=env, jobs=jobs,
        lock_timeout=args.lock_timeout, largest_entry=max(e.num_gpus for e in entries)))
    cfg = RunConfig(
        root=root, work_dir=work_dir, jobs=jobs, base_env=env,
        pytest_args=(*(("-k", args.keyword) if args.keyword else ()), *opts.pytest_args),
        filtering=bool(args.keyword), retries=args.retries,
        infinite=_bool_env(env, "SLIME_TEST_ENABLE_INFINITE_RUN"),
        keep_outputs=args.keep_outputs, backend=backend,
        prefork=_prefork_policy(opts, files=len(entries), jobs=jobs),
        estimates=run.before.estimates,
    )
    if args.dry_run:
        _print_selection(opts, entries, cfg, log)
        return EXIT_OK
    backend.check()  # its preconditions: one line and exit 2 before anything starts
    junit = args.junit or cache / "junit" / f"{suite.name}.xml"
    _check_writable(work_dir, junit.parent, store.path)
    found = _where_from(opts, entries, cfg)
    if found is not None:
        checkout.check(root, found)  # another tree's framework: one line and exit 2
    interrupts.check()
    ports = ExitStack()
    try:
        if gpu_entries and backend.emulated:
            cfg = replace(cfg, port_floor=ports.enter_context(claimed_floor(gpus)))
        pattern = backend.lock_pattern if gpu_entries else None
        if pattern is not None:
            check_files(pattern, gpus)  # an unusable lock path: one line now, not per entry
            cfg = replace(cfg, acquire=_acquirer(gpus, pattern, args.lock_timeout))
        log.line(f"{suite.name}: {len(entries)} entries, {jobs} at a time"
                 + (f", {gpus} GPUs" + (" (emulated)" if backend.emulated else "")
                    if gpu_entries else "")
                 + (" — repeating until a failure (SLIME_TEST_ENABLE_INFINITE_RUN)"
                    if cfg.infinite else ""))
        start = time.monotonic()
        results = Runner(cfg, log).run(entries, interrupts)
        wall = time.monotonic() - start
        rows = backend.gpu_rows(cfg.node) if gpu_entries else []
    finally:
        ports.close()
        backend.close()
    results, misdeclared = history.apply_gates(run, results, note=log.line)
    shown = (results if args.include_quarantined
             else history.apply_quarantine(results, history.quarantine_reasons(run)))
    _report(suite.name, shown, wall, junit, store, log, partial=bool(args.keyword))
    # A gate that names a metric its entry never writes turns "failed" into "fix the registry".
    code = run_exit_code(shown, misdeclared=bool(misdeclared))
    history.finish(run, results, code, root=root, backend=backend.describe(), durations=measured,
                   warn=warn, note=log.line)
    if gpu_entries:
        _timeline(suite.name, results, rows, work_dir, log)
    return interrupts.exit_code(code)


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


def _timeline(name: str, results: Sequence[Result], gpu_rows: Sequence[str], work_dir: Path,
              log: Log) -> None:
    """Write the run's timeline page, chart it in the step summary, and say where it is."""
    tl = timeline.build(results, title=f"{name}: GPU timeline", gpu_rows=gpu_rows)
    work_dir.mkdir(parents=True, exist_ok=True)
    page = work_dir / "timeline.html"
    page.write_text(timeline.html(tl), encoding="utf-8")
    log.summary(timeline.summary_markdown(tl, str(page)))
    log.line(f"timeline: {page}")


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
    from ci.gpu.allocator import hold

    def acquire(count: int, command: str, stop: Callable[[], bool]) -> AbstractContextManager[Lease]:
        return hold(count=count, total_gpus=gpus, lock_path_pattern=pattern, timeout=timeout,
                    command=command, stop=stop)

    return acquire


def _report(name: str, results: Sequence[Result], wall: float, junit: Path,
            store: DurationStore, log: Log, *, partial: bool = False) -> None:
    """The run's table, JUnit, durations, step summary and closing lines (its exit code is
    `ci.results.run_exit_code`). `partial`: a -k run, which times only part of each file, so
    the durations store (what the next plan orders and shards by) keeps what it had."""
    log.line("")
    log.line(table(results))
    log.line("")
    merge_junit(results, junit)
    try:
        if not partial:
            store.update({r.entry.id: r.seconds for r in results if r.outcome not in UNMEASURED})
    except UsageError as exc:  # the results stand; only the next plan's order suffers
        log.line(f"warning: {exc}")
    line = closing(name, results)
    bad = [r for r in results if not r.ok]
    flaky = [r for r in results if r.outcome == "flaky"]
    log.summary(markdown(name, results, line))
    for r in flaky:
        log.line(f"flaky: {r.entry.id} ({r.reason})")
    for r in results:
        if r.outcome == "quarantined":
            log.line(f"QUARANTINED {r.entry.id}: {r.reason}")
    for r in bad:
        log.line(f"FAILED {r.entry.id}: {r.outcome}: {r.reason}")
    log.line(line)
    log.line(f"{len(results)} entries in {wall:.1f}s; JUnit: {junit}")
    if not bad and no_test_ran(results) and not any(r.outcome == "interrupted" for r in results):
        log.line(f"{name}: no test ran")
