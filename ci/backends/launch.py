"""The launch of one entry: its local argv, its variables, and how a backend wraps them.

Below the backends and the runner: the dry run (`ci.run.command`), a local attempt
(`ci.backends.process`) and a cluster node (`ci.backends.ray_task`) all assemble an
entry's launch through `Backend.plan`, which calls these in one order, so the three
cannot drift apart:

    base_argv(entry, settings, junit)        pytest for pytest files, the script itself for e2e
    entry_env(entry, settings, ...)          the project's settings, the entry's own env, and
                                             the isolation variables U's helpers read
    backend.launch(entry, argv, env, devices) -> Launch
                                             the backend's command (e.g. `docker run …`)
    prefork.choose(...)                      forked from a pre-imported worker, or fresh
"""

from __future__ import annotations

import getpass
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from ci.backends import checkout
from ci.backends.prefork import FRESH_ONLY, Choice, Policy
from ci.gpu.ports import PORT_FLOOR, port_base
from ci.select.entries import ResolvedEntry

# Variables of the runner's environment that are the project's own settings (feature
# flags, cache locations): they travel with every entry, into a container too.
PROJECT_PREFIXES = ("SLIME_CI_", "SLIME_TEST_")
# The original CI's feature flags, which every entry sees unless the runner's environment
# or the entry's registry env says otherwise (the run puts them under its environment).
TEST_FLAGS: Mapping[str, str] = {
    "SLIME_TEST_USE_DEEPEP": "0",
    "SLIME_TEST_USE_FP8_ROLLOUT": "0",
    "SLIME_TEST_ENABLE_EVAL": "1",
    "SLIME_TEST_ENABLE_INFINITE_RUN": "0",
}


class Settings(Protocol):
    """What assembling a launch reads of the run (a `RunConfig`, or `LaunchSettings` on a node)."""

    @property
    def root(self) -> Path: ...

    @property
    def python(self) -> str: ...

    @property
    def base_env(self) -> Mapping[str, str]: ...

    @property
    def pytest_args(self) -> tuple[str, ...]: ...

    @property
    def jobs(self) -> int: ...

    @property
    def port_floor(self) -> int: ...

    @property
    def prefork(self) -> Policy: ...


@dataclass(frozen=True, kw_only=True)
class LaunchSettings:
    """`Settings` where there is no run of this process (a cluster node)."""

    root: Path
    python: str
    base_env: Mapping[str, str]
    jobs: int
    pytest_args: tuple[str, ...] = ()
    port_floor: int = PORT_FLOOR
    prefork: Policy = FRESH_ONLY


@dataclass(frozen=True, kw_only=True)
class EntryEnv:
    """The variables of one entry, kept apart from what the runner merely inherited.

    `own` travels with the entry wherever it runs, a container included: the project's
    settings and feature flags, the registry entry's env, the isolation variables the
    runner chose (output dir, GPUs, port block). `host` matters only to a process on
    this host (its temp dir there, unbuffered output). `inherited` is the runner's
    environment, which only a local process receives, less `unset`.
    """

    inherited: Mapping[str, str]
    own: Mapping[str, str]
    host: Mapping[str, str] = field(default_factory=dict)
    unset: frozenset[str] = frozenset()
    threads: int = 1  # OMP threads per entry, so parallel entries do not oversubscribe the cores

    def local(self) -> dict[str, str]:
        """The full environment of a process started on this host."""
        env = {k: v for k, v in self.inherited.items() if k not in self.unset}
        env.update(self.own)
        env.update(self.host)
        env.setdefault("OMP_NUM_THREADS", str(self.threads))
        return env


@dataclass(frozen=True, kw_only=True)
class Launch:
    """How one entry starts: the argv and environment of its process, and an abort handle."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    handle: str | None = None  # what `abort` needs, e.g. a container name


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """One entry's launch as the run executes it and `--dry-run` prints it."""

    launch: Launch
    mode: Choice  # forked from a pre-imported worker, or a fresh interpreter (and why)

    @property
    def forked(self) -> bool:
        return self.mode.mode == "prefork"


