"""The execution-backend interface (see `ci.backends` for the contract and the modules)."""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Protocol

from ci.plan import PlannedEntry
from ci.results import RemoteAttempt


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


class Remote(Protocol):
    """Runs attempts elsewhere (a cluster): placement, GPUs and the process live on a node."""

    def run(self, entry: PlannedEntry, *, name: str, log_path: Path, junit: Path,
            stopping: threading.Event, on_start: Callable[[], None],
            on_output: Callable[[str], None]) -> RemoteAttempt: ...

    def cancel_all(self) -> None: ...


class Backend(abc.ABC):
    """How the entries of a run execute; see the module docstring for the contract."""

    name: ClassVar[str]

    def __init__(self, *, gpus: int = 0) -> None:
        self.gpus = gpus  # GPUs this run may use

    def check(self) -> None:  # noqa: B027 - optional hook: most backends need nothing
        """Raise UsageError when this backend cannot run here (before any entry starts)."""

    @abc.abstractmethod
    def launch(self, entry: PlannedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        """The process that runs `entry` on `devices`, from its local argv and variables."""

    def abort(self, launch: Launch) -> None:  # noqa: B027 - optional hook
        """Stop what killing the entry's process group does not reach."""

    @property
    def lock_pattern(self) -> str | None:
        """GPU lock files of this backend's entries; None: entries take no host GPU lock."""
        return None

    @abc.abstractmethod
    def describe(self) -> str:
        """Where entries run, for `--dry-run` and the run's first line."""

    @property
    def emulated(self) -> bool:
        """GPUs are logical: counts are checked, but nothing runs on a device."""
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend made for this run."""

    def gpu_rows(self, host: str) -> list[str]:
        """The run's GPUs as the timeline names them, `node:gpu`; here, this host's."""
        return [f"{host}:{i}" for i in range(self.gpus)]

    @property
    def remote(self) -> Remote | None:
        """A backend that runs entries on other machines runs each attempt itself; None: here."""
        return None


Note = Callable[[str], None]
