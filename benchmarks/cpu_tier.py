"""The CPU tier through our runner vs. the original way, side by side in one run.

Original: a sequential loop of `python tests/<file>` (what the old workflow did).
Ours:     `python -m ci run --suite cpu_unit` (one process group per file, -j cores,
          longest first, thread pools sized to the share of cores).

    python benchmarks/cpu_tier.py [--repeat N] [-j N] [--root R [--durations FILE]] [PATH ...]

`--root` measures another checkout with its own `ci/suites.py` (e.g. one written by
`python -m ci import-workflow`); PATHs measure a subset of the suite's files.

Prints both wall times and their ratio (ours ÷ original; the goal is ≤ 0.6 on 2 cores).
Run it in an environment with the `cpu` profile installed (e.g. the cpu_unit venv).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.discover import discover  # noqa: E402
from ci.plan import registry, resolve, select_paths  # noqa: E402


def original(files: list[str], root: Path) -> tuple[float, int]:
    """Sequential `python tests/<file>`; returns wall seconds and the number of failed files."""
    failed = 0
    start = time.monotonic()
    for path in files:
        proc = subprocess.run([sys.executable, path], cwd=root, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, check=False)
        failed += proc.returncode != 0
    return time.monotonic() - start, failed


def ours(jobs: int | None, durations: Path, root: Path, paths: list[str]) -> tuple[float, int]:
    """Our runner over the same suite; returns wall seconds and its exit code."""
    argv = [sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "--durations", str(durations),
            "--root", str(root), *paths]
    if jobs:
        argv += ["-j", str(jobs)]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.monotonic() - start, proc.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=1, help="pairs of runs (default 1)")
    parser.add_argument("-j", "--jobs", type=int, help="our runner's -j (default: CPU count)")
    parser.add_argument("--root", type=Path, default=ROOT, help="checkout to measure (default: this one)")
    parser.add_argument("--durations", type=Path, help="an existing durations store (skips the warm-up pass)")
    parser.add_argument("paths", nargs="*", help="only these files of the suite")
    args = parser.parse_args()
    root = args.root.resolve()
    suite = {s.name: s for s in registry(root)}["cpu_unit"]
    entries = resolve(suite, discover(root))
    if args.paths:
        entries = select_paths(entries, args.paths, suite="cpu_unit")
    files = sorted({e.path for e in entries})
    print(f"CPU tier of {root}: {len(files)} files, {os.cpu_count()} cores, python {sys.version.split()[0]}, "
          f"load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "durations.json"
        if args.durations is not None:
            store.write_bytes(args.durations.read_bytes())
        else:
            # One unmeasured pass of ours fills the durations store, as any earlier run would.
            ours(args.jobs, store, root, args.paths)
        base_times, our_times = [], []
        for i in range(args.repeat):
            b, b_failed = original(files, root)
            o, o_rc = ours(args.jobs, store, root, args.paths)
            base_times.append(b)
            our_times.append(o)
            print(f"  pair {i + 1}: original {b:7.1f}s ({b_failed} files failed)   "
                  f"ours {o:7.1f}s (exit {o_rc})   load {os.getloadavg()[0]:.1f}")
    b, o = statistics.median(base_times), statistics.median(our_times)
    print(f"original (sequential python tests/<file>): {b:.1f}s")
    print(f"ours (python -m ci run --suite cpu_unit):  {o:.1f}s")
    print(f"ratio ours/original: {o / b:.2f}  (goal <= 0.60)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
