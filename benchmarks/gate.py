"""The gate's time from a fresh clone: each session's install and run, the slowest files and
tests of each suite, and the sum against the budget.

Each repetition clones this checkout's HEAD into a temporary folder (so what is measured is
what is committed, with no `.nox` and no `.ci-cache`) and runs nox there with an empty uv
cache of its own, as on a fresh machine; every line nox prints is timestamped as it
arrives. A session's install is the time from its start to its first command that is not a
venv or an install step; its run is the rest. After the repetitions it prints one table
per repetition, the median of each session, the total against the budget, and, from the
JUnit files of the last repetition, the slowest files and tests of each suite.

    python benchmarks/gate.py                          # nox -t ci once (about 25 minutes)
    python benchmarks/gate.py -s cpu_unit --repeat 3   # a cold `nox -s cpu_unit`, three times
    python benchmarks/gate.py --ci-run                 # bash .ci/run, as CI runs it (as root)
    python benchmarks/gate.py --budget 25 --top 20 --keep

Run nothing beside it: on two cores any other work lands in the figures. Exit status: 0
when every run passed within the budget, 1 when one was over it, 2 when nox failed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = re.compile(r"^nox > Running session (\S+)")
END = re.compile(r"^nox > Session (\S+) (?:was successful|failed|aborted|was skipped)")
COMMAND = re.compile(r"^nox > (?!Running session|Session |Creating virtual|Re-using|\* |Ran multiple)(.+)")
# Steps of a session's set-up: the venv, installs, the .pth naming the checkout (noxfile.py).
INSTALL = re.compile(r"^(uv pip install|python -m pip install|pip install|python -c 'import pathlib, sys, sysconfig)")


@dataclass
class Session:
    name: str
    started: float
    install_end: float | None = None
    ended: float | None = None
    ok: bool = False

    @property
    def install(self) -> float:
        end = self.install_end if self.install_end is not None else self.ended
        return (end or self.started) - self.started

    @property
    def run(self) -> float:
        return (self.ended or self.started) - self.started - self.install


@dataclass
class Repetition:
    sessions: list[Session] = field(default_factory=list)
    wall: float = 0.0
    returncode: int = 0


def _clone(dest: Path) -> None:
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.strip()
    if dirty:
        print("gate: the checkout has uncommitted changes; the clone measures HEAD without them",
              file=sys.stderr)
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(dest)], check=True)


def _run_once(args: argparse.Namespace, workdir: Path, number: int) -> Repetition:
    clone = workdir / f"clone-{number}"
    _clone(clone)
    env = dict(os.environ)
    env["UV_CACHE_DIR"] = str(workdir / f"uv-cache-{number}")  # as on a fresh machine
    env.pop("VIRTUAL_ENV", None)
    if args.ci_run:
        command = ["bash", ".ci/run"]  # what CI runs: its installs and services, then nox -t ci
    else:
        command = ["nox", "-s", *args.session] if args.session else ["nox", "-t", args.tag]
    print(f"gate: run {number + 1}/{args.repeat}: {' '.join(command)} in {clone}", flush=True)
    rep = Repetition()
    log = (workdir / f"nox-{number}.log").open("w", encoding="utf-8")
    begun = time.monotonic()
    # Its own process group: Ctrl-C or SIGTERM here ends nox and everything under it (below).
    proc = subprocess.Popen(command, cwd=clone, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1, start_new_session=True)
    assert proc.stdout is not None
    try:
        _follow(proc, args, rep, log, begun)
    except KeyboardInterrupt:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        log.close()
        raise
    rep.returncode = proc.wait()
    rep.wall = time.monotonic() - begun
    log.close()
    return rep


def _follow(proc: subprocess.Popen[str], args: argparse.Namespace, rep: Repetition, log, begun: float) -> None:
    """Timestamp nox's lines into the log and mark where each session starts, installs, ends."""
    assert proc.stdout is not None
    current: Session | None = None
    for line in proc.stdout:
        now = time.monotonic() - begun
        log.write(f"{now:8.1f} {line}")
        if args.verbose:
            sys.stdout.write(line)
        if m := START.match(line):
            current = Session(m.group(1), now)
            rep.sessions.append(current)
            print(f"  {now:7.1f}s  {current.name}: started", flush=True)
        elif (m := END.match(line)) and current is not None:
            current.ended, current.ok = now, "was successful" in line
            if current.install_end is None:
                current.install_end = now
            print(f"  {now:7.1f}s  {current.name}: {'passed' if current.ok else 'FAILED'} "
                  f"(install {current.install:.0f}s, run {current.run:.0f}s)", flush=True)
            current = None
        elif ((m := COMMAND.match(line)) and current is not None and current.install_end is None
              and not INSTALL.match(m.group(1))):
            current.install_end = now


