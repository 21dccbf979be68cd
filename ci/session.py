"""`python -m ci run --suite NAME`: what every nox session does — plan, run, report.

The nox sessions only forward their posargs here, so `nox -s megatron -- --dry-run`
on a laptop and the CI job print and run exactly the same thing.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from ci import plan as planner
from ci import timeline
from ci.cluster import ADDRESS_ENV
from ci.discover import discover
from ci.docker import ENTRY_FLAG_DEFAULTS
from ci.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, UsageError
from ci.gpu_lock import nvml_gpu_count
from ci.log import Log
from ci.plan import PlannedEntry
from ci.report import DURATIONS_FILE, DurationStore, markdown, merge_junit, table
from ci.runner import Acquire, Lease, Result, RunConfig, Runner, Wrap, base_argv, entry_env
from ci.suites import SUITES, Suite
from ci.timeline import gpu_row

MAX_JOBS = 256
DEFAULT_LOCK_PATTERN = "/dev/shm/custom_gpu_lock_{gpu_id}.lock"
# Emulated GPUs on a cluster: per node ({node}: its Ray id), never the real GPUs' files.
CLUSTER_EMULATED_LOCKS = "/tmp/slime-ci-emulated-locks-{node}/gpu_{gpu_id}.lock"
# The original CI's feature flags, unless the environment or the entry says otherwise.
TEST_FLAGS = {**ENTRY_FLAG_DEFAULTS, "SLIME_TEST_ENABLE_INFINITE_RUN": "0"}
TRUE_WORDS = {"1", "true", "yes", "on"}


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
    p.add_argument("--lock-timeout", type=float, default=86400.0,
                   help="seconds an entry may wait for its GPUs (default: 86400)")
    p.add_argument("--base", default="origin/main", help="changed suite: compare with this ref")
    p.add_argument("--affected", action="store_true",
                   help="changed suite: also tests that import changed modules")
    p.add_argument("--junit", type=Path, help="merged JUnit file (default: .ci-cache/junit/<suite>.xml)")
    p.add_argument("--durations", type=Path,
                   help=f"durations store (default: {DURATIONS_FILE})")
    p.add_argument("--keep-outputs", action="store_true", help="keep output dirs of passing entries")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="GPU suites: run each entry as a task on this Ray cluster, its GPUs on one "
                        "node (default: SLIME_CI_RAY_ADDRESS; unset: this machine)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    return p


@dataclass(frozen=True, kw_only=True)
class Options:
    """Parsed and validated command line."""

    suite: Suite
    args: argparse.Namespace
    pytest_args: tuple[str, ...]
    root: Path


def parse(argv: Sequence[str]) -> Options:
    """Parse and validate; every problem is a one-line UsageError."""
    args, unknown = build_parser().parse_known_args(list(argv))
    root = args.root.resolve()
    if not (root / "tests").is_dir():
        raise UsageError(f"{root} has no tests/ directory; run from the repository root or pass --root")
    suites = {s.name: s for s in planner.registry(root)}
    if args.suite not in suites:
        raise UsageError(f"unknown suite {args.suite!r}; known: {', '.join(suites)}")
    suite = suites[args.suite]
    if args.jobs is not None and not 1 <= args.jobs <= MAX_JOBS:
        raise UsageError(f"-j {args.jobs}: must be between 1 and {MAX_JOBS}")
    if args.timeout is not None and not 0 < args.timeout <= 7 * 86400:
        raise UsageError(f"--timeout {args.timeout:g}: must be between 0 (exclusive) and 604800 s")
    if not 0 <= args.retries <= 10:
        raise UsageError(f"--retries {args.retries}: must be between 0 and 10")
    if args.gpus is not None and not 0 <= args.gpus <= 1024:
        raise UsageError(f"--gpus {args.gpus}: must be between 0 and 1024")
    if args.lock_timeout <= 0:
        raise UsageError("--lock-timeout must be positive")
    if args.lock_path_pattern is not None and "{gpu_id}" not in args.lock_path_pattern:
        raise UsageError("--lock-path-pattern must contain {gpu_id}")
    if args.ray_address is None:
        args.ray_address = os.environ.get(ADDRESS_ENV) or None
    if args.ray_address is not None and suite.tier != "gpu":
        raise UsageError(f"--ray-address runs GPU suites on a cluster; {suite.name} runs on this machine")
    if unknown and suite.tier == "gpu":
        raise UsageError(f"unknown option(s) for GPU suite {suite.name}: {' '.join(unknown)}")
    return Options(suite=suite, args=args, pytest_args=tuple(unknown), root=root)


def select(opts: Options, durations: Mapping[str, float]) -> list[PlannedEntry]:
    """The entries this invocation runs, in run order."""
    args, suite = opts.args, opts.suite
    if suite.dynamic:
        from ci.changed import changed_entries

        entries = changed_entries(opts.root, args.base, affected=args.affected,
                                  timeout=suite.timeout,
                                  warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    else:
        entries = planner.resolve(suite, discover(opts.root))
    if args.paths:
        entries = planner.select_paths(entries, args.paths, suite=suite.name)
    if args.only:
        entries = planner.select_only(entries, args.only)
    if args.shard:
        index, count = planner.parse_shard(args.shard)
        entries = planner.shard(entries, index, count, durations)
    if args.timeout is not None:
        entries = [replace(e, timeout=args.timeout) for e in entries]
    return planner.longest_first(entries, durations)


def _gpu_budget(opts: Options, entries: Sequence[PlannedEntry]) -> int:
    args = opts.args
    needed = max((e.num_gpus for e in entries), default=0)
    gpus: int
    if args.gpus is not None:
        gpus = int(args.gpus)
    elif args.emulate_gpus or args.dry_run:
        gpus = nvml_gpu_count() or 8
    else:
        gpus = nvml_gpu_count() or 0
        if needed and not gpus:
            raise UsageError("no GPU detected; pass --emulate-gpus to run on the CPU, "
                             "or --gpus N if NVML cannot see them")
    too_big = [e for e in entries if e.num_gpus > gpus]
    if too_big:
        e = too_big[0]
        raise UsageError(f"{e.id} needs {e.num_gpus} GPUs but this run may use {gpus} "
                         f"(--gpus); {len(too_big)} entr{'y' if len(too_big) == 1 else 'ies'} too large")
    return gpus


def _uses_docker(opts: Options) -> bool:
    return opts.suite.tier == "gpu" and not opts.args.no_docker and not opts.args.emulate_gpus


def _docker_wrap(opts: Options, log: Log) -> Wrap:
    from ci.docker import (
        DockerOptions,
        container_name,
        docker_run_argv,
        fit_to_host,
        host_settings,
        read_host_limits,
    )

    image = opts.args.image or opts.suite.image or "slimerl/slime:latest"
    host = host_settings(os.environ)
    pull = opts.args.pull or host.pull or "always"
    limits = read_host_limits()
    noted: set[str] = set()

    def wrap(entry: PlannedEntry, argv: Sequence[str], env: Mapping[str, str],
             devices: tuple[int, ...]) -> Sequence[str]:
        # The container has its own /tmp; everything else the entry reads lives under the
        # workspace, which is mounted at the same path.
        inner_env = {k: v for k, v in env.items()
                     if (k.startswith(("SLIME_CI_", "SLIME_TEST_")) or k == "NUM_GPUS"
                         or k in dict(entry.env))}
        inner_env["TEST_FILE"] = entry.path
        inner_env["TEST_ARGS"] = " ".join(entry.test_args)
        options = DockerOptions(
            image=image, workspace=opts.root, devices=devices, env=inner_env,
            caches=host.caches, pull=pull,
            name=container_name(entry.id, uuid.uuid4().hex[:8]),
        )
        options, notes = fit_to_host(options, limits)
        for note in notes:
            if note not in noted:
                noted.add(note)
                log.line(f"docker: {note}")
        built: Sequence[str] = docker_run_argv(options, inner=("python3", *argv[1:]))
        return built

    return wrap


def _docker_kill(argv: Sequence[str]) -> None:
    """Kill the container of an aborted `docker run …` (found by its --name)."""
    from ci.docker import docker_kill_argv

    args = list(argv)
    if "--name" in args and args.index("--name") + 1 < len(args):
        name = args[args.index("--name") + 1]
        subprocess.run(docker_kill_argv(name), stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, timeout=60, check=False)


def _print_plan(opts: Options, entries: Sequence[PlannedEntry], cfg: RunConfig, gpus: int,
                log: Log) -> None:
    suite = opts.suite
    where = "docker " + (opts.args.image or suite.image or "") if _uses_docker(opts) else "local"
    if opts.args.emulate_gpus:
        where = "local, GPUs emulated on the CPU"
    log.line(f"plan for {suite.name}: {len(entries)} entries, {cfg.jobs} at a time, "
             f"{gpus if suite.tier == 'gpu' else 0} GPUs, {where}")
    for e in entries:
        devices = tuple(range(e.num_gpus))
        junit = cfg.work_dir / "junit" / "<entry>.xml"
        argv: Sequence[str] = base_argv(e, cfg, junit)
        if cfg.wrap is not None:
            placeholder = cfg.work_dir / "out" / "<entry>"
            env = entry_env(e, cfg, devices=devices, out_dir=placeholder, tmp_dir=placeholder / "tmp")
            argv = cfg.wrap(e, argv, env, devices)
        why = f"  [{e.why}]" if e.why else ""
        log.line(f"  {e.id}  gpus={e.num_gpus}  timeout={e.timeout:.0f}s{why}")
        log.line(f"      $ {shlex.join(argv)}")
    if suite.tier == "gpu" and any(e.num_gpus for e in entries):
        log.line("  (GPU ids shown are placeholders: each entry takes whichever GPUs the lock grants)")


def _closing(suite: str, results: Sequence[Result]) -> str:
    passed = sum(r.passed for r in results)
    failed = sum(r.failed for r in results)
    skipped = sum(r.skipped for r in results)
    return f"{suite}: {passed} passed, {failed} failed, {skipped} skipped"


def _bool_env(env: Mapping[str, str], name: str) -> bool:
    return env.get(name, "").strip().lower() in TRUE_WORDS


def main(argv: Sequence[str]) -> int:
    opts = parse(argv)
    args, suite, root = opts.args, opts.suite, opts.root
    log = Log.from_env()
    cache = root / ".ci-cache"
    store = DurationStore(args.durations or root / DURATIONS_FILE)
    durations = store.load()
    entries = select(opts, durations)
    if not entries:
        log.line(f"{suite.name}: nothing selected; nothing to run")
        return EXIT_OK
    gpu_entries = any(e.num_gpus for e in entries)
    if args.ray_address:
        return _cluster_main(opts, entries, store, log)
    gpus = _gpu_budget(opts, entries) if suite.tier == "gpu" or gpu_entries else 0
    jobs = args.jobs or (min(len(entries), 64) if gpu_entries else (os.cpu_count() or 1))
    stamp = time.strftime("%Y%m%d-%H%M%S")
    work_dir = cache / "runs" / f"{suite.name}-{stamp}-{os.getpid()}"
    env = {**TEST_FLAGS, **os.environ}
    docker = _uses_docker(opts)
    wrap = _docker_wrap(opts, log) if docker else None
    cfg = RunConfig(
        root=root, work_dir=work_dir, jobs=jobs, base_env=env,
        pytest_args=(*(("-k", args.keyword) if args.keyword else ()), *opts.pytest_args),
        filtering=bool(args.keyword), retries=args.retries,
        infinite=_bool_env(env, "SLIME_TEST_ENABLE_INFINITE_RUN"),
        emulate_gpus=args.emulate_gpus, keep_outputs=args.keep_outputs, wrap=wrap,
        on_abort=_docker_kill if docker else None,
    )
    if args.dry_run:
        _print_plan(opts, entries, cfg, gpus, log)
        return EXIT_OK
    # Emulated GPUs get private lock files, so a laptop run never queues behind real GPUs.
    lock_dir = (tempfile.mkdtemp(prefix="slime-ci-locks-")
                if gpu_entries and args.emulate_gpus and args.lock_path_pattern is None else None)
    if gpu_entries:
        pattern = (os.path.join(lock_dir, "gpu_{gpu_id}.lock") if lock_dir
                   else args.lock_path_pattern or DEFAULT_LOCK_PATTERN)
        cfg = replace(cfg, acquire=_acquirer(gpus, pattern, args.lock_timeout))
    log.line(f"{suite.name}: {len(entries)} entries, {jobs} at a time"
             + (f", {gpus} GPUs" + (" (emulated)" if args.emulate_gpus else "") if gpu_entries else "")
             + (" — repeating until a failure (SLIME_TEST_ENABLE_INFINITE_RUN)" if cfg.infinite else ""))
    start = time.monotonic()
    try:
        results = Runner(cfg, log).run(entries)
    finally:
        if lock_dir is not None:
            shutil.rmtree(lock_dir, ignore_errors=True)
    wall = time.monotonic() - start
    code = _report(suite.name, results, wall, args.junit or cache / "junit" / f"{suite.name}.xml",
                   store, log)
    if gpu_entries:
        _timeline(suite.name, results, [gpu_row(cfg.node, i) for i in range(gpus)], work_dir, log)
    return code


def _cluster_main(opts: Options, entries: Sequence[PlannedEntry], store: DurationStore,
                  log: Log) -> int:
    """A GPU suite on a Ray cluster: Ray places every entry; the run waits, reports, charts."""
    from ci.cluster import Cluster  # imports Ray only when a cluster is used

    args, suite, root = opts.args, opts.suite, opts.root
    cache = root / ".ci-cache"
    work_dir = cache / "runs" / f"{suite.name}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    env = {**TEST_FLAGS, **os.environ}
    cfg = RunConfig(root=root, work_dir=work_dir, jobs=args.jobs or len(entries), base_env=env,
                    retries=args.retries, emulate_gpus=args.emulate_gpus,
                    keep_outputs=args.keep_outputs,
                    infinite=_bool_env(env, "SLIME_TEST_ENABLE_INFINITE_RUN"))
    if args.dry_run:
        log.line(f"on the Ray cluster at {args.ray_address}: each entry a task on one node")
        _print_plan(opts, entries, cfg, max(e.num_gpus for e in entries), log)
        return EXIT_OK
    # Each node's own lock files; logical GPUs of several nodes on one box must not share them.
    pattern = args.lock_path_pattern or (CLUSTER_EMULATED_LOCKS if args.emulate_gpus
                                         else DEFAULT_LOCK_PATTERN)
    cluster = Cluster(args.ray_address, cfg=cfg, lock_pattern=pattern, lock_timeout=args.lock_timeout)
    cluster.connect()
    try:
        nodes = [n for n in cluster.nodes() if n.alive]
        largest = max((n.gpus for n in nodes), default=0)
        too_big = [e for e in entries if e.num_gpus > largest]
        if too_big:
            raise UsageError(f"{too_big[0].id} needs {too_big[0].num_gpus} GPUs on one node; the largest "
                             f"node of the cluster at {args.ray_address} has {largest}")
        log.line(f"{suite.name}: {len(entries)} entries on the Ray cluster at {args.ray_address}: "
                 + ", ".join(f"{n.name} ({n.gpus} GPUs)" for n in nodes))
        start = time.monotonic()
        results = Runner(replace(cfg, remote=cluster), log).run(entries)
        wall = time.monotonic() - start
        rows = [gpu_row(n.name, i) for n in cluster.nodes() for i in range(n.gpus)]
    finally:
        cluster.close()
    code = _report(suite.name, results, wall, args.junit or cache / "junit" / f"{suite.name}.xml",
                   store, log)
    _timeline(suite.name, results, rows, work_dir, log)
    return code


def _timeline(name: str, results: Sequence[Result], gpu_rows: Sequence[str], work_dir: Path,
              log: Log) -> None:
    """Write the run's timeline page, chart it in the step summary, and say where it is."""
    tl = timeline.build(results, title=f"{name}: GPU timeline", gpu_rows=gpu_rows)
    work_dir.mkdir(parents=True, exist_ok=True)
    page = work_dir / "timeline.html"
    page.write_text(timeline.html(tl), encoding="utf-8")
    log.summary(timeline.summary_markdown(tl, str(page)))
    log.line(f"timeline: {page}")


