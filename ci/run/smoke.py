"""`python -m ci smoke NAME`: a smoke of the registry, its suites' runs at once on one set of GPUs.

A `Smoke` names runs of several GPU suites on emulated GPUs (`gpu_smoke`: some megatron,
ckpt and sglang_config entries). One after another, a suite waits while the one before
starts Ray heads and imports torch, with a core idle. Here every run is its own
`python -m ci run --suite S --emulate-gpus`, all started together and all holding GPUs
through one shared lock directory: no two entries ever hold the same logical GPU (nor,
so, the same Ray port block), and an entry that wants all of them waits for them in
the lock's queue as it would behind another runner. A smoke whose registry entry sets
`one_at_a_time` (or `--one-at-a-time`) runs them one after another instead, on the same
lock files: the recording nightly does, as recording four suites at once overloads 2 cores.

Each line a run prints is shown with its suite's name in front (GitHub's `::` commands
as they are, so annotations still work); a table at the end gives each suite's exit
status and time. The exit status is the first failing run's, in registry order, else 0.
SIGINT or SIGTERM goes on to every run as SIGTERM: each stops its entries and writes its
report, and the command exits 130.

    python -m ci smoke gpu_smoke                  # what `nox -s gpu_smoke` runs
    python -m ci smoke gpu_smoke --dry-run        # each run's plan, nothing started
    python -m ci smoke gpu_smoke --history URL    # every other option goes to each `ci run`
    python -m ci smoke gpu_smoke --shard 2/3      # one CI shard: its share of every run's entries
    python -m ci smoke gpu_smoke --one-at-a-time  # its runs one after another (gpu_smoke_nightly's way)

`--shard I/K` splits the smoke's entries, all its runs' together, by their measured durations
(the split `ci run --shard` makes of one suite); each run then takes only its entries of that
shard (`--only ID` each), and a run left with none does not start. A shard with no entry at
all is an error, not a pass. Without `--shard` (`nox -t ci`) every entry runs in one tree.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TextIO

from ci.durations import DURATIONS_FILE, DurationStore, baseline
from ci.errors import EXIT_INTERRUPTED, UsageError
from ci.interrupts import PROCESS
from ci.proc import finish, process_guard, signal_group, start, terminate, wait_exit, wait_until
from ci.registry.loader import load_registry
from ci.registry.model import Smoke, SmokeRun
from ci.select.discover import discover
from ci.select.entries import parse_shard, smoke_entries, smoke_shard

POLL = 0.2  # seconds between looks at the runs and at the signal record
GRACE = 300.0  # seconds a run may take to stop after SIGTERM before it is killed


@dataclass(frozen=True)
class SmokeCommand:
    suite: str
    argv: tuple[str, ...]


def commands(smoke: Smoke, lock_pattern: str, rest: Sequence[str],
             python: str = sys.executable) -> list[SmokeCommand]:
    """One `python -m ci run` per run of the smoke, all on the same lock files (pure)."""
    out = []
    for run in smoke.runs:
        only = [arg for pattern in run.patterns for arg in ("--only", pattern)]
        out.append(SmokeCommand(run.suite, (
            python, "-m", "ci", "run", "--suite", run.suite, "--emulate-gpus", "--gpus", str(smoke.gpus),
            "--retries", str(smoke.retries), "--lock-path-pattern", lock_pattern, *only, *rest)))
    return out


def shard_runs(smoke: Smoke, root: Path, text: str) -> Smoke:
    """The smoke narrowed to shard `text` (I/K) of its entries: each run's `only` becomes the
    whole ids of its entries in that shard (an entry's whole id takes it alone), runs without
    one are left out. Every shard reads the same durations (the committed ones, under what
    this checkout measured), so the K shards together run each entry exactly once."""
    index, count = parse_shard(text)
    registry = load_registry(root)
    pairs = smoke_entries(smoke, {s.name: s for s in registry.suites}, discover(root),
                          registry=registry.name)
    durations = {**baseline(root), **DurationStore(root / DURATIONS_FILE).load()}
    mine = smoke_shard(pairs, index, count, durations)
    runs = tuple(SmokeRun(suite=run.suite, only=tuple(e.id for s, e in mine if s == run.suite))
                 for run in smoke.runs if any(s == run.suite for s, _ in mine))
    return replace(smoke, runs=runs)


def _find(name: str, root: Path) -> Smoke:
    smokes = {s.name: s for s in load_registry(root).sessions if isinstance(s, Smoke)}
    if name not in smokes:
        known = ", ".join(sorted(smokes)) or "none"
        raise UsageError(f"no smoke named {name!r} in the registry; smokes: {known}")
    return smokes[name]


def _pump(label: str, width: int, stream: TextIO, out: TextIO, lock: threading.Lock) -> None:
    for line in stream:
        text = line if line.startswith("::") else f"{label:<{width}} | {line}"
        with lock:
            out.write(text)
            out.flush()


def run_together(cmds: Sequence[SmokeCommand], *, cwd: Path | None = None,
                 out: TextIO = sys.stdout) -> list[tuple[str, int, float]]:
    """Start every command, prefix its lines, wait for all; [(suite, exit status, seconds)].

    Each command is the leader of its own process group, so a Ctrl-C reaches this process
    alone and is passed on once, as SIGTERM, by the loop below. Leaders are reaped only at
    the end (`ci.proc.finish`), so every group id signalled is still one this process made.
    """
    width = max(len(c.suite) for c in cmds)
    lock = threading.Lock()
    started = time.monotonic()
    guard = process_guard()  # the runs die with this process, even by SIGKILL
    procs: list[subprocess.Popen[str]] = []
    pumps: list[threading.Thread] = []
    ended: dict[int, float] = {}

    def all_ended() -> bool:
        for i, proc in enumerate(procs):
            if i not in ended and wait_exit(proc.pid, 0):  # exited, not reaped
                ended[i] = time.monotonic() - started
        return len(ended) == len(procs)

    def signal_running(sig: int) -> None:
        for i, proc in enumerate(procs):
            if i not in ended:
                signal_group(proc.pid, sig)

    try:
        for c in cmds:
            proc = start(c.argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, text=True, guard=guard)
            procs.append(proc)
            assert proc.stdout is not None
            pump = threading.Thread(target=_pump, args=(c.suite, width, proc.stdout, out, lock), daemon=True)
            pump.start()
            pumps.append(pump)
        stopped = False
        while not all_ended():
            if PROCESS.received and not stopped:
                stopped = True
                terminate(signal_running, lambda seconds: wait_until(all_ended, seconds), GRACE)
            time.sleep(POLL)
    finally:
        # Never leave a run behind: reached with runs left only on an error of this process.
        if not all_ended():
            signal_running(signal.SIGKILL)
        for proc in procs:
            finish(proc, guard=guard)
    for pump in pumps:
        pump.join(timeout=5)
    return [(c.suite, int(p.returncode), ended.get(i, 0.0))
            for i, (c, p) in enumerate(zip(cmds, procs, strict=True))]


def run_one_at_a_time(cmds: Sequence[SmokeCommand], *, cwd: Path | None = None,
                      out: TextIO = sys.stdout) -> list[tuple[str, int, float]]:
    """`run_together` for one command after another (a smoke's `one_at_a_time`): a failing run
    does not stop the next; an interrupt does, and the runs not started are left out."""
    results: list[tuple[str, int, float]] = []
    for c in cmds:
        if PROCESS.received:
            break
        results.extend(run_together([c], cwd=cwd, out=out))
    return results


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m ci smoke",
        description="Run a smoke of the registry (e.g. gpu_smoke): each of its suites' runs on "
                    "emulated GPUs, all at once, sharing one set of GPU locks. Options it does not "
                    "know go to every `python -m ci run` (--dry-run, --history, -j, ...).",
        epilog="exit status: the first failing run's (registry order), 0 when all passed, 2 for bad "
               "input, 130 when interrupted")
    p.add_argument("name", help="the smoke's name in the registry (nox -l lists them)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the checkout (default: here)")
    p.add_argument("--shard", metavar="I/K",
                   help="run shard I of K of the smoke's entries, all its runs' together, balanced by "
                        "measured durations (a CI matrix job); default: every entry")
    p.add_argument("--one-at-a-time", action="store_true",
                   help="run the smoke's suites one after another instead of at once (the default "
                        "of a smoke whose registry entry sets one_at_a_time, as gpu_smoke_nightly does)")
    return p


def main(argv: Sequence[str]) -> int:
    args, rest = build_parser().parse_known_args(list(argv))
    root = args.root.resolve()
    smoke = _find(args.name, root)
    if args.shard is not None:
        smoke = shard_runs(smoke, root, args.shard)
    rest = [*rest, "--root", str(root)]
    if "--lock-path-pattern" in rest:
        raise UsageError("ci smoke picks the shared lock files itself; leave out --lock-path-pattern")
    locks = tempfile.mkdtemp(prefix="slime-ci-smoke-locks-")
    try:
        cmds = commands(smoke, os.path.join(locks, "gpu_{gpu_id}.lock"), rest)
        part = f" (shard {args.shard}: {sum(len(r.patterns) for r in smoke.runs)} entries)" \
            if args.shard else ""
        serial = args.one_at_a_time or smoke.one_at_a_time
        how = "one at a time" if serial else "at once"
        print(f"{smoke.name}{part}: {len(cmds)} run(s) {how} on {smoke.gpus} emulated GPUs: "
              f"{', '.join(c.suite for c in cmds)}", flush=True)
        results = (run_one_at_a_time if serial else run_together)(cmds, cwd=root)
    finally:
        shutil.rmtree(locks, ignore_errors=True)
    width = max(len("suite"), *(len(s) for s, _, _ in results))
    print(f"\n{'suite':<{width}}  exit  seconds")
    for suite, code, seconds in results:
        print(f"{suite:<{width}}  {code:>4}  {seconds:7.1f}")
    failed = [(s, c) for s, c, _ in results if c != 0]
    if PROCESS.received:
        return EXIT_INTERRUPTED
    if failed:
        print(f"{smoke.name}: failed: {', '.join(f'{s} (exit {c})' for s, c in failed)}", file=sys.stderr)
        return failed[0][1]
    return 0
