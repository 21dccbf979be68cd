"""The megatron-shaped matrix on a Ray cluster of 2 nodes x 8 GPUs vs on one 8-GPU box, side by side.

    python benchmarks/cluster.py [--scale 0.3]

The matrix: the 31 entries of the original megatron matrix (2/4/6/8 GPUs), with
synthetic durations in real minutes (as in benchmarks/gpu_lock.py) scaled down to
sleeps (--scale seconds per minute). Both sides run through the real CLI with the
same durations store (so both start longest first), on logical GPUs:

  one box:  python -m ci run --emulate-gpus --gpus 8        (local runner, GPU lock files)
  cluster:  python -m ci run --emulate-gpus --ray-address … (a head and two workers with
            8 logical GPUs each, started with `ray start` on loopback, stopped by pid)

Each entry records when it really started and ended; makespan = last end - first
start. Lower bound = max(sum(GPUs x seconds) / GPUs available, longest entry).
Printed: makespan / lower bound for both (the goal on the cluster is <= 1.10).
Everything the entries do beyond sleeping (Python start-up, Ray placing the task)
counts against the runner, not the bound.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


lock_bench = _load("_lock_bench", ROOT / "benchmarks" / "gpu_lock.py")
ray_cluster = _load("_ray_cluster", ROOT / "tests" / "toolkit" / "_ray_cluster.py")

ENTRY = """
    import json, os, sys, time
    NUM_GPUS = {n}

    def execute(name, seconds):
        start = time.time()
        time.sleep(seconds)
        with open(os.environ["SLIME_TEST_RECORD"], "a") as fh:
            fh.write(json.dumps({{"name": name, "start": start, "end": time.time()}}) + "\\n")

    if __name__ == "__main__":
        execute(sys.argv[sys.argv.index("--name") + 1], float(sys.argv[sys.argv.index("--sleep") + 1]))
"""


def write_checkout(root: Path, jobs: list) -> dict[str, float]:  # type: ignore[type-arg]
    """A checkout whose one GPU suite is the matrix; returns the durations store's content."""
    entries = "\n".join(
        f'        Entry(path="tests/e2e/test_g{j.gpus}.py", test_args=("--name", "{j.name}", '
        f'"--sleep", "{j.seconds:.2f}")),' for j in jobs)
    registry = ("from ci.registry import Entry, Suite\n\nSUITES = (\n"
                '    Suite(name="matrix", tier="gpu", purpose="p", profile="e2e", timeout=600, entries=(\n'
                f"{entries}\n    )),\n)\n")
    (root / "ci" / "registry").mkdir(parents=True)
    (root / "ci" / "registry" / "repo_suites.py").write_text(registry)
    (root / "tests" / "e2e").mkdir(parents=True)
    for n in sorted({j.gpus for j in jobs}):
        (root / "tests" / "e2e" / f"test_g{n}.py").write_text(textwrap.dedent(ENTRY.format(n=n)).lstrip())
    return {f"tests/e2e/test_g{j.gpus}.py --name {j.name} --sleep {j.seconds:.2f}": j.seconds for j in jobs}


def run_matrix(root: Path, record: Path, extra: list[str],
               prefix: list[str] | None = None) -> tuple[float, int, str]:
    """Run the suite (the driver behind `prefix`, e.g. on another host: `ip netns exec …`);
    returns the makespan the entries recorded, the exit code and the last lines."""
    record.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLIME_TEST_RECORD": str(record)}
    proc = subprocess.run([*(prefix or []), sys.executable, "-m", "ci", "run", "--suite", "matrix", "--root", str(root),
                           "--emulate-gpus", "--durations", str(root / "durations.json"), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600, check=False)
    runs = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
    makespan = max(r["end"] for r in runs) - min(r["start"] for r in runs) if runs else float("nan")
    tail = "\n".join(proc.stdout.splitlines()[-3:])
    if len(runs) != 31:
        tail += f"\n(only {len(runs)} of 31 entries recorded)\n" + proc.stdout[-2000:] + proc.stderr[-2000:]
    return makespan, proc.returncode, tail


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.3, help="seconds of sleep per real minute")
    parser.add_argument("--keep", action="store_true", help="keep the checkout (logs, timelines)")
    args = parser.parse_args()
    jobs = lock_bench.make_matrix(args.scale)
    work = sum(j.gpus * j.seconds for j in jobs)
    longest = max(j.seconds for j in jobs)
    print(f"matrix: {len(jobs)} entries, GPUs {sorted({j.gpus for j in jobs})}, {work:.0f} GPU-seconds, "
          f"longest {longest:.1f}s; {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    tmp = tempfile.mkdtemp(prefix="cluster-bench-")
    try:
        root = Path(tmp) / "repo"
        durations = write_checkout(root, jobs)
        (root / "durations.json").write_text(json.dumps(durations))
        record = Path(tmp) / "record.jsonl"
        box, box_rc, box_tail = run_matrix(root, record, ["--gpus", "8"])
        box_bound = max(work / 8, longest)
        print(f"one box (8 GPUs):        makespan {box:6.1f}s  bound {box_bound:6.1f}s  "
              f"ratio {box / box_bound:.3f}  (exit {box_rc})\n{textwrap.indent(box_tail, '    ')}")
        cluster = ray_cluster.local_cluster()
        try:
            started = time.monotonic()
            cluster.start(workers=2, gpus=8, cpus=4)
            print(f"cluster up in {time.monotonic() - started:.0f}s at {cluster.address}")
            (root / "durations.json").write_text(json.dumps(durations))
            ray_span, ray_rc, ray_tail = run_matrix(root, record, ["--ray-address", cluster.address])
        finally:
            cluster.stop()
            left = cluster.group_members()
        ray_bound = max(work / 16, longest)
        print(f"Ray cluster (2 x 8 GPUs): makespan {ray_span:6.1f}s  bound {ray_bound:6.1f}s  "
              f"ratio {ray_span / ray_bound:.3f}  (exit {ray_rc})\n{textwrap.indent(ray_tail, '    ')}")
        print(f"cluster processes left after stop: {len(left)}")
    finally:
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"makespan / lower bound: one box {box / box_bound:.3f}, cluster {ray_span / ray_bound:.3f} "
          f"(goal on the cluster <= 1.10); load now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
