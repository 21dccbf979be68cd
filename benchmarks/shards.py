"""CI shards with and without recorded durations, side by side in one run.

The cpu_unit suite split K ways (`--shard I/K`) by the plan's LPT:

  without: a fresh runner, no durations file: every file weighs the same.
  with:    the durations the last real run of the suite recorded (durations.json,
           what the workflow restores from the last run on main).
  history: the p90 of every earlier run recorded in a run-history store (the
           estimate `run` plans with when the history has the entry).

Runs 1..N-1 record (into one durations file and one history store); each split is
then judged against what run N measured (not a run it was planned from, so no
side is graded on its own data):
the load of a shard is the sum of its files' measured seconds, and the figure is
slowest ÷ mean shard (1.00 is perfect; the goal from history is <= 1.10). The
history split is also shown as planned (judged on its own p90s): near 1.00 there means
the split itself is sound and what remains is the runs' own noise.

    python benchmarks/shards.py [--shards 4] [--runs 3] [-j N]

Run it where the `cpu` profile is installed (the cpu_unit venv, or the dev venv).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.registry.loader import load_registry  # noqa: E402
from ci.select.discover import discover  # noqa: E402
from ci.select.entries import ResolvedEntry, resolve, shard  # noqa: E402


def measure(store: Path, jobs: int | None, history: str = "off") -> tuple[dict[str, float], float, int, list[str]]:
    """One real run of cpu_unit recording into `store`; its durations, wall seconds, exit code
    and the runner's FAILED lines (a file that failed took seconds that are not its usual)."""
    argv = [sys.executable, "-m", "ci", "run", "--suite", "cpu_unit", "--durations", str(store),
            "--history", history, "--order", "longest"]
    if jobs:
        argv += ["-j", str(jobs)]
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    wall = time.monotonic() - start
    failed = [x[:160] for x in proc.stdout.splitlines() if x.startswith("FAILED ")]
    return json.loads(store.read_text(encoding="utf-8")), wall, proc.returncode, failed


def loads(entries: list[ResolvedEntry], count: int, plan_with: dict[str, float],
          truth: dict[str, float]) -> list[float]:
    """Measured seconds per shard when the suite is split by `plan_with`."""
    out = []
    for index in range(1, count + 1):
        mine = shard(entries, index, count, plan_with)
        out.append(sum(truth.get(e.id, 0.0) for e in mine))
    return out


def ratio(shard_loads: list[float]) -> float:
    return max(shard_loads) / statistics.mean(shard_loads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shards", type=int, default=4, help="K of --shard I/K (default 4)")
    parser.add_argument("-j", "--jobs", type=int, help="the runner's -j for the measuring runs")
    parser.add_argument("--runs", type=int, default=3, help="real runs: N-1 recorded, the last judges")
    parser.add_argument("--save", type=Path, help="write the measured seconds (last recorded run, "
                        "history p90, the judge) to this JSON file, to try other plans on them")
    args = parser.parse_args()
    if args.runs < 2:
        parser.error("--runs must be at least 2")
    entries = resolve(load_registry(ROOT)["cpu_unit"], discover(ROOT))
    print(f"cpu_unit: {len(entries)} files, split {args.shards} ways; {os.cpu_count()} cores, "
          f"load {os.getloadavg()[0]:.2f}")
    from ci.history.stats import estimates
    from ci.history.store import open_store

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'history.sqlite'}"
        for n in range(1, args.runs):
            recorded, wall1, rc1, failed1 = measure(Path(tmp) / "recorded.json", args.jobs, url)
            print(f"  run {n} (recorded, the plans' input): {wall1:.1f}s, exit {rc1}, {len(recorded)} files; "
                  f"load {os.getloadavg()[0]:.2f}")
            for line in failed1:
                print(f"    {line}")
        with open_store(url) as store:
            p90 = estimates(store.attempts(suite="cpu_unit"))
        truth, wall2, rc2, failed2 = measure(Path(tmp) / "truth.json", args.jobs)
        print(f"  run {args.runs} (measured, the judge):        {wall2:.1f}s, exit {rc2}, {len(truth)} files; "
              f"load {os.getloadavg()[0]:.2f}")
        for line in failed2:
            print(f"    {line}")
    missing = [e.id for e in entries if e.id not in truth]
    if missing:
        print(f"  warning: {len(missing)} files have no measurement (counted as 0 s): {missing[:3]}")
    drift = statistics.median(abs(recorded[k] - truth[k]) / max(truth[k], 0.01)
                              for k in truth if k in recorded)
    print(f"  per-file drift between the two runs: median {drift:.0%}")
    worst = sorted(truth, key=lambda k: -abs(truth[k] - p90.get(k, 0.0)))[:3]
    print("  furthest from the plan: " + ", ".join(
        f"{k} {p90.get(k, 0.0):.0f}s planned, {truth[k]:.0f}s measured" for k in worst))
    if args.save:
        args.save.write_text(json.dumps({"recorded": recorded, "p90": p90, "truth": truth}, indent=1),
                             encoding="utf-8")
    rows = [("without durations (fresh runner)", loads(entries, args.shards, {}, truth)),
            ("with the last run's durations", loads(entries, args.shards, recorded, truth)),
            (f"with history p90 ({args.runs - 1} runs)", loads(entries, args.shards, p90, truth))]
    for name, shard_loads in rows:
        shown = " ".join(f"{x:6.1f}" for x in shard_loads)
        print(f"{name:<34} shards [s]: {shown}   slowest/mean {ratio(shard_loads):.2f}")
    planned = loads(entries, args.shards, p90, p90)
    print(f"{'history p90, as planned':<34} shards [s]: {' '.join(f'{x:6.1f}' for x in planned)}   "
          f"slowest/mean {ratio(planned):.2f}")
    print(f"ratio with history: {ratio(rows[2][1]):.2f} (goal <= 1.10); last run only: "
          f"{ratio(rows[1][1]):.2f}; without: {ratio(rows[0][1]):.2f}; load now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
