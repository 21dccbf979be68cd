"""A private Ray head for one e2e entry: own ports, own temp dir, own processes, stopped by pid.

The original helpers started Ray on its default ports and never stopped it, and cleaned up
with `pkill -9` by name; two entries on one machine collided and each killed the other's
processes. Here every head gets a block of ports (from `SLIME_CI_PORT_BASE` or found free),
a temp dir of its own, and an owner token in its environment: stopping it kills exactly the
processes that carry the token or descend from it, and nothing else (never `ray stop`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

# Stdlib-only copies of the toolkit's port and process-group code, generated beside this
# file (ci/registry/u_files.py): U runs where the toolkit is not installed.
from .port_utils import PORT_BLOCK
from .proc_utils import Guard, process_guard, signal_group, stop_group
from .proc_utils import start as start_group

PORT_BLOCK_SIZE = PORT_BLOCK  # the runner reserves blocks of this size (SLIME_CI_PORT_BASE)
OWNER_VAR = "SLIME_CI_RAY_OWNER"
# Unix socket paths are limited to 107 bytes, and Ray puts its sockets at
# <temp>/ray-XXXXXXXX/session_<date>_<time>_<usec>_<pid>/sockets/plasma_store: 77 bytes
# below the parent directory, which therefore gets at most 30.
_MAX_TEMP_DIR_LEN = 30
# Ray turns a node address of exactly 127.0.0.1 (or "localhost") into the machine's outward
# address, so that other nodes could reach it; a private head must keep all of its traffic
# on loopback. Any other address of 127.0.0.0/8 is loopback too and is taken as given.
NODE_IP = "127.0.0.2"
BUSY_PORT_WAIT = 30.0  # seconds a busy port block gets to free itself before the head gives up
_STARTED = "Ray runtime started."


@dataclass(frozen=True, kw_only=True)
class RayPorts:
    """Where one head listens; all inside one reserved block of ports."""

    base: int
    gcs: int
    dashboard: int
    client_server: int
    node_manager: int
    object_manager: int
    dashboard_agent_listen: int
    dashboard_agent_grpc: int
    metrics_export: int
    runtime_env_agent: int
    master: int  # torch.distributed rendezvous of the training job
    min_worker: int
    max_worker: int

    @classmethod
    def from_base(cls, base: int, size: int = PORT_BLOCK_SIZE) -> RayPorts:
        """Lay the named ports at the start of the block and give workers its second half."""
        if size < 20:
            raise ValueError(f"a port block needs at least 20 ports, got {size}")
        if not 1024 <= base <= 65535 - size + 1:
            raise ValueError(f"port block {base}..{base + size - 1} is outside 1024..65535")
        return cls(
            base=base,
            gcs=base,
            dashboard=base + 1,
            client_server=base + 2,
            node_manager=base + 3,
            object_manager=base + 4,
            dashboard_agent_listen=base + 5,
            dashboard_agent_grpc=base + 6,
            metrics_export=base + 7,
            runtime_env_agent=base + 8,
            master=base + 9,
            min_worker=base + size // 2,
            max_worker=base + size - 1,
        )


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As servers bind: a port held only by closed connections (TIME_WAIT) is free.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port_block(size: int = PORT_BLOCK_SIZE, *, host: str = "127.0.0.1",
                    attempts: int = 200, rng: random.Random | None = None) -> int:
    """First port of `size` consecutive ports that are all free now (below the ephemeral range)."""
    rng = rng or random.Random()
    # 20000..31999 stays clear of Linux's ephemeral range (32768+), where outgoing
    # connections would otherwise take ports out from under the block.
    for _ in range(attempts):
        base = rng.randrange(20000, 32000 - size)
        if all(_bindable(p, host) for p in range(base, base + size)):
            return base
    raise RuntimeError(f"no block of {size} free ports found on {host}; set SLIME_CI_PORT_BASE")


def ports_from_env(env: Mapping[str, str]) -> RayPorts:
    """The ports the runner reserved (`SLIME_CI_PORT_BASE`), else a free block found now."""
    raw = env.get("SLIME_CI_PORT_BASE", "").strip()
    if not raw:
        return RayPorts.from_base(free_port_block())
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(f"SLIME_CI_PORT_BASE={raw!r} is not a port number") from None
    return RayPorts.from_base(base)


def ray_start_argv(ray: str, *, ports: RayPorts, temp_dir: str, num_gpus: int,
                   node_ip: str = NODE_IP, num_cpus: int | None = None) -> tuple[str, ...]:
    """The `ray start --head --block` command line of a private head (pure)."""
    argv = [
        ray, "start", "--head", "--block",
        "--node-ip-address", node_ip,
        "--port", str(ports.gcs),
        "--dashboard-host", "127.0.0.1",
        "--dashboard-port", str(ports.dashboard),
        "--include-dashboard", "true",
        "--ray-client-server-port", str(ports.client_server),
        "--node-manager-port", str(ports.node_manager),
        "--object-manager-port", str(ports.object_manager),
        "--dashboard-agent-listen-port", str(ports.dashboard_agent_listen),
        "--dashboard-agent-grpc-port", str(ports.dashboard_agent_grpc),
        "--metrics-export-port", str(ports.metrics_export),
        "--runtime-env-agent-port", str(ports.runtime_env_agent),
        "--min-worker-port", str(ports.min_worker),
        "--max-worker-port", str(ports.max_worker),
        "--num-gpus", str(num_gpus),
        "--temp-dir", temp_dir,
        "--disable-usage-stats",
    ]
    if num_cpus is not None:
        argv += ["--num-cpus", str(num_cpus)]
    return tuple(argv)


def ray_executable() -> str:
    """The `ray` CLI of the interpreter running this code (a venv's bin is often not on PATH)."""
    beside = Path(sys.executable).parent / "ray"
    return str(beside) if beside.exists() else "ray"


def _short_temp_dir(env: Mapping[str, str]) -> Path:
    parent = env.get("TMPDIR") or tempfile.gettempdir()
    if len(parent) > _MAX_TEMP_DIR_LEN:
        parent = "/tmp"
    return Path(tempfile.mkdtemp(prefix="ray-", dir=parent))


@dataclass(frozen=True, kw_only=True)
class RayHead:
    """A running head: where to reach it and what identifies its processes."""

    address: str  # dashboard / job submission address, http://host:port
    gcs_address: str
    ports: RayPorts
    temp_dir: Path
    log_path: Path
    pid: int  # the `ray start --block` process, leader of its own process group
    token: str  # value of SLIME_CI_RAY_OWNER in every process of this head


def _owned_pids(leader: int, token: str) -> set[int]:
    import psutil

    pids: set[int] = set()
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(leader)
        pids.add(leader)
        pids.update(c.pid for c in root.children(recursive=True))
    needle = f"{OWNER_VAR}={token}".encode()
    for proc in psutil.process_iter():
        # The token is read from /proc/<pid>/environ directly: psutil's environ() parses
        # every variable of every process, which is slow on a busy machine.
        try:
            data = Path(f"/proc/{proc.pid}/environ").read_bytes()
        except OSError:
            continue
        if needle in data.split(b"\0"):
            pids.add(proc.pid)
    pids.discard(os.getpid())
    return pids


def _alive(pids: set[int]) -> set[int]:
    import psutil

    alive = set()
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
    return alive


# Seconds a process of the head may outlive `ray start --block` before it is killed.
ORPHAN_GRACE = 2.0


def _raise_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def stop_head(head: RayHead, proc: subprocess.Popen[bytes], *, grace: float = 15.0) -> frozenset[int]:
    """Stop exactly this head's processes; returns every pid it stopped."""
    seen = _owned_pids(head.pid, head.token)

    def finished(seconds: float) -> bool:
        nonlocal seen
        deadline = time.monotonic() + seconds
        orphans_since = None
        while time.monotonic() < deadline:
            seen |= _owned_pids(head.pid, head.token)
            left = _alive(seen)
            if not left:
                return True
            if proc.poll() is not None and orphans_since is None:
                # `ray start` is done with its own shutdown, but a worker whose raylet is gone
                # can sit for the whole grace before it notices. Every pid here carries this
                # head's token, so it is ours to stop: SIGTERM now, SIGKILL below if it lingers.
                orphans_since = time.monotonic()
                deadline = min(deadline, orphans_since + ORPHAN_GRACE)
                for pid in left:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGTERM)
            time.sleep(0.3)
        return False

    # `ray start --block` stops the processes it started on SIGTERM; the drain timeout
    # set at start makes that take seconds rather than 30 s.
    stop_group(head.pid, grace, finished=finished)
    for _ in range(3):
        seen |= _owned_pids(head.pid, head.token)
        left = _alive(seen)
        if not left:
            break
        signal_group(head.pid, signal.SIGKILL)
        for pid in left:  # a head's process outside its group (Ray starts some in their own)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.3)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)
    return frozenset(seen)


