"""Run a GPU suite on a Ray cluster (`--ray-address ADDR` or SLIME_CI_RAY_ADDRESS).

Each entry becomes one Ray streaming task that needs the entry's NUM_GPUS on one
node: a task's resources never span nodes, so `num_gpus=N` says it (a one-bundle
STRICT_PACK placement group would say the same and cost a placement and a removal
per entry: makespan / lower bound 1.30 with one, 1.04 without, benchmarks/cluster.py).
Ray sets CUDA_VISIBLE_DEVICES. The task
(`ci.backends.ray_task`) runs the same argv as a local run in the node's checkout — the
driver's checkout path, which must exist on every node (a shared filesystem, or
the same path cloned on each) — and streams its output back. Ray is the
scheduler here; this module only turns Ray's answers into the runner's results.

A node that dies mid-entry ends the task with a Ray error; the entry is then
reported `lost` (naming the node) and the runner retries it once, elsewhere.

Two watches cover a cluster that falls apart under the run. On the driver, `_Watchdog`
asks the head every second whether a live node can still hold the largest entry in
flight; when the head does not answer, or no such node exists, for
SLIME_CI_RAY_UNREACHABLE_S seconds (default 120), the run stops its entries, records
what it has and ends with one line and exit 5 (`ClusterUnreachable`). On each node,
the task checks that the head still answers (`ci.backends.ray_task`); cut off from it
for as long, it stops its entry and frees the node's GPU locks, since no one can
collect the result any more and a retry may already be running elsewhere.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import IO, Any

from ci.backends.base import AttemptEvents, AttemptPaths, Backend, EntryEnv, Launch, Lease, RunContext
from ci.backends.ray_task import Ended, NodeJob, Output, Started, run_on_node
from ci.errors import UsageError
from ci.gpu.allocator import DEFAULT_PATTERN
from ci.results import Attempt, gpu_row
from ci.select.entries import ResolvedEntry

ADDRESS_ENV = "SLIME_CI_RAY_ADDRESS"
# Emulated GPUs on a cluster: per node ({node}: its Ray id), never the real GPUs' files.
EMULATED_NODE_LOCKS = "/tmp/slime-ci-emulated-locks-{node}/gpu_{gpu_id}.lock"
GRACE = 5.0  # seconds between SIGTERM and SIGKILL of an entry's process group on its node
# How long a task error may take to show up as a dead node in the GCS (its health checks).
NODE_DEATH_WAIT = 60.0
POLL = 1.0  # seconds between looks at a running task's node while it is silent
STOP_WAIT = 15.0  # seconds a stopping run waits for a cancelled task's answer
UNREACHABLE_ENV = "SLIME_CI_RAY_UNREACHABLE_S"
UNREACHABLE_AFTER = 120.0  # seconds without a head that answers, or a node that can hold the entries


@dataclass(frozen=True, kw_only=True)
class Node:
    """A cluster node as the run names it."""

    node_id: str
    name: str
    gpus: int
    alive: bool


def node_names(nodes: list[Mapping[str, Any]]) -> dict[str, str]:
    """Node id -> name: the hostname, with the id's head when several nodes share a hostname."""
    hosts: dict[str, int] = {}
    for n in nodes:
        host = str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node")
        hosts[host] = hosts.get(host, 0) + 1
    out = {}
    for n in nodes:
        host = str(n.get("NodeManagerHostname") or n.get("NodeManagerAddress") or "node")
        node_id = str(n["NodeID"])
        out[node_id] = host if hosts[host] == 1 else f"{host}-{node_id[:6]}"
    return out


