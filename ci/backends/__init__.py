"""Execution backends: where and how the entries of one run execute. One is chosen per run.

The runner knows what an entry is (its local argv, its variables, its GPUs, its
process group); a backend decides how that becomes a running process:

    check()                      preconditions, once, before the first entry starts;
                                 raises UsageError (one line, exit 2, nothing run)
    launch(entry, argv, env, devices) -> Launch
                                 the command and environment that run the entry on the
                                 GPUs it holds (`devices`, host ids)
    abort(launch)                clean-up beyond killing the process group, after a
                                 timeout or an interrupt (e.g. `docker kill` the container)
    lock_pattern                 the GPU lock files its entries queue on (`{gpu_id}`)
    describe()                   where entries run, as `--dry-run` prints it
    close()                      release what the backend made for the run

Modules: the interface in base.py (`Backend`, `EntryEnv`, `Launch`), then one per backend:

    local.py      this environment (CPU suites, `--no-docker`)
    docker.py     the framework image, with the GPU flags (GPU suites by default)
    emulated.py   logical GPUs under private locks, ranks on the CPU (`--emulate-gpus`)
    ray.py        a Ray cluster (`--ray-address`): each entry a task on one node, its GPUs
                  placed by Ray; the node side is ray_task.py. Entries run elsewhere, so it
                  runs each attempt itself (`remote`) and takes the node's locks there

`select_backend` below is the only place that turns a suite and the command line into
a backend. A new backend (a Ray cluster, say) is one more module with a `Backend`
subclass plus one branch there; the runner and the session stay as they are. A
backend that takes GPUs some other way than host lock files returns `None` from
`lock_pattern` and reserves them in `launch`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ci.backends.base import Backend, EntryEnv, Launch, Note
from ci.suites import Suite

__all__ = ["Backend", "EntryEnv", "Launch", "Note", "select_backend"]


def select_backend(suite: Suite, *, gpus: int, emulate_gpus: bool, no_docker: bool,
                   lock_path_pattern: str | None, image: str | None, pull: str | None,
                   root: str, note: Note, ray_address: str | None = None,
                   env: Mapping[str, str] | None = None, jobs: int = 1,
                   lock_timeout: float = 86400.0, largest_entry: int = 0) -> Backend:
    """The one backend of a run: a Ray cluster, emulated GPUs, Docker (GPU suites), or here."""
    if ray_address:
        from ci.backends.ray import RayBackend

        return RayBackend(address=ray_address, root=root, env=env or {}, jobs=jobs,
                          emulate_gpus=emulate_gpus, lock_path_pattern=lock_path_pattern,
                          lock_timeout=lock_timeout, largest_entry=largest_entry)
    if emulate_gpus:
        from ci.backends.emulated import EmulatedBackend

        return EmulatedBackend(gpus=gpus, lock_path_pattern=lock_path_pattern)
    if suite.tier == "gpu" and not no_docker:
        from ci.backends.docker import DockerBackend

        return DockerBackend(gpus=gpus, image=image or suite.image, pull=pull, root=root,
                             lock_path_pattern=lock_path_pattern, note=note)
    from ci.backends.local import LocalBackend

    return LocalBackend(gpus=gpus, lock_path_pattern=lock_path_pattern)