def _wait_ready(head: RayHead, proc: subprocess.Popen[bytes], timeout: float) -> None:
    url = f"{head.address}/api/version"
    deadline = time.monotonic() + timeout
    # Loopback only: a proxy from the environment must not answer for our head.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    while True:
        if proc.poll() is not None:
            kind = HeadStartTimeout if STARTUP_TIMEOUT_LINE in _tail(head.log_path) else RuntimeError
            raise kind(
                f"ray head exited with code {proc.returncode} while starting; "
                f"last lines of {head.log_path}:\n{_tail(head.log_path)}"
            )
        session = ""
        try:
            with opener.open(url, timeout=5) as response:
                session = json.loads(response.read().decode()).get("session_name", "")
        except (urllib.error.URLError, OSError, ValueError):
            pass
        if session and not (head.temp_dir / session).is_dir():
            raise RuntimeError(
                f"another Ray cluster (session {session}) answers on {url}; "
                f"ports {head.ports.base}..{head.ports.max_worker} are not this entry's alone"
            )
        # Only our own dashboard counts (its session lives in our temp dir), and only once
        # `ray start` says the node is up: the dashboard answers before the raylet starts,
        # and `ray start` may still fail then and take the dashboard down with it.
        if session and _STARTED in head.log_path.read_text(errors="replace"):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"ray head did not answer on {url} within {timeout:.0f} s; "
                f"last lines of {head.log_path}:\n{_tail(head.log_path)}"
            )
        time.sleep(0.2)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass(frozen=True, kw_only=True)
