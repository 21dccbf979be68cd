"""A real multi-node Ray cluster on this machine for tests and benchmarks: a head and workers.

Each node is one `ray start --block` process, leader of its own process group, with
its own ports and temp dir, so nothing collides with anyone else's Ray. `stop()`
ends exactly those groups, by pid; `kill_node()` takes one worker down mid-run.
The GPUs are logical (`--num-gpus`): this machine has none.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

RAY = str(Path(sys.executable).parent / "ray")
# Not 127.0.0.1: Ray rewrites exactly that address to the machine's outward one; every other
# loopback address is taken as given, so all nodes and their traffic stay on loopback.
NODE_IP = "127.0.0.2"

# Fast failure detection, so a stopped worker is declared dead in seconds, not a minute.
NODE_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    # No idle workers ahead of need, as U's private head and the namespace hosts run.
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
}


def _free_block(size: int) -> int:
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(30000, 60000 - size)
        ok = True
        for port in (base, base + 1, base + size - 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no free block of ports")


@dataclass
class RayNode:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    temp_dir: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass
class LocalCluster:
    """A head (no GPUs, no CPUs: it only coordinates) and workers with logical GPUs."""

    root: Path
    base: int
    head: RayNode | None = None
    workers: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"{NODE_IP}:{self.base}"

    def _start(self, name: str, args: list[str], offset: int) -> RayNode:
        temp = Path(tempfile.mkdtemp(prefix=f"r{name}-", dir=self.root))
        log = self.root / f"{name}.log"
        b = self.base + offset
        argv = [RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address", NODE_IP,
                "--node-manager-port", str(b + 2), "--object-manager-port", str(b + 3),
                "--dashboard-agent-listen-port", str(b + 4), "--dashboard-agent-grpc-port", str(b + 5),
                "--metrics-export-port", str(b + 6), "--runtime-env-agent-port", str(b + 7),
                "--min-worker-port", str(b + 10), "--max-worker-port", str(b + 39),
                "--object-store-memory", str(80 * 1024 * 1024), "--temp-dir", str(temp), *args]
        # Its own home: a token in this machine's ~/.ray/auth_token would turn on Ray's token
        # authentication at the head, which drivers that do not send one are then refused.
        home = temp / "home"
        home.mkdir()
        env = {**os.environ, **NODE_ENV, "TMPDIR": str(temp), "HOME": str(home)}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        return RayNode(name=name, proc=proc, log=log, temp_dir=temp)

    def start(self, workers: int, gpus: int, cpus: int = 2, timeout: float = 240) -> None:
        """Head, then one worker at a time: `ray start` gives a raylet 30 s to register (fixed in
        Ray), which a loaded machine can miss; a node that missed it is started again."""
        head_args = ["--head", "--port", str(self.base), "--include-dashboard", "false",
                     "--ray-client-server-port", str(self.base + 1), "--num-gpus", "0", "--num-cpus", "0"]
        self.head = self._start_retrying("head", head_args, 0, 1, timeout)
        for i in range(workers):
            args = ["--address", self.address, "--num-gpus", str(gpus), "--num-cpus", str(cpus)]
            self.workers.append(self._start_retrying(f"w{i + 1}", args, 40 * (i + 1), 2 + i, timeout))

    def _start_retrying(self, name: str, args: list[str], offset: int, nodes: int,
                        timeout: float, tries: int = 3) -> RayNode:
        for attempt in range(1, tries + 1):
            node = self._start(name, args, offset)
            try:
                self._wait(nodes, timeout, also=node)
                return node
            except BaseException as exc:  # also Ctrl-C: the node is not in `stop()`'s list yet
                with_suppress_kill(node.pid, signal.SIGKILL)
                node.proc.wait()
                if attempt == tries or not isinstance(exc, RuntimeError):
                    raise
        raise AssertionError("unreachable")

    def alive_nodes(self) -> int:
        proc = subprocess.run(
            [sys.executable, "-c",
             "import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', "
             "log_to_driver=False); print(sum(n['Alive'] for n in ray.nodes()))", self.address],
            capture_output=True, text=True, timeout=120, check=False)
        try:
            return int(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            return 0

    def _wait(self, count: int, timeout: float, also: RayNode | None = None) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for node in {id(n): n for n in [self.head, *self.workers, also] if n is not None}.values():
                if node.proc.poll() is not None:
                    raise RuntimeError(f"{node.name} exited: {node.log.read_text()[-2000:]}")
            if self.alive_nodes() >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {count} nodes in {timeout:.0f}s")

    def kill_node(self, node: RayNode) -> None:
        """The node dies as a machine would: every process of its group, at once."""
        with_suppress_kill(node.pid, signal.SIGKILL)
        node.proc.wait()

    def stop(self, grace: float = 20.0) -> None:
        """Stop every node this cluster started, workers first, by process group."""
        nodes = [n for n in [*self.workers, self.head] if n is not None]
        for node in nodes:
            with_suppress_kill(node.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for node in nodes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                node.proc.wait(max(0.1, deadline - time.monotonic()))
        for node in nodes:
            with_suppress_kill(node.pid, signal.SIGKILL)  # what the graceful stop left behind
            node.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)

    def group_members(self) -> list[int]:
        """Live processes still in any of this cluster's process groups (should be none after stop)."""
        groups = {n.pid for n in [self.head, *self.workers] if n is not None}
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] != "Z" and int(stat[2]) in groups:
                found.append(int(entry.name))
        return found


def with_suppress_kill(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def local_cluster() -> LocalCluster:
    """A cluster rooted in a short temp dir: Ray's socket paths must stay under 108 bytes."""
    return LocalCluster(root=Path(tempfile.mkdtemp(prefix="rc-", dir="/tmp")), base=_free_block(40 * 4))