def reachable(address: str, timeout: float = 5.0) -> None:
    """Fail in seconds when nothing listens at host:port (Ray itself retries for minutes)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "://" in host:
        return  # "auto", ray://…: Ray resolves those itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise UsageError(f"cannot join the Ray cluster at {address}: nothing answers there "
                         f"({exc.strerror or exc}); start one with `ray start --head`, "
                         f"or drop --ray-address / {ADDRESS_ENV}") from None


class RayBackend(Backend):
    """Entries as Ray tasks on a cluster: each attempt a task, placed and run by Ray."""

    name = "ray"

    def __init__(self, *, address: str, root: str, env: Mapping[str, str], jobs: int,
                 emulate_gpus: bool, lock_path_pattern: str | None, lock_timeout: float,
                 largest_entry: int) -> None:
        super().__init__(gpus=0)  # known once connected: the cluster's, node by node
        self.address = address
        self.root = root
        self.env = dict(env)
        self.jobs = jobs
        self._emulated = emulate_gpus
        # Each node's own lock files; logical GPUs of several nodes on one box must not share them.
        self.node_lock_pattern = lock_path_pattern or (EMULATED_NODE_LOCKS if emulate_gpus
                                                       else DEFAULT_PATTERN)
        self.lock_timeout = lock_timeout
        self.largest_entry = largest_entry
        self.node_gpus = 0
        self.run_token = uuid.uuid4().hex[:10]
        self._lock = threading.Lock()
        self._inflight: dict[str, Any] = {}  # attempt name -> streaming generator
        self._names: dict[str, str] = {}
        self._task: Any = None
        self._connected = False
        self.unreachable_after = unreachable_after(self.env)
        self._needs: dict[str, int] = {}  # attempt name -> GPUs it needs on one node
        self._lost = ""
        self._dead: set[str] = set()  # node ids the head has declared dead (as last asked)
        self._watchdog: _Watchdog | None = None

    def check(self) -> None:
        """Join the cluster as a driver, and refuse entries no node can hold (one line, exit 2)."""
        self.connect()
        nodes = [n for n in self.nodes() if n.alive]
        largest = max((n.gpus for n in nodes), default=0)
        if self.largest_entry > largest:
            raise UsageError(f"an entry needs {self.largest_entry} GPUs on one node; the largest node "
                             f"of the cluster at {self.address} has {largest}")
        self.gpus = sum(n.gpus for n in nodes)
        self.node_gpus = largest

    def launch(self, entry: ResolvedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        """What the node runs (for --dry-run): the local argv, with the entry's own variables."""
        return Launch(argv=argv, env=dict(env.own))

    def describe(self) -> str:
        return f"Ray cluster at {self.address}, each entry a task on one node"

    @property
    def emulated(self) -> bool:
        return self._emulated

    @property
    def gpus_known(self) -> bool:
        return False  # the cluster's, once `check` has joined it

    @property
    def local_processes(self) -> bool:
        return False  # entries run on the nodes, importing the nodes' checkouts

    def gpu_rows(self, host: str) -> list[str]:
        return [gpu_row(n.name, i) for n in self.nodes() for i in range(n.gpus)]

    def connect(self) -> None:
        """Join the cluster as a driver; a one-line UsageError when it cannot be reached."""
        import ray

        reachable(self.address)
        try:
            ray.init(address=self.address, log_to_driver=False, logging_level=logging.ERROR,
                     configure_logging=False,
                     # The workers import ci.backends.ray_task from the checkout the entries run in.
                     runtime_env={"env_vars": {"PYTHONPATH": self.root}})
        except Exception as exc:  # Ray raises ConnectionError, RuntimeError, ValueError…
            raise UsageError(f"cannot join the Ray cluster at {self.address}: "
                             f"{str(exc).splitlines()[0][:200]}; start one with `ray start --head`, "
                             f"or drop --ray-address / {ADDRESS_ENV}") from None
        self._connected = True
        # A generator function: Ray streams each message it yields to this driver.
        self._task = ray.remote(run_on_node)

    def open_run(self, run: RunContext) -> None:
        super().open_run(run)
        self._watchdog = _Watchdog(self, self.unreachable_after)
        self._watchdog.start()

    def close_run(self) -> None:
        if self._watchdog is not None:
            self._watchdog.stop()
            self._watchdog = None

    @property
    def lost(self) -> str:
        return self._lost

    def give_up(self, why: str) -> None:
        """The cluster is gone: stop the run as Ctrl-C would, and say why at its end."""
        with self._lock:
            if self._lost:
                return
            self._lost = why
        self.run_context.note(f"cluster unreachable: {why}; stopping the run")
        self.run_context.groups.stopping.set()
        self.interrupt()

    def declared_dead(self, node_id: str) -> bool:
        """Whether the head declared this node dead (as the watchdog last asked it, each second)."""
        with self._lock:
            return node_id in self._dead

    def largest_in_flight(self) -> int:
        with self._lock:
            return max(self._needs.values(), default=-1)

    def close(self) -> None:
        import ray

        if self._connected:
            ray.shutdown()
            self._connected = False

    def nodes(self) -> list[Node]:
        """Every node the cluster knows, alive or not, named as the run names them."""
        import ray

        raw = ray.nodes()  # type: ignore[no-untyped-call,unused-ignore]
        names = node_names(raw)
        with self._lock:
            self._names.update(names)
            self._dead.update(str(n["NodeID"]) for n in raw if not n.get("Alive"))
        return [Node(node_id=str(n["NodeID"]), name=names[str(n["NodeID"])],
                     gpus=int(n.get("Resources", {}).get("GPU", 0)), alive=bool(n.get("Alive")))
                for n in raw]

    def _name(self, node_id: str) -> str:
        with self._lock:
            known = self._names.get(node_id)
        if known is None:
            self.nodes()
            with self._lock:
                known = self._names.get(node_id, node_id[:8])
        return known

    def _alive(self, node_id: str) -> bool:
        return any(n.node_id == node_id and n.alive for n in self.nodes())

    def interrupt(self) -> None:
        """Ctrl-C: cancel every entry in flight (its task stops the entry's process group)."""
        import ray

        with self._lock:
            running = list(self._inflight.values())
        for gen in running:
            try:
                ray.cancel(gen)
            except Exception:  # already finished or its node is gone; nothing to cancel
                continue

    def run_attempt(self, entry: ResolvedEntry, lease: Lease | None, paths: AttemptPaths,
                    events: AttemptEvents) -> Attempt:
        """Run one attempt of an entry on the cluster (Ray takes its GPUs there); blocks until it ends."""
        import ray

        stopping = self.run_context.groups.stopping
        events.queued()
        job = NodeJob(entry=entry, root=self.root, env=self.env, jobs=self.jobs, pytest_args=(),
                      emulate_gpus=self._emulated, lock_pattern=self.node_lock_pattern,
                      lock_timeout=self.lock_timeout, node_gpus=self.node_gpus, grace=GRACE,
                      run_token=self.run_token, attempt_name=paths.name,
                      head=self.address, head_timeout=self.unreachable_after)
        queued_at = time.time()
        # A task's resources always come from one node, so `num_gpus` alone already means
        # "NUM_GPUS on one node" (what a one-bundle STRICT_PACK placement group would say),
        # without the group's two-phase placement and its removal between two entries.
        options: dict[str, Any] = ({"num_gpus": entry.num_gpus, "num_cpus": 0} if entry.num_gpus
                                   else {"num_cpus": 1})
        gen = self._task.options(**options, num_returns="streaming", max_retries=0,
                                 name=f"slime-ci:{entry.id}"[:200]).remote(job)
        with self._lock:
            self._inflight[paths.name] = gen
            self._needs[paths.name] = entry.num_gpus
        if stopping.is_set():  # stopped while this one was being submitted: interrupt() missed it
            ray.cancel(gen)
        watch = _Watch(backend=self, events=events, paths=paths, queued_at=queued_at)
        try:
            with paths.log.open("wb") as log:
                attempt = watch.follow(gen, log, stopping)
        finally:
            with self._lock:
                self._inflight.pop(paths.name, None)
                self._needs.pop(paths.name, None)
        return replace(attempt, interrupted=attempt.interrupted or stopping.is_set(), ended_at=time.time())

    def _lost_node(self, node_id: str) -> str:
        """The lost node's description when the error came from a node that died, else ''."""
        if not node_id:
            return "lost before it started (its node died or the task could not be placed)"
        deadline = time.monotonic() + NODE_DEATH_WAIT
        while time.monotonic() < deadline:
            if not self._alive(node_id):
                return f"node {self._name(node_id)} lost mid-entry"
            time.sleep(0.5)
        return ""