class HeadRecord:
    """What a head left behind once stopped: the pids it ran (to check they are gone)."""

    pids: frozenset[int]
    temp_dir: Path


def _busy_ports(ports: RayPorts, *, wait: float) -> list[int]:
    """Ports of the block still in use after up to `wait` seconds.

    The block is this entry's alone, but the previous holder's head (an entry that just
    ended on the same GPUs) can take a few seconds to close its last sockets.
    """
    deadline = time.monotonic() + wait
    while True:
        busy = [p for p in range(ports.base, ports.max_worker + 1) if not _bindable(p, "127.0.0.1")]
        if not busy or time.monotonic() >= deadline:
            return busy
        time.sleep(0.5)


# `ray start` gives its raylet a fixed 30 s to register with the GCS (ray/_private/node.py, not
# configurable); on a loaded host (a 2-core runner at load 25+) the dashboard agent the raylet
# waits for can take longer, and `ray start` exits with this line although nothing is wrong
# with the entry. Only that failure is retried: any other exit is the entry's problem.
STARTUP_TIMEOUT_LINE = "timed out during startup"
START_ATTEMPTS = 3


class HeadStartTimeout(RuntimeError):
    """`ray start` gave up waiting for its own raylet (a loaded host; worth another attempt)."""


# The raylet gives the dashboard agent it spawns a fixed 15 s to write its port files (Ray 2.60:
# not RAY_agent_register_timeout_ms, nor any other setting) and aborts when it misses them, and
# `ray start` then reports "timed out during startup". The agent needs about 2.7 CPU-seconds of
# imports; a head starts some 15 Python processes at once, so five heads starting together on
# 2 cores left it under a fifth of a core and every attempt of all five missed the 15 s. The
# private heads of one host therefore start one at a time: each holds this lock (flock, let go
# by the kernel if its holder dies) from `ray start` until its node is up.
START_LOCK_VAR = "SLIME_CI_RAY_START_LOCK"
DEFAULT_START_LOCK = "/tmp/slime-ci-ray-head-start.lock"


