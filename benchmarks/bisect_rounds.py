"""Benchmark `python -m ci bisect`: binary search against the parallel (g+1)-ary search on the
same planted ranges, with 1, 2 and 4 free GPU sets of 8 emulated GPUs, side by side.

    python benchmarks/bisect_rounds.py                 # a few minutes on a busy 2-core machine
    python benchmarks/bisect_rounds.py --rounds-only   # only the search's rounds (seconds)

1. Rounds, over every position of the first bad commit in ranges of 32, 128 and 512
   commits: the search itself (ci/bisect/search.py), mean and worst rounds per width.
   Width 1 is binary search.
2. Wall time, end to end, on the planted 32-commit repository of the tests
   (tests/toolkit/_bisect_repo.py: a 2-GPU entry that breaks at commit 20 and takes
   --entry-seconds per run, standing in for a GPU test). Another job holds 8 - 2g of the 8
   emulated GPUs under the GPU lock, so the bisect finds g free sets of 2 and tests g
   commits per round; g = 1 is binary search.
Goal it prints: with 4 free sets, at most half the rounds of binary search on 32 commits.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "toolkit")]

from ci.bisect.search import Search  # noqa: E402
from ci.gpu.allocator import hold  # noqa: E402

WIDTHS = (1, 2, 4)


def search_rounds(n: int, width: int) -> list[int]:
    """Rounds for each planted first bad commit 1..n (the bad end assumed, confirmed if it is the answer)."""
    out = []
    for first_bad in range(1, n + 1):
        s = Search(n=n, width=width, bad_end_known=True)
        while batch := s.next_round():
            for i in batch:
                s.record(i, i < first_bad)
        assert s.verdict().index == first_bad
        out.append(len(s.rounds))
    return out


def rounds_table() -> float:
    print("1. search rounds over every planted position (width 1 = binary)")
    print(f"{'commits':>8}  " + "  ".join(f"{'g=' + str(w) + ' mean/max':>16}" for w in WIDTHS)
          + "  mean ratio g=4 / binary")
    ratio32 = 0.0
    for n in (32, 128, 512):
        stats = [search_rounds(n, w) for w in WIDTHS]
        means = [sum(s) / len(s) for s in stats]
        cells = "  ".join(f"{m:>10.2f} / {max(s):<3}" for m, s in zip(means, stats, strict=True))
        ratio = means[-1] / means[0]
        ratio32 = ratio if n == 32 else ratio32
        print(f"{n:>8}  {cells}  {ratio:.2f}")
    return ratio32


def wall_times(entry_seconds: float) -> list[tuple[int, int, float, int]]:
    import _bisect_repo as planted

    print(f"\n2. end to end on the planted repository (32 commits, break at {planted.BREAK}, "
          f"a 2-GPU entry of {entry_seconds:g}s; load average {os.getloadavg()[0]:.1f})")
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        repo = Path(tmp) / "repo"
        repo.mkdir()
        clone, shas = planted.build(repo, gpu_sleep=entry_seconds)
        pattern = str(Path(tmp) / "gpu_{gpu_id}.lock")
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        for free in WIDTHS:
            with hold(count=8 - 2 * free, total_gpus=8, lock_path_pattern=pattern, command="other job") \
                    if free < 4 else nullcontext():
                began = time.monotonic()
                proc = subprocess.run(
                    [sys.executable, "-m", "ci", "bisect", "--suite", "gpu", "--entry", "tests/gpu/test_pair.py",
                     "--good", shas[0], "--bad", shas[32], "--emulate-gpus", "--lock-path-pattern", pattern,
                     "--history", "off", "--root", str(clone.root), "--run-arg=--no-prefork"],
                    cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
                wall = time.monotonic() - began
            found = f"first bad commit: {shas[planted.BREAK][:10]}" in proc.stdout
            if proc.returncode != 0 or not found:
                raise SystemExit(f"g={free}: bisect failed ({proc.returncode})\n{proc.stdout}{proc.stderr}")
            rounds = len(re.findall(r"^round \d+:", proc.stdout, re.M))
            steps = len(re.findall(r"attempt \d+: (passed|failed)", proc.stdout))
            out.append((free, rounds, wall, steps))
            print(f"  g={free}: {rounds} rounds, {steps} steps, {wall:.1f}s", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds-only", action="store_true", help="only the search's rounds")
    p.add_argument("--entry-seconds", type=float, default=3.0, help="seconds one run of the entry takes")
    args = p.parse_args()
    ratio32 = rounds_table()
    ok = ratio32 <= 0.5
    if not args.rounds_only:
        runs = wall_times(args.entry_seconds)
        base = runs[0]
        print(f"\n{'free GPU sets':>14}  {'rounds':>6}  {'steps':>5}  {'wall':>8}  {'wall / binary':>13}")
        for free, rounds, wall, steps in runs:
            print(f"{free:>14}  {rounds:>6}  {steps:>5}  {wall:>7.1f}s  {wall / base[2]:>13.2f}")
        ok = ok and runs[-1][1] * 2 <= base[1]
    print(f"\ngoal: 4 free sets take at most half the rounds of binary search on 32 commits: "
          f"{'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
