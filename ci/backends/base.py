"""The execution-backend interface (see `ci.backends` for the contract and the modules)."""

from __future__ import annotations

import abc
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

from ci.backends.launch import (
    AttemptPaths,
    EntryEnv,
    Launch,
    LaunchSpec,
    Settings,
    base_argv,
    entry_env,
    worker_env,
)
from ci.backends.prefork import choose
from ci.proc import Groups
from ci.results import Attempt
from ci.select.entries import ResolvedEntry

__all__ = ["Attempt", "AttemptEvents", "AttemptPaths", "Backend", "EntryEnv", "Launch", "LaunchSpec",
           "Lease", "Note", "RunContext"]

Note = Callable[[str], None]


class Lease(Protocol):
    """GPUs held for one entry, and the locked file descriptors that hold them."""

    @property
    def devices(self) -> tuple[int, ...]: ...

    @property
    def fds(self) -> tuple[int, ...]: ...

    def note_child(self, pid: int) -> None: ...


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """What every attempt of one run shares, handed to the backend when the run opens."""

    settings: Settings
    grace: float  # seconds between SIGTERM and SIGKILL of an entry's process group
    groups: Groups  # the run's process groups; `groups.stopping` is set once the run stops
    logs: Path  # the run's log directory (pre-imported workers write theirs there)
    note: Note  # one line for the run's log


@dataclass(frozen=True, kw_only=True)
class AttemptEvents:
    """What a backend tells the runner while an attempt runs (heartbeat and live output)."""

    queued: Callable[[], None]  # waiting to be placed (a cluster); the runner's own GPU wait is its own
    started: Callable[[], None]  # the entry's process started
    output: Callable[[str], None]  # output to show live (from elsewhere); local output goes to the log


class Backend(abc.ABC):
    """How the entries of a run execute; see the package docstring for the contract."""

    name: ClassVar[str]
    # Entries may fork from pre-imported workers: they are plain processes of this host.
    forks_entries: ClassVar[bool] = False

    def __init__(self, *, gpus: int = 0) -> None:
        self.gpus = gpus  # GPUs this run may use
        self._run: RunContext | None = None

    def check(self) -> None:  # noqa: B027 - optional hook: most backends need nothing
        """Raise UsageError when this backend cannot run here (before any entry starts)."""

    @abc.abstractmethod
    def launch(self, entry: ResolvedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        """The process that runs `entry` on `devices`, from its local argv and variables."""

    def launch_spec(self, entry: ResolvedEntry, settings: Settings, *, devices: tuple[int, ...],
             paths: AttemptPaths) -> LaunchSpec:
        """The one assembly of an entry's launch: what the run starts and `--dry-run` prints."""
        argv = tuple(base_argv(entry, settings, paths.junit))
        env = entry_env(entry, settings, devices=devices, out_dir=paths.out_dir, tmp_dir=paths.tmp_dir)
        launch = self.launch(entry, argv, env, devices)
        mode = choose(policy=settings.prefork, kind=entry.kind, num_gpus=entry.num_gpus,
                      opted_in=entry.prefork, backend=self.name, may_fork=self.forks_entries,
                      argv=launch.argv, python=settings.python, env=launch.env,
                      worker_env=worker_env(settings))
        return LaunchSpec(launch=launch, mode=mode)

    def open_run(self, run: RunContext) -> None:
        """The run begins: keep what its attempts share."""
        self._run = run

    @property
    def run_context(self) -> RunContext:
        if self._run is None:
            raise RuntimeError(f"{type(self).__name__}.run_attempt before open_run")
        return self._run

    @abc.abstractmethod
    def run_attempt(self, entry: ResolvedEntry, lease: Lease | None, paths: AttemptPaths,
                    events: AttemptEvents) -> Attempt:
        """Run one attempt of `entry` on the GPUs of `lease` (None: none held here); blocks
        until it ends, was stopped (the run's `groups.stopping`) or timed out."""

    def interrupt(self) -> None:  # noqa: B027 - optional hook
        """The run is stopping: end attempts that stopping the run's process groups does not reach."""

    def close_run(self) -> None:  # noqa: B027 - optional hook
        """The run is over: release what its attempts shared (pre-imported workers)."""

    def abort(self, launch: Launch) -> None:  # noqa: B027 - optional hook
        """Stop what killing the entry's process group does not reach."""

    @property
    def lost(self) -> str:
        """Why the backend stopped the run because it can no longer run entries ('' while it can):
        a cluster that stopped answering. The run then ends with that line and exit 5."""
        return ""

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

    @property
    def gpus_known(self) -> bool:
        """False while the run's GPUs are known only after `check` (a cluster it has not joined)."""
        return True

    @property
    def local_processes(self) -> bool:
        """Entries are processes of this host, importing what this host's interpreter sees."""
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release what the backend made for this run."""

    def gpu_rows(self, host: str) -> list[str]:
        """The run's GPUs as the timeline names them, `node:gpu`; here, this host's."""
        return [f"{host}:{i}" for i in range(self.gpus)]