# The turn serializes the heads' start-ups, but a head that starts while other work runs
# still shares the CPU with it: in the ckpt suite on 2 cores (4 entries at once) the last
# head's agent wrote its first log line 17 s after its spawn, all of it imports, and missed the
# 15 s in all three attempts. Start-up has that fixed deadline; the steady work of a head that
# is up has none. So a head's start-up runs PRIORITY_STEP nice levels ahead of its steady work.
# `ray start` is a session of its own, and where the kernel groups sessions for the scheduler
# (sched_autogroup_enabled, as on most distributions) CPU is shared between sessions first and
# a process's own nice value only counts inside its session; so the level is set on both, the
# session's (/proc/<pid>/autogroup) and every thread's (Linux keeps one per thread, and a
# process forked later, every worker and job the head starts, inherits its forking thread's).
# Where the account may (root, or CAP_SYS_NICE) the start-up is raised PRIORITY_STEP above the
# entry and goes back to the entry's level once its node is up; where it may not, start-up
# runs at the entry's level and the head, once up, steps down PRIORITY_STEP levels.
PRIORITY_STEP = 10


def _set_session_nice(pid: int, nice: int) -> None:
    with contextlib.suppress(OSError):  # no autogroups (a kernel without them), or not permitted
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")


def _raise_start_up(pid: int) -> int:
    """Raise a just-started `ray start` (no children yet) PRIORITY_STEP above this process,
    where permitted; returns the nice value its steady work should run at."""
    base = os.getpriority(os.PRIO_PROCESS, 0)
    try:
        os.setpriority(os.PRIO_PROCESS, pid, max(-20, base - PRIORITY_STEP))
    except OSError:  # not permitted (the usual account), or the process is gone already
        return min(19, base + PRIORITY_STEP)
    _set_session_nice(pid, max(-20, base - PRIORITY_STEP))
    return base


def yield_to_start_ups(pids: set[int], nice: int) -> int:
    """Put every thread of `pids`, and their sessions, at nice value `nice`; returns the
    threads changed."""
    changed = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:  # gone already, or not Linux: nothing to change
            continue
        _set_session_nice(pid, nice)
        for tid in tids:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                if os.getpriority(os.PRIO_PROCESS, tid) != nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                    changed += 1
    return changed


def start_lock_path(env: Mapping[str, str]) -> Path:
    """The host's start lock: `SLIME_CI_RAY_START_LOCK`, else one fixed path in /tmp (not TMPDIR:
    every entry gets its own)."""
    return Path(env.get(START_LOCK_VAR) or DEFAULT_START_LOCK)


