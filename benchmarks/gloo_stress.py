"""run_ranks under load, many times: how often a gloo rank test fails when nothing is wrong.

    python benchmarks/gloo_stress.py [--early-exit N] [--file-runs M] [--load K] [-j J] [FILE ...]

While K busy loops run at normal priority (default: one per core, so every rank competes
for the CPU), it runs

  early exit  N calls of `run_ranks` on 2 ranks whose function runs no collective and
              returns at once (the case that failed with "Gloo connectFullMesh failed ...
              Connection closed by peer"), each from the zygote as in a test file;
  files       M runs of `python -m ci run --suite cpu_unit -j J FILE ...` over every
              test file that calls run_ranks (default), counting each file's outcome.

Prints each failure as it happens, then the counts and wall times; exits 1 when anything
failed. Nothing is retried. Run it from the repository root in an environment with the
cpu profile installed.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

# A busy loop that ends when the process that started it is gone: a killed run (a runner's
# timeout, a SIGKILL) must not leave cores spinning under init.
BUSY = "import os\nparent = os.getppid()\nwhile os.getppid() == parent:\n    pass\n"

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"


def run_ranks_users() -> list[str]:
    """Test files of the CPU tier that call run_ranks."""
    return sorted(str(p.relative_to(ROOT)) for p in TESTS.glob("test_*.py")
                  if re.search(r"\brun_ranks\(", p.read_text(encoding="utf-8")))


def _leave_at_once(rank: int, world: int) -> int:
    return rank


def early_exit(runs: int) -> tuple[int, float]:
    """Failures in `runs` consecutive calls, and the wall time."""
    sys.path.insert(0, str(TESTS))
    import _gloo

    why = _gloo.start_zygote()
    if why:
        print(f"early exit: no zygote ({why}); ranks come from the forkserver")
    failed = 0
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gloo-stress-") as tmp:
        for i in range(runs):
            run_dir = Path(tmp) / f"run{i}"
            run_dir.mkdir()
            try:
                out = _gloo.run_ranks(_leave_at_once, 2, run_dir, timeout=60)
                assert out == [0, 1], out
            except AssertionError as exc:
                failed += 1
                print(f"early exit run {i + 1}: FAILED\n{exc}", flush=True)
    _gloo.stop_zygote()
    return failed, time.monotonic() - start


def file_runs(files: list[str], runs: int, jobs: int) -> tuple[Counter[str], Counter[str], float]:
    """Per file: runs passed, runs failed; and the wall time of all runs."""
    passed: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gloo-stress-") as tmp:
        for i in range(runs):
            junit = Path(tmp) / f"junit{i}.xml"
            t0 = time.monotonic()
            proc = subprocess.run(
                [sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "-j", str(jobs),
                 "--junit", str(junit), "--durations", str(Path(tmp) / "durations.json"), *files],
                cwd=ROOT, env=env, capture_output=True, text=True, check=False)
            bad = _failed_files(junit, files) if junit.exists() else set(files)
            for f in files:
                (failed if f in bad else passed)[f] += 1
            print(f"files run {i + 1}/{runs}: exit {proc.returncode}, {len(bad)} failed, "
                  f"{time.monotonic() - t0:.0f}s", flush=True)
            if proc.returncode != 0:
                print(proc.stdout[-4000:], flush=True)
    return passed, failed, time.monotonic() - start


def _failed_files(junit: Path, files: list[str]) -> set[str]:
    """Files whose suite in the merged JUnit file has a failure or error, or that have none."""
    ok: set[str] = set()
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        name = suite.get("name", "")
        if name in files and int(suite.get("tests", 0)) > 0 and not (
                int(suite.get("failures", 0)) or int(suite.get("errors", 0))):
            ok.add(name)
    return set(files) - ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="*", help="test files (default: every run_ranks user)")
    ap.add_argument("--early-exit", type=int, default=200, metavar="N")
    ap.add_argument("--file-runs", type=int, default=10, metavar="M")
    ap.add_argument("--load", type=int, default=len(os.sched_getaffinity(0)), metavar="K")
    ap.add_argument("-j", "--jobs", type=int, default=len(os.sched_getaffinity(0)))
    args = ap.parse_args(argv)
    files = args.files or run_ranks_users()
    busy = [subprocess.Popen([sys.executable, "-c", BUSY], start_new_session=True)
            for _ in range(args.load)]
    try:
        print(f"load: {args.load} busy loops; load average {os.getloadavg()[0]:.1f}", flush=True)
        ee_failed, ee_time = early_exit(args.early_exit) if args.early_exit else (0, 0.0)
        passed, failed, f_time = file_runs(files, args.file_runs, args.jobs) if args.file_runs else (
            Counter(), Counter(), 0.0)
    finally:
        for p in busy:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    print(f"\nearly exit: {args.early_exit - ee_failed}/{args.early_exit} passed in {ee_time:.1f}s")
    for f in files if args.file_runs else []:
        print(f"{f}: {passed[f]}/{args.file_runs} runs passed")
    print(f"files: {args.file_runs} runs of {len(files)} files in {f_time:.0f}s; "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    return 1 if ee_failed or sum(failed.values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
