"""The megatron-shaped matrix across three hosts (network namespaces) vs on loopback nodes, side by side.

    sudo python benchmarks/cluster_hosts.py [--scale 0.3] [--keep]

Three runs of one matrix through the real CLI (`python -m ci run --emulate-gpus
--ray-address …`), each on a head and three workers of 8 logical GPUs:

  loopback:   every node on 127.0.0.2 in this machine's network (tests/toolkit/_ray_cluster.py)
  hosts:      each node its own network namespace, address, hostname and /dev/shm, joined
              by a bridge (tests/toolkit/_netns_hosts.py); the driver on the head's host
  slow link:  the same hosts, each worker's link slowed to 200 ms and 5 % loss (tc netem;
              where the kernel has no netem, a token bucket and a random drop, said so)

The matrix: the 31 entries of benchmarks/cluster.py (synthetic durations, --scale seconds
per real minute). Makespan = last end - first start as the entries recorded it; lower
bound = max(GPU-seconds / 24, longest entry). Needs root and iproute2; everything it
makes (namespaces, links, Ray processes, temp dirs) is removed at the end, also on
Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests" / "toolkit"))
import cluster as loopback_bench  # noqa: E402  (benchmarks/cluster.py)
from _netns_hosts import SHM_DIR, netns_cluster, unavailable  # noqa: E402

WORKERS, GPUS = 3, 8


def _stop_on_signal(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")  # unwinds through every finally below


def run_on(cluster_address: str, root: Path, record: Path, durations: dict[str, float],
           prefix: list[str]) -> tuple[float, int, str]:
    (root / "durations.json").write_text(json.dumps(durations))
    extra = ["--ray-address", cluster_address]
    if prefix:
        extra += ["--lock-path-pattern", f"{SHM_DIR}/gpu_{{gpu_id}}.lock"]
    return loopback_bench.run_matrix(root, record, extra, prefix=prefix)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", type=float, default=0.3, help="seconds of sleep per real minute")
    parser.add_argument("--keep", action="store_true", help="keep the checkout (logs, timelines)")
    parser.add_argument("--no-slow", action="store_true", help="skip the slow-link run")
    args = parser.parse_args()
    why = unavailable()
    if why:
        print(f"error: cannot make namespace hosts: {why}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _stop_on_signal)
    jobs = loopback_bench.lock_bench.make_matrix(args.scale)
    work = sum(j.gpus * j.seconds for j in jobs)
    longest = max(j.seconds for j in jobs)
    bound = max(work / (WORKERS * GPUS), longest)
    print(f"matrix: {len(jobs)} entries, {work:.0f} GPU-seconds, longest {longest:.1f}s, lower bound "
          f"{bound:.1f}s on {WORKERS} x {GPUS} GPUs; {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    tmp = tempfile.mkdtemp(prefix="hosts-bench-")
    rows: list[tuple[str, float, int]] = []
    try:
        root = Path(tmp) / "repo"
        durations = loopback_bench.write_checkout(root, jobs)
        record = Path(tmp) / "record.jsonl"

        loop = loopback_bench.ray_cluster.local_cluster()
        try:
            loop.start(workers=WORKERS, gpus=GPUS, cpus=4)
            span, rc, tail = run_on(loop.address, root, record, durations, [])
        finally:
            loop.stop()
        rows.append(("loopback nodes", span, rc))
        print(f"loopback nodes:  makespan {span:6.1f}s  ratio {span / bound:.3f}  (exit {rc})\n"
              f"{textwrap.indent(tail, '    ')}")

        hosts = netns_cluster()
        try:
            hosts.start(workers=WORKERS, gpus=GPUS, cpus=4)
            prefix = hosts.in_host(hosts.head, [])
            span, rc, tail = run_on(hosts.address, root, record, durations, prefix)
            rows.append(("namespace hosts", span, rc))
            print(f"namespace hosts: makespan {span:6.1f}s  ratio {span / bound:.3f}  (exit {rc})\n"
                  f"{textwrap.indent(tail, '    ')}")
            if not args.no_slow:
                how = [hosts.shape(h) for h in hosts.workers][-1]
                span, rc, tail = run_on(hosts.address, root, record, durations, prefix)
                rows.append((f"slow link ({how})", span, rc))
                print(f"slow link:       makespan {span:6.1f}s  ratio {span / bound:.3f}  (exit {rc})\n"
                      f"{textwrap.indent(tail, '    ')}")
        finally:
            hosts.stop()
            left = hosts.group_members() + [0 for _ in hosts.leftovers()]
            print(f"left after stop: {len(left)} processes or namespaces")
    except KeyboardInterrupt:
        print("interrupted: everything made was removed", file=sys.stderr)
        return 130
    finally:
        if args.keep:
            print(f"kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print("\nmakespan / lower bound, side by side:")
    for name, span, rc in rows:
        print(f"  {name:<24} {span / bound:.3f}  ({span:.1f}s, exit {rc})")
    print(f"load now {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
