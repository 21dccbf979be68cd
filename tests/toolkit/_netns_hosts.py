"""A Ray cluster across separate test hosts, each a Linux network namespace (root only).

Layout, all of it named with one prefix (`sh<pid>x<n>`, both in base 36, so that every
interface name fits the kernel's 15 characters whatever the pid) so parallel runs never collide,
and removed by `stop()` (also on a failed test, and on SIGINT/SIGTERM in the script):

    <p>sw            the "switch": a namespace holding bridge br0; nothing else in it
    <p>h0 .. <p>hN   the hosts: h0 the head (the driver runs there too), h1.. the workers
                     each with eth0 = one end of a veth pair whose other end is on br0,
                     address 10.213.0.<i+1>/24, its own hostname (a UTS namespace) and
                     its own /dev/shm (a per-host directory bind-mounted there, so the
                     GPU lock files of one host are not those of another)

The root namespace's links and routes are never touched. Each host runs one
`ray start --block` (leader of its own process group, started through `ip netns exec`);
`stop()` ends exactly those groups, and only while their leader is still our unreaped child
(so a group id the kernel gave to someone else since is never signalled). `cut(host)` downs the host's link (its switch-side
end), `shape(host)` makes it slow and lossy (tc netem; where the kernel has no netem, a
token bucket plus a random drop, and `shaping` says so), `kill_raylet(host)` kills the
raylet of that host's group, `restart(host)` starts its node again.
The GPUs are logical (`--num-gpus`): this machine has none.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ci.proc import group_members, signal_group, terminate, wait_exit, wait_until

IP = shutil.which("ip") or "/usr/sbin/ip"
TC = shutil.which("tc") or "/usr/sbin/tc"
RAY = str(Path(sys.executable).parent / "ray")
SUBNET = "10.213.0"
GCS_PORT = 6379
# Every port a node listens on, fixed: each host has its own network stack, so the
# same numbers on every host never collide (and a firewall between real hosts opens these).
NODE_PORTS = ["--node-manager-port", "6380", "--object-manager-port", "6381",
              "--dashboard-agent-listen-port", "6382", "--dashboard-agent-grpc-port", "6383",
              "--metrics-export-port", "6384", "--runtime-env-agent-port", "6385",
              "--min-worker-port", "10002", "--max-worker-port", "10049"]
# Fast failure detection, so a cut or dead node is declared dead in seconds, not a minute,
# and a raylet cut off from the head gives up (and ends its workers) in seconds.
RAY_ENV = {
    "RAY_health_check_initial_delay_ms": "1000",
    "RAY_health_check_period_ms": "500",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
    "RAY_raylet_liveness_self_check_interval_ms": "1000",
    "RAY_enable_worker_prestart": "0",  # less start-up work on a loaded machine
}
SHM_DIR = "/dev/shm/slime-ci-hosts"  # the GPU lock files' directory, as each host sees it
_counter = itertools.count()
IFNAMSIZ = 15  # the longest interface name Linux takes; `ip` refuses a longer one
_DIGITS = "0123456789abcdefghijklmnopqrstuvwxyz"


def base36(n: int) -> str:
    """`n` in base 36: a pid (at most 4194304) in 5 characters."""
    out = ""
    while True:
        n, d = divmod(n, 36)
        out = _DIGITS[d] + out
        if n == 0:
            return out


def ifname(name: str) -> str:
    """An interface name, or a RuntimeError: a name too long made `ip` fail, which read as
    "no namespace hosts here" and skipped every host test without a word."""
    if len(name) > IFNAMSIZ:
        raise RuntimeError(f"interface name {name!r} is longer than {IFNAMSIZ} characters")
    return name


def probe_name(pid: int, n: int) -> str:
    """The namespace `unavailable()` tries (its veth ends add one letter)."""
    return f"sp{base36(pid)}x{base36(n)}"


def cluster_prefix(pid: int, n: int) -> str:
    """The names of one cluster: its hosts are `<prefix>h<i>`, their switch ports `<prefix>h<i>s`."""
    return f"sh{base36(pid)}x{base36(n)}"


def unavailable() -> str:
    """Why namespace hosts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not Path(IP).exists() or shutil.which("unshare") is None:
        return "`ip` (iproute2) or `unshare` (util-linux) is not installed"
    probe = probe_name(os.getpid(), next(_counter))
    made = subprocess.run([IP, "netns", "add", probe], capture_output=True, text=True, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()[:200]}"
    try:
        veth = subprocess.run([IP, "link", "add", ifname(f"{probe}a"), "netns", probe, "type", "veth",
                               "peer", "name", ifname(f"{probe}b"), "netns", probe],
                              capture_output=True, text=True, check=False)
        if veth.returncode != 0:
            return f"cannot make a veth pair: {veth.stderr.strip()[:200]}"
    finally:
        subprocess.run([IP, "netns", "del", probe], capture_output=True, check=False)
    return ""


