"""`python -m ci run --suite NAME`: what every nox session does — its command line, and
`main`, which calls the stages of `ci.run.pipeline` in order.

The nox sessions only forward their posargs here, so `nox -s megatron -- --dry-run`
on a laptop and the CI job print and run exactly the same thing.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import NoReturn

from ci.args import existing_dir, seconds
from ci.backends.launch import TEST_FLAGS
from ci.backends.ray import ADDRESS_ENV
from ci.durations import DURATIONS_FILE
from ci.errors import EXIT_OK, ClusterUnreachable, StoreError, UsageError
from ci.gpu.allocator import DEFAULT_PATTERN as DEFAULT_LOCK_PATTERN
from ci.gpu.allocator import DEFAULT_TIMEOUT as DEFAULT_LOCK_TIMEOUT
from ci.gpu.allocator import MAX_TOTAL_GPUS, validate_pattern
from ci.history.run_observer import Observers, RunObserver
from ci.history.store import HISTORY_ENV, HISTORY_FILE, resolve_url
from ci.interrupts import PROCESS
from ci.log import Log
from ci.registry.job_timeouts import LOCK_TIMEOUT_ENV
from ci.registry.loader import load_registry
from ci.registry.repo_suites import SUITES
from ci.run import pipeline
from ci.run.options import Options, RunArgs
from ci.select.executed import RECORDS_FILE

MAX_JOBS = 256
# As `U.get_bool_env_var` reads the same variables inside an entry: only "1" and "true"
# (any case) are true, so the runner and the entry never disagree about a flag.
TRUE_WORDS = {"1", "true"}
INFINITE_RUN_ENV = "SLIME_TEST_ENABLE_INFINITE_RUN"  # repeat every entry until one fails


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
                   "GPU suites: as many as the GPUs allow; on emulated GPUs at most the CPU count)")
    p.add_argument("--dry-run", action="store_true", help="print the plan (entries, GPUs, argv) and stop")
    p.add_argument("--package", action="append", default=[], metavar="NAME",
                   help="a package entries must import from this checkout (repeatable; default: "
                        "every top-level package directory of the root)")
    p.add_argument("--only", metavar="PATTERN", action="append", default=[],
                   help="only entries whose id matches (glob or substring; an entry's whole id "
                        "takes that entry alone); repeat for several")
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
    p.add_argument("--record-executed", action="store_true",
                   help="record the repository functions each entry executes, in all its "
                        f"processes (coverage.py), into {RECORDS_FILE}")
    p.add_argument("--by-executed", metavar="BASE",
                   help="only the entries whose recorded code the diff against BASE reaches "
                        "(docs/selection.md); entries with no record run")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    return p


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


def main(argv: Sequence[str], *, observers: Sequence[RunObserver] | None = None) -> int:
    """Parse, then select → acquire → run → judge → report → record (`ci.run.pipeline`).

    `observers`: who watches the run, instead of `pipeline.registered()`.
    """
    # SIGINT/SIGTERM are recorded; while selecting, each step ends the command (exit 130
    # through the CLI) if one came; once entries may run, the runner acts on it.
    interrupts = PROCESS
    interrupts.install()
    opts = parse(argv)
    interrupts.check()
    log = Log.from_env()
    watch = Observers(pipeline.registered() if observers is None else observers)
    start = pipeline.start(opts, log, os.environ)
    hints = watch.begin(start)
    chosen = pipeline.select(opts, hints, measured=start.measured)
    interrupts.check()
    if not chosen.entries:
        log.line(f"{opts.suite.name}: nothing selected; nothing to run")
        return EXIT_OK
    env = {**TEST_FLAGS, **os.environ, **hints.env}
    ready = pipeline.setup(chosen, log=log, env=env, infinite=_bool_env(env, INFINITE_RUN_ENV))
    if opts.args.dry_run:
        pipeline.show(ready, log)
        return EXIT_OK
    with pipeline.acquire(ready, interrupts=interrupts) as held:
        ran = pipeline.run(held, log=log, interrupts=interrupts, observer=watch)
    reported = pipeline.report(pipeline.judge(ran, observer=watch), log=log)
    pipeline.record(reported, observer=watch)
    if held.cfg.backend.lost:  # recorded above: the history keeps every result gathered so far
        raise ClusterUnreachable(f"cluster unreachable: {held.cfg.backend.lost}")
    return interrupts.exit_code(reported.exit_code)