@dataclass(frozen=True, kw_only=True)
class AttemptPaths:
    """Where one attempt of an entry writes: its log, JUnit file, output and temp dirs."""

    name: str  # names the attempt: `NNN-entry-id` plus `.N` for a retry
    log: Path
    junit: Path
    out_dir: Path
    tmp_dir: Path


def base_argv(entry: ResolvedEntry, settings: Settings, junit: Path) -> list[str]:
    """The local command of an entry: pytest for pytest files, the script itself for e2e."""
    if entry.kind == "script":
        return [settings.python, entry.path, *entry.test_args]
    return [
        settings.python, "-m", "pytest", entry.path, "-q", "-rfE", "-p", "no:cacheprovider",
        f"--junitxml={junit}", "-o", "junit_family=xunit2",
        *entry.test_args, *settings.pytest_args,
    ]


def compile_cache_dir(base_env: Mapping[str, str]) -> str:
    """Where torch.compile keeps its kernels: torch's own default, from the runner's TMPDIR.

    Torch derives it from TMPDIR, and each entry gets a private TMPDIR: without this every
    entry would compile from nothing (slime's compiled loss files: 2.4x slower cold).
    """
    base = base_env.get("TMPDIR") or tempfile.gettempdir()
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (some containers)
        user = str(os.getuid())
    return str(Path(base) / f"torchinductor_{re.sub(r'[^A-Za-z0-9_.-]', '_', user)}")


def entry_env(entry: ResolvedEntry, settings: Settings, *, devices: tuple[int, ...],
              out_dir: Path, tmp_dir: Path) -> EntryEnv:
    """The variables of one entry: the project's settings, its own env, and the isolation
    variables the U helpers read; the backend decides how they reach the process."""
    base_env = settings.base_env
    own = {k: v for k, v in base_env.items() if k.startswith(PROJECT_PREFIXES)}
    own.update(dict(entry.env))
    own.update({
        "SLIME_CI_ENTRY": entry.id,
        "SLIME_CI_OUTPUT_DIR": str(out_dir),
        "NUM_GPUS": str(entry.num_gpus),
        "SLIME_CI_GPUS": ",".join(map(str, devices)),
        # The framework comes from this checkout, wherever the entry runs (ci/backends/checkout.py);
        # in a container the workspace is mounted at the same path.
        "PYTHONPATH": str(settings.root),
    })
    unset = set()
    if devices:
        # GPUs are exclusive on the host, so a port block keyed by the lowest GPU id
        # is too: concurrent entries, even from other runners, never share Ray ports.
        own["SLIME_CI_PORT_BASE"] = str(port_base(devices, settings.port_floor))
    else:
        own.pop("SLIME_CI_PORT_BASE", None)
        unset.add("SLIME_CI_PORT_BASE")
    return EntryEnv(inherited=base_env, own=own, unset=frozenset(unset),
                    host={"PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_dir),
                          "PYTHONPATH": checkout.pythonpath(settings.root, base_env.get("PYTHONPATH")),
                          # torch derives its compile cache from TMPDIR: keep one per run, not per entry
                          "TORCHINDUCTOR_CACHE_DIR": base_env.get(
                              "TORCHINDUCTOR_CACHE_DIR", compile_cache_dir(base_env))},
                    threads=threads(settings))


def threads(settings: Settings) -> int:
    """OMP threads per entry: parallel files each spawning a full pool oversubscribe the cores."""
    cores = os.cpu_count() or 1
    return max(1, cores // max(1, settings.jobs))


def worker_env(settings: Settings) -> dict[str, str]:
    """The environment a pre-imported worker starts with: what entries share before their own."""
    env = {**settings.base_env, "PYTHONUNBUFFERED": "1",
           "PYTHONPATH": checkout.pythonpath(settings.root, settings.base_env.get("PYTHONPATH"))}
    env.setdefault("OMP_NUM_THREADS", str(threads(settings)))
    return env