def _slowest(clone: Path, top: int) -> None:
    for xml in sorted((clone / ".ci-cache" / "junit").glob("*.xml")):
        files: dict[str, float] = defaultdict(float)
        tests: list[tuple[float, str]] = []
        for suite in ET.parse(xml).iter("testsuite"):  # one per file (entry), its wall time
            where = suite.get("name") or "?"
            files[where] += float(suite.get("time") or 0)
            for case in suite.iter("testcase"):
                tests.append((float(case.get("time") or 0), f"{case.get('classname')}::{case.get('name')}"))
        print(f"\n{xml.stem}: {len(tests)} tests, {sum(files.values()):.0f} s of file time")
        print(f"  slowest files (s){'':<46}slowest tests (s)")
        by_file = sorted(files.items(), key=lambda kv: -kv[1])[:top]
        by_test = sorted(tests, reverse=True)[:top]
        for i in range(max(len(by_file), len(by_test))):
            left = f"{by_file[i][1]:7.1f} {by_file[i][0]}" if i < len(by_file) else ""
            right = f"{by_test[i][0]:7.1f} {by_test[i][1]}" if i < len(by_test) else ""
            print(f"  {left:<62.62}  {right}")


def _interrupted(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM as Ctrl-C: the run's process group is ended either way


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupted)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="exit codes: 0 passed within the budget, 1 over the budget, "
                                       "2 nox failed")
    p.add_argument("-s", "--session", action="append", default=[],
                   help="a session to run (repeatable); default: the sessions tagged --tag")
    p.add_argument("-t", "--tag", default="ci", help="the nox tag to run (default: ci)")
    p.add_argument("--ci-run", action="store_true",
                   help="run the clone's `bash .ci/run` (CI's own entry point: installs, services, "
                        "nox -t ci) instead of nox")
    p.add_argument("--repeat", type=int, default=1, help="fresh clones to run one after another (default 1)")
    p.add_argument("--budget", type=float, default=None,
                   help="minutes the run may take (default: 25 for -t ci, 3 for one session)")
    p.add_argument("--top", type=int, default=20, help="slowest files and tests per suite (default 20)")
    p.add_argument("--keep", action="store_true", help="keep the clones and logs")
    p.add_argument("-v", "--verbose", action="store_true", help="echo nox's output")
    args = p.parse_args(argv)
    if args.repeat < 1:
        p.error("--repeat must be at least 1")
    if shutil.which("nox") is None:
        print("gate: nox is not on PATH: python3 -m pip install nox uv", file=sys.stderr)
        return 2
    if args.ci_run and args.session:
        p.error("--ci-run runs what .ci/run runs; leave out -s")
    budget = args.budget if args.budget is not None else (25.0 if not args.session else 3.0)
    workdir = Path(tempfile.mkdtemp(prefix="slime-ci-gate-"))
    load = os.getloadavg()
    reps: list[Repetition] = []
    try:
        for n in range(args.repeat):
            try:
                reps.append(_run_once(args, workdir, n))
            except KeyboardInterrupt:
                print(f"gate: interrupted; the run was stopped; logs in {workdir}", file=sys.stderr)
                args.keep = True
                return 130
        print(f"\nload average before: {load[0]:.2f}, after: {os.getloadavg()[0]:.2f}; "
              f"uv {'found' if shutil.which('uv') else 'missing: sessions installed with pip'}")
        names = list(dict.fromkeys(s.name for r in reps for s in r.sessions))
        head = f"{'session':<16}" + "".join(f"  run {i + 1} install/run/total" for i in range(len(reps)))
        print("\n" + head + "   median total")
        for name in names:
            cells, totals = [], []
            for r in reps:
                s = next((x for x in r.sessions if x.name == name), None)
                if s is None:
                    cells.append(f"{'-':>29}")
                    continue
                totals.append(s.install + s.run)
                cells.append(f"{s.install:9.0f}{s.run:7.0f}{s.install + s.run:7.0f}s{'' if s.ok else '!'}"
                             .rjust(29))
            print(f"{name:<16}" + "".join(f"  {c}" for c in cells) + f"{statistics.median(totals):11.0f}s")
        walls = [r.wall for r in reps]
        print(f"{'whole run':<16}" + "".join(f"  {w:27.0f}s" for w in walls)
              + f"{statistics.median(walls):11.0f}s")
        installs = [sum(s.install for s in r.sessions) for r in reps]
        print(f"installs: median {statistics.median(installs):.0f} s of the run")
        median = statistics.median(walls) / 60
        verdict = "within" if median <= budget else "OVER"
        print(f"median {median:.1f} min against a budget of {budget:g} min: {verdict}")
        _slowest(workdir / f"clone-{len(reps) - 1}", args.top)
        if any(r.returncode != 0 for r in reps):
            print(f"gate: nox failed (exit {[r.returncode for r in reps]}); logs in {workdir}", file=sys.stderr)
            args.keep = True
            return 2
        return 0 if median <= budget else 1
    finally:
        if args.keep:
            print(f"kept: {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