@contextlib.contextmanager
def start_turn(path: Path, *, timeout: float, poll: float = 0.2) -> Iterator[float]:
    """Hold the host's start lock; yields the seconds spent waiting for it."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another account's lock file: a shared lock needs no write access
        fd = os.open(path, os.O_RDONLY)
    start = time.monotonic()
    try:
        announced = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = time.monotonic() - start
                if waited > timeout:
                    raise TimeoutError(f"another Ray head on this host has been starting for over "
                                       f"{timeout:.0f} s (it holds {path}); is a `ray start` "
                                       "hanging? Stop it, or point SLIME_CI_RAY_START_LOCK "
                                       "elsewhere") from None
                if not announced:
                    print(f"waiting for another Ray head on this host to finish starting ({path})",
                          flush=True)
                    announced = True
                time.sleep(poll)
        with contextlib.suppress(OSError):  # the holder's pid, for whoever looks
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        try:
            yield time.monotonic() - start
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _start(argv: tuple[str, ...], *, env: Mapping[str, str], ports: RayPorts, temp_dir: Path,
           token: str, log_path: Path) -> tuple[RayHead, subprocess.Popen[bytes], Guard]:
    guard = process_guard()
    with log_path.open("wb") as log:
        # Guarded: if the entry dies without stopping its head (SIGKILL), the head goes too.
        proc: subprocess.Popen[bytes] = start_group(argv, env=dict(env), stdout=log,
                                                    stderr=subprocess.STDOUT,
                                                    stdin=subprocess.DEVNULL, guard=guard)
    head = RayHead(
        address=f"http://127.0.0.1:{ports.dashboard}",
        gcs_address=f"{NODE_IP}:{ports.gcs}",
        ports=ports, temp_dir=temp_dir, log_path=log_path, pid=proc.pid, token=token,
    )
    return head, proc, guard


# Ray's own start-up limits of the dashboard (ray/dashboard/consts.py, ray_constants.py): a
# private head raises them to its start-up budget unless the caller's environment sets them.
DASHBOARD_LIMITS = ("RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT", "RAY_DASHBOARD_STARTUP_TIMEOUT_S")


@contextlib.contextmanager
def private_head(*, num_gpus: int, env: Mapping[str, str], ports: RayPorts | None = None,
                 start_timeout: float = 300.0, keep_temp: bool = False,
                 record: list[HeadRecord] | None = None,
                 busy_wait: float = BUSY_PORT_WAIT, start_attempts: int = START_ATTEMPTS,
                 ray_cli: str | None = None) -> Iterator[RayHead]:
    """Start a head on loopback as a process group we own; always stop it on exit.

    The heads of one host start one at a time (`start_turn`). A head whose `ray start` timed
    out waiting for its own raylet is stopped and started again, up to `start_attempts` times
    in all, within `start_timeout` seconds of start-up overall (the waits for the host's turn,
    each bounded by `start_timeout` too, are not counted).
    """
    ports = ports or ports_from_env(env)
    busy = _busy_ports(ports, wait=busy_wait)
    if busy:
        # Starting anyway would let Ray fail late, or reach another entry's cluster.
        raise RuntimeError(
            f"ports {', '.join(map(str, busy[:8]))} of block {ports.base}..{ports.max_worker} are "
            f"in use; another Ray head holds them (a second runner not sharing this machine's "
            f"GPU locks?). Stop it, or unset SLIME_CI_PORT_BASE to pick a free block."
        )
    temp_dir = _short_temp_dir(env)
    token = uuid.uuid4().hex
    head_env = dict(env)
    if num_gpus and env.get("CUDA_VISIBLE_DEVICES") == "":
        # Emulated GPUs: the ranks see none (the job's env keeps CUDA_VISIBLE_DEVICES=""),
        # but Ray refuses --num-gpus N when that variable lists fewer than N devices.
        del head_env["CUDA_VISIBLE_DEVICES"]
    head_env = {
        **head_env,
        # Ray's own processes put unix sockets (multiprocessing's forkserver among them)
        # under TMPDIR; the entry's TMPDIR can be too deep for the 107-byte limit.
        "TMPDIR": str(temp_dir),
        OWNER_VAR: token,
        "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "RAY_USAGE_STATS_ENABLED": "0",
        # No idle workers started ahead of need (Ray starts one per CPU, and again for the
        # first driver): a private head's workers are its job's, started when asked for. On a
        # 2-core machine that is about 3 CPU-seconds per head; on a 128-core GPU host, 128
        # Python processes nobody uses.
        "RAY_enable_worker_prestart": "0",
        "RAY_prestart_worker_first_driver": "0",
        # A private head on loopback: no token, whatever ~/.ray/auth_token holds (Ray writes
        # one the first time any `ray.init()` starts a local cluster on this account, and a
        # head that finds it then refuses drivers that bring none).
        "RAY_AUTH_MODE": "disabled",
        # Ray gives each dashboard module 30 s to report ready and the dashboard 60 s to come
        # up; on a loaded host, and slower still with coverage in every process
        # (`--record-executed`), a head missed them and failed ("Module NodeHead failed to
        # start") well inside its own start-up budget (`start_timeout`), which is the bound.
        **{name: str(int(start_timeout)) for name in DASHBOARD_LIMITS if name not in env},
    }
    argv = ray_start_argv(ray_cli or ray_executable(), ports=ports, temp_dir=str(temp_dir),
                          num_gpus=num_gpus)
    print(f"+ {' '.join(argv)}", flush=True)
    budget = start_timeout  # seconds of start-up, not counting the waits for the host's turn
    lock = start_lock_path(env)
    started = False
    # A runner ends a timed-out entry with SIGTERM, then SIGKILL seconds later. Python's default
    # SIGTERM ends the process without `finally`, leaving the head to the guard's SIGKILL and its
    # workers to notice on their own, holding the block's ports meanwhile; raising instead
    # stops every process of the head, by its token, within the runner's grace.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    pids: set[int] = set()
    try:
        for attempt in range(1, max(1, start_attempts) + 1):
            log_path = temp_dir / ("head.log" if attempt == 1 else f"head.{attempt}.log")
            proc = None
            try:
                with start_turn(lock, timeout=start_timeout):
                    began = time.monotonic()
                    head, proc, guard = _start(argv, env=head_env, ports=ports, temp_dir=temp_dir,
                                               token=token, log_path=log_path)
                    steady = _raise_start_up(proc.pid)
                    try:
                        _wait_ready(head, proc, max(1.0, budget))
                    finally:
                        budget -= time.monotonic() - began
                    # Still holding the turn: the next head starts only once this one yields.
                    yield_to_start_ups(_owned_pids(head.pid, head.token), steady)
            except HeadStartTimeout as exc:
                pids |= _stop(head, proc, guard)
                if attempt >= start_attempts:
                    raise RuntimeError(f"ray head timed out during its own start-up {attempt} time(s), "
                                       f"the last: {exc}") from None
                print(f"ray head timed out during its own start-up (a loaded host?); starting it "
                      f"again, attempt {attempt + 1} of {start_attempts}", flush=True)
                # Its processes are gone, but their sockets can linger a moment.
                _busy_ports(ports, wait=busy_wait)
                continue
            except BaseException:
                if proc is not None:  # else no head was started: the wait for its turn ended
                    pids |= _stop(head, proc, guard)
                raise
            started = True
            try:
                yield head
            finally:
                pids |= _stop(head, proc, guard)
            break
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if record is not None:
            record.append(HeadRecord(pids=frozenset(pids), temp_dir=temp_dir))
        # A job's own logs travel with its result; the head's logs matter when it did not start.
        if not started or keep_temp:
            print(f"ray head logs kept in {temp_dir}", flush=True)
        else:
            shutil.rmtree(temp_dir, ignore_errors=True)


def _stop(head: RayHead, proc: subprocess.Popen[bytes], guard: Guard) -> frozenset[int]:
    pids = stop_head(head, proc)
    guard.unregister(proc.pid)
    return pids
