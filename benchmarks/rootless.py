"""A test container's start-up on a rootless Podman slot against the host's root dockerd, side by side.

The slot is what runners/setup_slots.py makes on a GPU host (its own user, subordinate ids,
rootless Podman serving the Docker API), made here under a temporary root and removed at the
end. Each round starts one container with `docker run --rm --network none IMAGE true` on each
engine, alternating which goes first: the root engine through its socket
(`bash .ci/docker-engine.sh` starts it), the slot's engine through the slot's socket as the
slot's uid, the way a job does. The same docker CLI and the same image (the root filesystem
tarball the engine script builds) on both sides; the figure is the wall time of the CLI call,
container creation to removal.

    sudo python benchmarks/rootless.py [--rounds 15]

Needs root, podman, newuidmap, setpriv and a running root engine; exit 3 and one line when
something is missing. Prints every round, the medians, their ratio and the load average.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETUP = ROOT / "runners" / "setup_slots.py"
sys.path.insert(0, str(SETUP.parent))
import setup_slots  # noqa: E402  (runners/ is no package: the script is its own module)

ROOTFS = Path(os.environ.get("SLIME_CI_DOCKER_ROOT", "/var/lib/slime-ci-docker")) / "rootfs-bookworm.tar"
HOST_IMAGE = os.environ.get("SLIME_CI_LOCAL_IMAGE", "slime-ci-local:bookworm")
SLOT_IMAGE = "localhost/slime-ci-local:bookworm"
HOST_SOCKET = Path("/var/run/docker.sock")
RUN = ("run", "--rm", "--network", "none")


def missing() -> str | None:
    if os.geteuid() != 0:
        return "run it as root: it creates a slot user and its engine (sudo python benchmarks/rootless.py)"
    for tool in ("docker", "podman", "newuidmap", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not ROOTFS.is_file():
        return f"no image tarball {ROOTFS}: run `bash .ci/docker-engine.sh` first"
    probe = subprocess.run(["docker", "-H", f"unix://{HOST_SOCKET}", "image", "inspect", HOST_IMAGE],
                           capture_output=True, timeout=60, check=False)
    if probe.returncode != 0:
        return f"the root engine on {HOST_SOCKET} has no {HOST_IMAGE}: run `bash .ci/docker-engine.sh`"
    return None


def timed(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0 or done.stderr.strip():
        # Podman's Docker API can report 0 for a failed start: its stderr says so.
        raise RuntimeError(f"{' '.join(argv[-6:])} failed ({done.returncode}): {done.stderr.strip()[:300]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="containers per engine (default 15)")
    args = parser.parse_args()
    if not 1 <= args.rounds <= 1000:
        print(f"error: --rounds {args.rounds}: give 1 to 1000", file=sys.stderr)
        return 2
    problem = missing()
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return 3
    token = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="slime-ci-bench-", dir="/tmp"))
    os.chmod(root, 0o755)
    uid = next(u for u in range(64001, 65000) if setup_slots.uid_free(u))
    slot_args = ["--slots", "1", "--root", str(root), "--prefix", f"bench{token}-", "--uid-base", str(uid - 1),
                 "--subid-base", str(setup_slots.subids_end(1_600_000_000)), "--gpus", "0"]
    try:
        up = subprocess.run([sys.executable, str(SETUP), "up", *slot_args, "--image-tar", str(ROOTFS)],
                            capture_output=True, text=True, timeout=600, check=False)
        if up.returncode != 0:
            print(f"error: the slot did not come up: {(up.stderr.strip() or up.stdout.strip())[-300:]}",
                  file=sys.stderr)
            return 4
        work = root / "work" / "1"
        base = {"PATH": os.environ["PATH"], "HOME": str(work)}
        sides = {
            "root dockerd": (["docker", *RUN, HOST_IMAGE, "true"],
                             {**base, "DOCKER_HOST": f"unix://{HOST_SOCKET}"}),
            "rootless slot": (["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--",
                               "docker", *RUN, SLOT_IMAGE, "true"],
                              {**base, "DOCKER_HOST": f"unix:///run/user/{uid}/podman/podman.sock"}),
        }
        for argv, env in sides.values():  # one start each first: image layers and caches warm
            timed(argv, env)
        times: dict[str, list[float]] = {name: [] for name in sides}
        names = list(sides)
        for i in range(args.rounds):
            order = names if i % 2 == 0 else names[::-1]
            for name in order:
                times[name].append(timed(*sides[name]))
            print(f"round {i + 1:>3}: " + "  ".join(f"{n} {times[n][-1] * 1000:6.0f} ms" for n in names)
                  + f"  (load {os.getloadavg()[0]:.1f})", flush=True)
        med = {n: statistics.median(t) for n, t in times.items()}
        print()
        print(f"{'engine':<14} {'median':>9} {'min':>9} {'max':>9}")
        for n in names:
            print(f"{n:<14} {med[n] * 1000:7.0f}ms {min(times[n]) * 1000:7.0f}ms {max(times[n]) * 1000:7.0f}ms")
        ratio = med["rootless slot"] / med["root dockerd"]
        print(f"rootless slot / root dockerd, medians of {args.rounds} rounds: {ratio:.2f}x  "
              f"({os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())})")
        return 0
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 4
    finally:
        subprocess.run([sys.executable, str(SETUP), "down", "--remove", *slot_args],
                       capture_output=True, timeout=300, check=False)
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