def unreachable_after(env: Mapping[str, str]) -> float:
    raw = env.get(UNREACHABLE_ENV, "")
    try:
        value = float(raw) if raw else UNREACHABLE_AFTER
    except ValueError:
        raise UsageError(f"{UNREACHABLE_ENV}={raw!r} is not a number of seconds; "
                         f"e.g. {UNREACHABLE_ENV}=120") from None
    if value <= 0:
        raise UsageError(f"{UNREACHABLE_ENV}={raw!r} must be more than 0 seconds")
    return value


class _Watchdog(threading.Thread):
    """Ends the run when the cluster cannot finish it: no answer from the head, or no live
    node with the GPUs of the largest entry in flight, for `after` seconds in a row."""

    def __init__(self, backend: RayBackend, after: float, period: float = 1.0) -> None:
        super().__init__(daemon=True, name="ray-watchdog")
        self.backend, self.after, self.period = backend, after, period
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(10)

    def trouble(self) -> str:
        """What is wrong with the cluster right now ('' when it can run what is in flight)."""
        need = self.backend.largest_in_flight()
        if need < 0:
            return ""
        host, _, port = self.backend.address.rpartition(":")
        if port.isdigit():
            try:
                socket.create_connection((host, int(port)), timeout=2.0).close()
            except OSError as exc:
                return f"the head at {self.backend.address} does not answer ({exc.strerror or exc})"
        try:
            alive = [n for n in self.backend.nodes() if n.alive]
        except Exception as exc:  # the GCS call failed: as good as no answer
            return f"the head at {self.backend.address} does not answer ({type(exc).__name__})"
        if not any(n.gpus >= need for n in alive):
            live = ", ".join(f"{n.name} ({n.gpus} GPUs)" for n in alive) or "none"
            return f"no live node has the {need} GPUs an entry needs (live: {live})"
        return ""

    def run(self) -> None:
        since: float | None = None
        while not self._halt.wait(self.period):
            why = self.trouble()
            if not why:
                since = None
                continue
            since = time.monotonic() if since is None else since
            if time.monotonic() - since >= self.after:
                self.backend.give_up(f"{why} for {self.after:.0f}s")
                return


