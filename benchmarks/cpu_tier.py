"""The CPU tiers four ways, side by side in one run.

For each suite (default: cpu_unit and agent_adapter), on the same files:

  sequential  a loop of `python tests/<file>` (what the original workflow did)
  prefork     `python -m ci run --suite S` (each file forked from a worker that
              imported pytest/numpy/torch once; own process group per file, -j cores)
  fresh       `python -m ci run --suite S --no-prefork` (a fresh interpreter per file)
  xdist       `pytest -n <cores>` over the same files: the fast way with no per-file
              isolation. pytest-xdist is used only here, for comparison; no suite
              needs it (install it by hand: `pip install pytest-xdist`).

    python benchmarks/cpu_tier.py [--suite NAME ...] [--repeat N] [-j N] [--root R] [--files-at REV]

`--root` measures another checkout with its own `ci/registry/repo_suites.py` (e.g. one written by
`python -m ci import-workflow`). `--files-at REV` keeps only the suite's files that already
existed at git revision REV (e.g. the 37 cpu_unit files of a8fb8af, when the target was set),
so a suite that has since grown heavier can be compared with the one first measured.

Prints every wall time, each run's exit status, the load average before and after,
and the ratios the CPU tiers aim for: prefork <= 1.3 x xdist and <= 0.25 x sequential.
Run it in an environment with the suites' profiles installed, on a quiet machine:
on a shared one the numbers move with the load (the load average is printed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.registry.loader import load_registry  # noqa: E402
from ci.select.discover import discover  # noqa: E402
from ci.select.entries import resolve  # noqa: E402

WAYS = ("sequential", "prefork", "fresh", "xdist")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


CHECKOUT = ROOT  # the checkout measured (--root)
ARGS_REV = ""  # --files-at, for the headings


def _timed(argv: Sequence[str]) -> tuple[float, int]:
    start = time.monotonic()
    proc = subprocess.run(list(argv), cwd=CHECKOUT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False, env=ENV)
    return time.monotonic() - start, proc.returncode


def sequential(files: Sequence[str]) -> tuple[float, str]:
    """`python tests/<file>` one after another; returns wall seconds and failed files."""
    failed = []
    start = time.monotonic()
    for path in files:
        _, rc = _timed([sys.executable, path])
        if rc != 0:
            failed.append(path)
    return time.monotonic() - start, f"{len(failed)} files failed" + (f": {', '.join(failed)}" if failed else "")


def ours(suite: str, jobs: int, store: Path, files: Sequence[str], *, prefork: bool) -> tuple[float, str]:
    argv = [sys.executable, "-m", "ci", "run", "--suite", suite, "--durations", str(store),
            "-j", str(jobs), "--root", str(CHECKOUT), *files]
    seconds, rc = _timed(argv if prefork else [*argv, "--no-prefork"])
    return seconds, f"exit {rc}"


def xdist(files: Sequence[str], jobs: int) -> tuple[float, str]:
    seconds, rc = _timed([sys.executable, "-m", "pytest", "-n", str(jobs), "-q", "-p", "no:cacheprovider",
                          *files])
    return seconds, f"exit {rc}"


def _load() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "n/a"


def files_at(rev: str) -> set[str]:
    """Paths of the files tracked at `rev` in the measured checkout."""
    out = subprocess.run(["git", "ls-tree", "-r", "--name-only", rev], cwd=CHECKOUT, capture_output=True,
                         text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"error: --files-at {rev}: {out.stderr.strip() or 'not a revision'}")
    return set(out.stdout.split())


def bench(suite: str, jobs: int, repeat: int, has_xdist: bool, keep: set[str] | None) -> dict[str, float]:
    files = [e.path for e in resolve(load_registry(CHECKOUT)[suite], discover(CHECKOUT))]
    total = len(files)
    if keep is not None:
        files = [f for f in files if f in keep]
    chosen = files if keep is not None else []  # the runner takes the whole suite without paths
    if not files:
        raise SystemExit(f"error: {suite} has no file left to measure")
    print(f"\n{suite}: {len(files)} files" + (f" (of {total}: those at {ARGS_REV})" if keep is not None else "")
          + f", -j {jobs}; load average before: {_load()}")
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "durations.json"
        ours(suite, jobs, store, chosen, prefork=True)  # unmeasured: fills the durations store, warms caches
        for i in range(repeat):
            runs = {
                "sequential": lambda: sequential(files),
                "prefork": lambda: ours(suite, jobs, store, chosen, prefork=True),
                "fresh": lambda: ours(suite, jobs, store, chosen, prefork=False),
                "xdist": lambda: xdist(files, jobs) if has_xdist else (float("nan"), "not installed"),
            }
            shown = []
            for way, run in runs.items():
                seconds, status = run()
                times[way].append(seconds)
                shown.append(f"{way} {seconds:6.1f}s ({status})")
            print(f"  round {i + 1}: " + "   ".join(shown))
    print(f"  load average after: {_load()}")
    return {way: statistics.median(values) for way, values in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--suite", action="append", help="suite(s) to measure (default: cpu_unit, agent_adapter)")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the four ways (default 1)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="parallelism of ours and of xdist (default: CPU count)")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    parser.add_argument("--files-at", metavar="REV",
                        help="measure only the suite's files that existed at this git revision")
    args = parser.parse_args()
    global CHECKOUT, ARGS_REV  # noqa: PLW0603 - set once, from the command line
    CHECKOUT = args.root.resolve()
    ARGS_REV = args.files_at or ""
    keep = files_at(args.files_at) if args.files_at else None
    has_xdist = importlib.util.find_spec("xdist") is not None
    if not has_xdist:
        print("pytest-xdist is not installed: the xdist column is skipped (pip install pytest-xdist)")
    print(f"{os.cpu_count()} cores, python {sys.version.split()[0]}")
    medians = {suite: bench(suite, args.jobs, args.repeat, has_xdist, keep)
               for suite in args.suite or ["cpu_unit", "agent_adapter"]}
    print(f"\n{'suite':<14}" + "".join(f"{way:>12}" for way in WAYS)
          + f"{'pf/xdist':>10}{'pf/seq':>8}{'pf/fresh':>10}")
    for suite, m in medians.items():
        print(f"{suite:<14}" + "".join(f"{m[way]:>11.1f}s" for way in WAYS)
              + f"{m['prefork'] / m['xdist']:>10.2f}{m['prefork'] / m['sequential']:>8.2f}"
              + f"{m['prefork'] / m['fresh']:>10.2f}")
    print("goals: prefork <= 1.3 x xdist (pf/xdist), <= 0.25 x sequential (pf/seq)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
