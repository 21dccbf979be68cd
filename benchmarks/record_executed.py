"""Benchmark `python -m ci run --record-executed`: each entry's seconds with recording on and off.

    python benchmarks/record_executed.py            # ~4 minutes on a busy 2-core machine

The two entries of tests/toolkit/run/test_record_executed.py (one saves and loads a
checkpoint through slime's FSDP checkpointer; one starts torchrun with two ranks) run on
emulated GPUs in a scratch checkout holding a copy of slime/, --repeat times each way,
alternating so that load on the machine hits both sides alike. Prints the median seconds
per entry off and on, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "toolkit"))
sys.path.insert(0, str(ROOT / "tests" / "toolkit" / "run"))

from _ci import run_ci  # noqa: E402
from test_record_executed import checkout_with_slime  # noqa: E402


def once(root: Path, *, record: bool) -> dict[str, float]:
    """One run of the suite; each entry's measured seconds."""
    durations = root / "durations.json"
    durations.unlink(missing_ok=True)
    flag = ("--record-executed",) if record else ()
    proc = run_ci("run", "--suite", "train", "--root", str(root), "--emulate-gpus", "--gpus", "2",
                  "-j", "1", "--durations", str(durations), *flag, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(proc.stdout[-3000:] + proc.stderr[-3000:])
    return {k: float(v) for k, v in json.loads(durations.read_text()).items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = checkout_with_slime(Path(tmp))
        seen: dict[bool, list[dict[str, float]]] = {False: [], True: []}
        for _ in range(args.repeat):
            for record in (False, True):
                seen[record].append(once(root, record=record))
    print(f"{'entry':<28} {'off s':>7} {'on s':>7} {'on/off':>7}")
    for entry in sorted(seen[False][0]):
        off = statistics.median(r[entry] for r in seen[False])
        on = statistics.median(r[entry] for r in seen[True])
        print(f"{entry:<28} {off:7.1f} {on:7.1f} {on / off:7.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
