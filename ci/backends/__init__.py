"""Execution backends: where and how the entries of one run execute. One is chosen per run.

The runner schedules entries, holds their GPU leases and core slots, and retries them;
a backend runs each attempt and says how it ended:

    check()                      preconditions, once, before the first entry starts;
                                 raises UsageError (one line, exit 2, nothing run)
    launch(entry, argv, env, devices) -> Launch
                                 the command and environment that run the entry on the
                                 GPUs it holds (`devices`, host ids)
    plan(entry, settings, devices, paths) -> LaunchSpec
                                 the one assembly of a launch (`ci.backends.launch`): local argv,
                                 variables, `launch`, pre-forked or fresh; the run starts it
                                 and `--dry-run` prints it
    open_run(run) / close_run()  the run begins (its settings, grace, process groups) / ends
    run_attempt(entry, lease, paths, events) -> Attempt
                                 one attempt, start to end, on the GPUs of `lease`
    interrupt()                  Ctrl-C: end what stopping the run's process groups does not
    abort(launch)                clean-up beyond killing the process group, after a
                                 timeout or an interrupt (e.g. `docker kill` the container)
    lock_pattern                 the GPU lock files its entries queue on (`{gpu_id}`)
    describe()                   where entries run, as `--dry-run` prints it
    close()                      release what the backend made for the run

Modules: the interface in base.py (`Backend`, `Attempt`, `AttemptPaths`, `RunContext`),
the local-process executor in process.py (every backend whose entries are processes of
this host: fresh, or forked from a pre-imported worker), then one per backend:

    local.py      this environment (CPU suites, `--no-docker`)
    docker.py     the framework image, with the GPU flags (GPU suites by default)
    emulated.py   logical GPUs under private locks, ranks on the CPU (`--emulate-gpus`)
    ray.py        a Ray cluster (`--ray-address`): each entry a task on one node, its GPUs
                  placed by Ray; the node side is ray_task.py, which runs the local
                  backend's plan there and takes the node's locks

`select_backend` below is the only place that turns a suite and the command line into
a backend. A new backend is one more module with a `Backend` subclass (a
`LocalProcessBackend` when its entries are processes here) plus one branch there; the
runner and the session stay as they are. A backend that takes GPUs some other way than
host lock files returns `None` from `lock_pattern` and reserves them in `run_attempt`.
Nothing here imports the runner, the session or the report layer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ci.backends.base import Attempt, AttemptPaths, Backend, EntryEnv, Launch, Note
from ci.registry.model import Suite

__all__ = ["Attempt", "AttemptPaths", "Backend", "BackendOptions", "EntryEnv", "Launch", "Note",
           "select_backend"]


@dataclass(frozen=True, kw_only=True)
class BackendOptions:
    """What the command line says about where a run's entries execute."""

    gpus: int
    emulate_gpus: bool = False
    no_docker: bool = False
    lock_path_pattern: str | None = None
    image: str | None = None
    pull: str | None = None
    root: str = "."
    note: Note = print
    ray_address: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)  # the run's environment (a cluster's entries get it)
    jobs: int = 1
    lock_timeout: float = 86400.0
    largest_entry: int = 0  # GPUs of the run's largest entry (a cluster checks its nodes against it)


def select_backend(suite: Suite, opts: BackendOptions) -> Backend:
    """The one backend of a run: a Ray cluster, emulated GPUs, Docker (GPU suites), or here."""
    if opts.ray_address:
        from ci.backends.ray import RayBackend

        return RayBackend(address=opts.ray_address, root=opts.root, env=opts.env, jobs=opts.jobs,
                          emulate_gpus=opts.emulate_gpus, lock_path_pattern=opts.lock_path_pattern,
                          lock_timeout=opts.lock_timeout, largest_entry=opts.largest_entry)
    if opts.emulate_gpus:
        from ci.backends.emulated import EmulatedBackend

        return EmulatedBackend(gpus=opts.gpus, lock_path_pattern=opts.lock_path_pattern)
    if suite.tier == "gpu" and not opts.no_docker:
        from ci.backends.docker import DockerBackend

        return DockerBackend(gpus=opts.gpus, image=opts.image or suite.image, pull=opts.pull,
                             root=opts.root, lock_path_pattern=opts.lock_path_pattern, note=opts.note)
    from ci.backends.local import LocalBackend

    return LocalBackend(gpus=opts.gpus, lock_path_pattern=opts.lock_path_pattern)