def _acquirer(gpus: int, pattern: str, timeout: float) -> Acquire:
    from ci.gpu_lock import hold

    def acquire(count: int, command: str) -> AbstractContextManager[Lease]:
        return hold(count=count, total_gpus=gpus, lock_path_pattern=pattern, timeout=timeout,
                    command=command)

    return acquire


def _report(name: str, results: Sequence[Result], wall: float, junit: Path,
            store: DurationStore, log: Log) -> int:
    log.line("")
    log.line(table(results))
    log.line("")
    merge_junit(results, junit)
    store.update({r.entry.id: r.seconds for r in results
                  if r.outcome not in ("interrupted", "deselected", "timeout")})
    closing = _closing(name, results)
    bad = [r for r in results if not r.ok]
    flaky = [r for r in results if r.outcome == "flaky"]
    log.summary(markdown(name, results, closing))
    for r in flaky:
        log.line(f"flaky: {r.entry.id} ({r.reason})")
    for r in bad:
        log.line(f"FAILED {r.entry.id}: {r.outcome}: {r.reason}")
    log.line(closing)
    log.line(f"{len(results)} entries in {wall:.1f}s; JUnit: {junit}")
    if any(r.outcome == "interrupted" for r in results):
        return EXIT_INTERRUPTED
    if bad:
        return EXIT_FAILED
    if sum(r.passed for r in results) == 0:
        log.line(f"{name}: no test ran")
        return EXIT_FAILED
    return EXIT_OK