class _Watch:
    """The driver's side of one task: the node's messages, turned into a live log and an Attempt."""

    def __init__(self, *, backend: RayBackend, events: AttemptEvents, paths: AttemptPaths,
                 queued_at: float) -> None:
        self.backend, self.events, self.paths = backend, events, paths
        self.node_id = ""
        self.attempt = Attempt(returncode=None, seconds=0.0, timed_out=False, interrupted=False,
                               node="", queued_at=queued_at, ended_at=queued_at)

    def follow(self, gen: Any, log: IO[bytes], stopping: threading.Event) -> Attempt:
        """Take the task's messages as they come. Between them, every POLL seconds: a node the
        head has declared dead ends the attempt as lost (a cut link never fails the stream
        itself), and a run that has been stopping for STOP_WAIT seconds stops waiting for a
        cancellation that cannot reach the node."""
        import ray

        stop_seen: float | None = None
        try:
            while True:
                ready, _ = ray.wait([gen], timeout=POLL)
                if ready:
                    try:
                        ref = next(gen)
                    except StopIteration:
                        break
                    self._take(ray.get(ref), log)
                    continue
                if stopping.is_set():
                    stop_seen = time.monotonic() if stop_seen is None else stop_seen
                    if time.monotonic() - stop_seen > STOP_WAIT:
                        self.attempt = replace(self.attempt, interrupted=True)
                        break
                elif self.node_id and self.backend.declared_dead(self.node_id):
                    with contextlib.suppress(Exception):
                        ray.cancel(gen)
                    self._failed(RuntimeError("the head declared its node dead; the task no longer "
                                              "answers"), log)
                    break
        except ray.exceptions.TaskCancelledError:
            self.attempt = replace(self.attempt, interrupted=True)
        except ray.exceptions.RayError as exc:
            if stopping.is_set():
                self.attempt = replace(self.attempt, interrupted=True)
            else:
                self._failed(exc, log)
        return self.attempt

    def _take(self, msg: object, log: IO[bytes]) -> None:
        if isinstance(msg, Output):
            log.write(msg.text.encode())
            log.flush()
            self.events.output(msg.text)
        elif isinstance(msg, Started):
            self.node_id = msg.node_id
            self.attempt = replace(self.attempt, node=self.backend._name(msg.node_id),
                                   devices=tuple(msg.devices), started_at=time.time())
            self.events.started()
        elif isinstance(msg, Ended):
            if msg.junit_text:
                self.paths.junit.write_text(msg.junit_text, encoding="utf-8")
            self.attempt = replace(self.attempt, returncode=msg.returncode, timed_out=msg.timed_out,
                                   seconds=msg.seconds)

    def _failed(self, exc: Exception, log: IO[bytes]) -> None:
        lost = self.backend._lost_node(self.node_id)
        why = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}"
        log.write(f"\n[slime-ci] {lost or 'the Ray task failed'}: {why}\n".encode())
        since = self.attempt.started_at or self.attempt.queued_at or 0.0
        self.attempt = replace(self.attempt, lost=lost, error="" if lost else why,
                               seconds=time.time() - since)