def _sh(*argv: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {proc.stderr.strip()}")


@dataclass
class Host:
    index: int
    ns: str
    address: str
    hostname: str
    shm: Path  # bind-mounted at /dev/shm on this host
    home: Path
    temp: Path
    log: Path
    gpus: int = 0
    cpus: int = 0
    proc: subprocess.Popen[bytes] | None = None
    past_groups: list[int] = field(default_factory=list)  # every group id it had: for checks
    # The leaders of its nodes' groups not ended yet, never reaped before their group ends.
    leaders: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def veth_switch_side(self) -> str:
        return ifname(f"{self.ns}s")

    def locks(self) -> Path:
        """This host's GPU lock directory, as the root namespace sees it."""
        return self.shm / Path(SHM_DIR).name


@dataclass
class NetnsCluster:
    """A head host and worker hosts with logical GPUs, each its own network namespace."""

    prefix: str
    root: Path
    hosts: list[Host] = field(default_factory=list)
    shaping: str = ""
    _made_ns: list[str] = field(default_factory=list)

    @property
    def switch(self) -> str:
        return f"{self.prefix}sw"

    @property
    def head(self) -> Host:
        return self.hosts[0]

    @property
    def workers(self) -> list[Host]:
        return self.hosts[1:]

    @property
    def address(self) -> str:
        return f"{self.head.address}:{GCS_PORT}"

    # --- the network ------------------------------------------------------------------

    def build(self, workers: int) -> None:
        """The switch and 1 + `workers` hosts, linked and addressed (no Ray yet)."""
        _sh(IP, "netns", "add", self.switch)
        self._made_ns.append(self.switch)
        _sh(IP, "-n", self.switch, "link", "add", "br0", "type", "bridge")
        _sh(IP, "-n", self.switch, "link", "set", "br0", "up")
        for i in range(workers + 1):
            ns = f"{self.prefix}h{i}"
            base = self.root / f"h{i}"
            host = Host(index=i, ns=ns, address=f"{SUBNET}.{i + 1}", hostname=f"{self.prefix}-h{i}",
                        shm=base / "shm", home=base / "home", temp=base / "ray", log=base / "ray.log")
            host.shm.mkdir(parents=True)
            host.home.mkdir()
            host.shm.chmod(0o1777)
            host.temp.mkdir()
            _sh(IP, "netns", "add", ns)
            self._made_ns.append(ns)
            # Both ends made straight in their namespaces: nothing appears in the root one.
            _sh(IP, "link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name",
                host.veth_switch_side, "netns", self.switch)
            _sh(IP, "-n", self.switch, "link", "set", host.veth_switch_side, "master", "br0", "up")
            _sh(IP, "-n", ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _sh(IP, "-n", ns, "link", "set", "eth0", "up")
            _sh(IP, "-n", ns, "link", "set", "lo", "up")
            self.hosts.append(host)

    def cut(self, host: Host) -> None:
        """The host's cable pulled: its switch port goes down."""
        _sh(IP, "-n", self.switch, "link", "set", host.veth_switch_side, "down")

    def mend(self, host: Host) -> None:
        _sh(IP, "-n", self.switch, "link", "set", host.veth_switch_side, "up")

    def shape(self, host: Host, delay_ms: int = 200, loss_pct: int = 5) -> str:
        """Slow and lossy both ways; returns how (netem, or where the kernel lacks it, a
        token bucket of 2 Mbit/s and a random drop of `loss_pct` % of packets)."""
        ends = [(host.ns, "eth0"), (self.switch, host.veth_switch_side)]
        netem = all(subprocess.run([IP, "netns", "exec", ns, TC, "qdisc", "replace", "dev", dev, "root",
                                    "netem", "delay", f"{delay_ms}ms", "loss", f"{loss_pct}%"],
                                   capture_output=True, check=False).returncode == 0 for ns, dev in ends)
        if netem:
            self.shaping = f"netem delay {delay_ms}ms loss {loss_pct}%"
            return self.shaping
        for ns, dev in ends:
            subprocess.run([IP, "netns", "exec", ns, TC, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, check=False)
            _sh(IP, "netns", "exec", ns, TC, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "2mbit",
                "burst", "16kbit", "latency", f"{delay_ms}ms")
        for chain in ("INPUT", "OUTPUT"):
            _sh(IP, "netns", "exec", host.ns, "iptables", "-A", chain, "-i" if chain == "INPUT" else "-o",
                "eth0", "-m", "statistic", "--mode", "random", "--probability", f"{loss_pct / 100:.2f}",
                "-j", "DROP")
        self.shaping = (f"no netem in this kernel: token bucket 2mbit (queue up to {delay_ms}ms) "
                        f"and {loss_pct}% random drop (iptables)")
        return self.shaping

    def unshape(self, host: Host) -> None:
        for ns, dev in [(host.ns, "eth0"), (self.switch, host.veth_switch_side)]:
            subprocess.run([IP, "netns", "exec", ns, TC, "qdisc", "del", "dev", dev, "root"],
                           capture_output=True, check=False)
        subprocess.run([IP, "netns", "exec", host.ns, "iptables", "-F"], capture_output=True, check=False)

    # --- Ray --------------------------------------------------------------------------

    def command(self, host: Host) -> list[str]:
        """What runs on `host`: `ray start`, inside its namespace, own hostname and /dev/shm."""
        if host.index == 0:
            role = ["--head", "--port", str(GCS_PORT), "--include-dashboard", "false",
                    "--ray-client-server-port", "10001", "--num-gpus", "0", "--num-cpus", "0"]
        else:
            role = ["--address", self.address, "--num-gpus", str(host.gpus), "--num-cpus", str(host.cpus)]
        ray = [RAY, "start", "--block", "--disable-usage-stats", "--node-ip-address", host.address,
               *NODE_PORTS, "--object-store-memory", str(80 * 1024 * 1024), "--temp-dir", str(host.temp), *role]
        return self.in_host(host, ray)

    def in_host(self, host: Host, argv: list[str]) -> list[str]:
        """`argv` run as on `host`: its network, hostname, /dev/shm and home directory (so
        nothing in this machine's ~/.ray, such as an auth token, reaches the test hosts)."""
        script = 'hostname "$1" && mount --bind "$2" /dev/shm && export HOME="$3" && shift 3 && exec "$@"'
        return [IP, "netns", "exec", host.ns, "unshare", "--uts", "--mount", "--propagation", "private",
                "sh", "-c", script, "sh", host.hostname, str(host.shm), str(host.home), *argv]

    def _spawn(self, host: Host) -> None:
        env = {**os.environ, **RAY_ENV, "TMPDIR": str(host.temp)}
        with host.log.open("ab") as out:
            host.proc = subprocess.Popen(self.command(host), stdout=out, stderr=subprocess.STDOUT, env=env,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        host.past_groups.append(host.proc.pid)
        host.leaders.append(host.proc)

    def start(self, workers: int, gpus: int, cpus: int = 2, timeout: float = 240) -> None:
        self.build(workers)
        for h in self.workers:
            h.gpus, h.cpus = gpus, cpus
        for h in self.hosts:
            self.restart(h, timeout)

    def restart(self, host: Host, timeout: float = 120, tries: int = 3) -> None:
        """Start the host's node (again, after its raylet died or its link came back).

        `ray start` gives a raylet 30 s to register (fixed in Ray), which a loaded machine
        can miss; a node that missed it is started again."""
        for attempt in range(1, tries + 1):
            self.end_host(host)
            seen = host.log.stat().st_size if host.log.exists() else 0
            self._spawn(host)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                # `ray start` prints this once its node has registered with the head.
                if b"Ray runtime started." in host.log.read_bytes()[seen:]:
                    return
                if host.proc is not None and wait_exit(host.proc.pid, 0):  # not reaped: still ours
                    break
                time.sleep(0.5)
            if attempt == tries:
                raise RuntimeError(f"{host.hostname} did not join: {host.log.read_text()[-2000:]}")

    def alive_hosts(self) -> list[str]:
        """Hostnames of the live nodes, as the head sees them (asked from the head's host)."""
        code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False); "
                "print(' '.join(n['NodeManagerHostname'] for n in ray.nodes() if n['Alive']))")
        proc = subprocess.run(self.in_host(self.head, [sys.executable, "-c", code, self.address]),
                              capture_output=True, text=True, timeout=120, check=False,
                              env={**os.environ, **RAY_ENV})
        lines = proc.stdout.strip().splitlines()
        return lines[-1].split() if lines else []

    def wait_alive(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for h in self.hosts:
                if h.proc is not None and wait_exit(h.proc.pid, 0):
                    raise RuntimeError(f"{h.hostname} exited: {h.log.read_text()[-2000:]}")
            if len(self.alive_hosts()) >= count:
                return
            time.sleep(1)
        raise RuntimeError(f"the cluster did not reach {count} nodes in {timeout:.0f}s")

    def raylet_pid(self, host: Host) -> int:
        """The raylet of the host's current node (found in that node's own process group)."""
        assert host.proc is not None
        for pid in self.group_members([host.proc.pid]):
            with contextlib.suppress(OSError):
                if Path(f"/proc/{pid}/comm").read_text().strip() == "raylet":
                    return pid
        raise RuntimeError(f"no raylet in the process group of {host.hostname}")

    def kill_raylet(self, host: Host) -> None:
        os.kill(self.raylet_pid(host), signal.SIGKILL)

    def end_host(self, host: Host, grace: float = 10.0) -> None:
        """End the process groups of this host's nodes (SIGTERM, then SIGKILL)."""
        self._end([host], grace)

    def _end(self, hosts: list[Host], grace: float) -> None:
        # Only groups whose leader we started and have not reaped: its pid, so its group id,
        # cannot have been given to anyone else. A group id kept from an earlier node could
        # name a stranger's group by now, and this runs as root.
        leaders = [p for h in hosts for p in h.leaders if _leads_own_group(p)]
        groups = [p.pid for p in leaders]

        def send(sig: int) -> None:
            for p in leaders:
                if _leads_own_group(p):
                    signal_group(p.pid, sig)

        terminate(send, lambda s: wait_until(lambda: not any(map(group_members, groups)), s), grace)
        for h in hosts:
            for p in h.leaders:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(5)
            h.leaders = [p for p in h.leaders if p.returncode is None]

    def stop(self) -> None:
        """End every node's group (all at once), delete every namespace (their links go with
        them), then the files."""
        with contextlib.suppress(Exception):
            self._end(self.hosts, grace=10.0)
        for ns in reversed(self._made_ns):
            subprocess.run([IP, "netns", "del", ns], capture_output=True, check=False)
        self._made_ns.clear()
        shutil.rmtree(self.root, ignore_errors=True)

    def group_members(self, groups: list[int] | None = None) -> list[int]:
        """Live processes in the given process groups (default: every group this cluster started)."""
        wanted = set(groups if groups is not None else [g for h in self.hosts for g in h.past_groups])
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] != "Z" and int(stat[2]) in wanted:
                found.append(int(entry.name))
        return found

    def processes_in(self, host: Host) -> list[int]:
        """Live processes in the host's network namespace (whoever started them)."""
        try:
            target = os.stat(f"/run/netns/{host.ns}").st_ino
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry.name}/ns/net").st_ino != target:
                    continue
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state != "Z":
                found.append(int(entry.name))
        return found

    def leftovers(self) -> list[str]:
        """Namespaces of this cluster that still exist (should be none after stop)."""
        names = subprocess.run([IP, "netns", "list"], capture_output=True, text=True, check=False).stdout
        return [line.split()[0] for line in names.splitlines() if line.startswith(self.prefix)]


def _leads_own_group(proc: subprocess.Popen[bytes]) -> bool:
    """`proc` is our child, not yet reaped (a zombie still is), and leads its own group."""
    if proc.returncode is not None:
        return False
    try:
        stat = Path(f"/proc/{proc.pid}/stat").read_bytes()
    except OSError:
        return False
    fields = stat[stat.rfind(b")") + 2:].split()
    return len(fields) > 2 and fields[2] == str(proc.pid).encode()


def netns_cluster() -> NetnsCluster:
    """A cluster with a fresh prefix and a short temp root (Ray's socket paths stay under 108 bytes)."""
    prefix = cluster_prefix(os.getpid(), next(_counter))
    return NetnsCluster(prefix=prefix, root=Path(tempfile.mkdtemp(prefix=f"{prefix}-", dir="/tmp")))
