"""Benchmark a private Ray head's start-up with `--record-executed`'s coverage on and off.

    python benchmarks/record_executed_ray_head.py              # 2 rounds: ~4 minutes on 2 cores
    python benchmarks/record_executed_ray_head.py --rounds 1

slime's private head (slime/utils/external_utils/ray_head.py) is started with no GPUs,
once with the environment a recording run gives its entries (`COVERAGE_PROCESS_START`
naming the run's rcfile, the flush plugin on PYTHONPATH) and once without, alternating
the order each round so that load on the machine hits both sides alike. Ray gives its
dashboard 60 s to come up (`RAY_DASHBOARD_STARTUP_TIMEOUT_S`); a head that misses it
counts as failed. Prints each start, then per side the starts that came up, their median
seconds, and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ci.run import coverage_flush, record_executed  # noqa: E402
from slime.utils.external_utils.ray_head import private_head  # noqa: E402


def start_once(env: dict[str, str]) -> float | None:
    """Seconds until the head was up (it is stopped at once); None when it failed to start."""
    began = time.time()
    try:
        with private_head(num_gpus=0, env=env, start_attempts=1):
            return time.time() - began
    except Exception as exc:  # Ray's own start-up failure is the measurement here
        print(f"    failed after {time.time() - began:.1f} s: {str(exc).splitlines()[0][:100]}")
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="starts per side (default 2)")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="ray-head-recording-"))
    try:
        (scratch / record_executed.RCFILE).write_text(record_executed.rcfile_text(scratch, ROOT))
        shutil.copyfile(coverage_flush.__file__, scratch / f"{record_executed.FLUSH_PLUGIN}.py")
        plain = {k: v for k, v in os.environ.items() if not k.startswith("COVERAGE")}
        recording = {**plain, "COVERAGE_PROCESS_START": str(scratch / record_executed.RCFILE),
                     "PYTHONPATH": os.pathsep.join(p for p in (str(scratch), plain.get("PYTHONPATH", "")) if p),
                     "SLIME_CI_ENTRY": "benchmark"}
        sides = {"off": plain, "on": recording}
        got: dict[str, list[float | None]] = {"off": [], "on": []}
        for n in range(args.rounds):
            for side in (("off", "on") if n % 2 == 0 else ("on", "off")):
                seconds = start_once(sides[side])
                got[side].append(seconds)
                shown = "failed" if seconds is None else f"up in {seconds:.1f} s"
                print(f"round {n + 1} recording {side:3}: {shown} (load {os.getloadavg()[0]:.1f})")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    medians = {}
    for side, values in got.items():
        up = [v for v in values if v is not None]
        medians[side] = statistics.median(up) if up else None
        shown = f"{medians[side]:.1f} s" if up else "-"
        print(f"recording {side:3}: {len(up)} of {len(values)} up, median {shown}")
    if medians["off"] and medians["on"]:
        print(f"on / off: {medians['on'] / medians['off']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
