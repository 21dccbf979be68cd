"""Training checkpoints through `torch.distributed.checkpoint` (DCP).

Layout under the save root::

    iter_0000004/            one DCP checkpoint: every rank writes its own shards of
        .metadata            the model and optimizer (written last by DCP's coordinator)
        __0_0.distcp ...
        extra_rank0.pt ...   per rank: RNG states (torch, numpy, python), LR schedules,
                             data cursor, rollout id, weight version
    latest_checkpointed_iteration.txt   written last, atomically: "4"

A step counts only once its marker is written, after every rank has finished;
a save cut short leaves a directory the loader never picks (`--ckpt-step` on it
fails with a message naming what is missing).

Optimizer location ("gpu" | "cpu"), chosen separately for save and load: "gpu"
keeps the optimizer state on the rank's device while it is written or read; "cpu"
stages it in CPU memory (optimizer CPU offload) and moves it across. Under
`--emulate-gpus` the rank's device is the CPU, so both locations hold CPU tensors
and what is exercised is the format: a checkpoint saved from one location loads
bitwise into the other.
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

OptimizerLocation = Literal["gpu", "cpu"]
LATEST = "latest_checkpointed_iteration.txt"
OPTIMIZER_LOCATIONS: tuple[OptimizerLocation, ...] = ("gpu", "cpu")


class Scheduler(Protocol):
    """What a checkpoint saves of a schedule: torch's LR schedulers and ours alike."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be loaded as asked; the message says what to do."""


@dataclass(frozen=True, kw_only=True)
class TrainState:
    """What the loop needs besides weights to continue exactly where it stopped."""

    step: int  # optimizer steps done
    rollout_id: int = 0  # next rollout to produce
    data_cursor: int = 0  # next prompt index of the data source
    weight_version: int = 0  # version the engines serve


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def latest_step(root: str | Path) -> int | None:
    """The last complete step under root, or None when nothing was saved."""
    marker = Path(root) / LATEST
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker} holds {text!r}, not a step number; delete it or fix it by hand")
    return int(text)


def _write_atomic(path: Path, text: str) -> None:
    # Temp file in the same directory + fsync + rename: a reader sees the old
    # content or the new one, never a torn write, even if we are killed here.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextlib.contextmanager
def _single_process_ok() -> Iterator[None]:
    # One process without a process group (a converter, a test) is a supported use;
    # DCP warns about it even when told so with no_dist=True.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _rng_states() -> dict[str, Any]:
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()
    return states


def _set_rng_states(states: dict[str, Any]) -> None:
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _optimizer_options(location: OptimizerLocation) -> StateDictOptions:
    if location not in OPTIMIZER_LOCATIONS:
        raise CheckpointError(f"optimizer location {location!r}: use one of {', '.join(OPTIMIZER_LOCATIONS)}")
    return StateDictOptions(cpu_offload=location == "cpu")


@dataclass(frozen=True, kw_only=True)
class _Part:
    """One kind of state a step holds under its own key: a module's weights (no optimizer) or
    its optimizer's state, staged at `location`."""

    key: str
    module: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    location: OptimizerLocation = "gpu"

    def state_dict(self) -> dict[str, Any]:
        """What DCP writes from, or reads into (its tensors decide where the read lands)."""
        if self.optimizer is None:
            return dict(get_model_state_dict(self.module))
        return dict(get_optimizer_state_dict(self.module, self.optimizer,
                                             options=_optimizer_options(self.location)))

    def restore(self, state: dict[str, Any]) -> None:
        """Copy what DCP read into the module's (or the optimizer's) own state."""
        if self.optimizer is None:
            set_model_state_dict(self.module, state)
        else:
            set_optimizer_state_dict(self.module, self.optimizer, state)


def _parts(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
           critic: torch.nn.Module | None, critic_optimizer: torch.optim.Optimizer | None,
           location: OptimizerLocation | None) -> list[_Part]:
    """The state kinds to save or load, in the order they are read and restored; optimizer
    state only with a location (None: weights only)."""
    parts = [_Part(key="model", module=model)]
    if optimizer is not None and location is not None:
        parts.append(_Part(key="optimizer", module=model, optimizer=optimizer, location=location))
    if critic is not None:
        parts.append(_Part(key="critic", module=critic))
        if critic_optimizer is not None and location is not None:
            parts.append(_Part(key="critic_optimizer", module=critic, optimizer=critic_optimizer,
                               location=location))
    return parts


class Checkpointer:
    """Saves steps under `root`; with `async_save`, one save may run behind training.

    Call `wait()` before reading a checkpoint back and `close()` before exiting: an
    async save not waited for has no marker and so does not exist.
    """

    def __init__(
        self,
        root: str | Path,
        *,
        save_optimizer: OptimizerLocation | None = "gpu",
        async_save: bool = False,
        process_group: dist.ProcessGroup | None = None,
    ) -> None:
        if save_optimizer is not None:
            _optimizer_options(save_optimizer)
        self.root = Path(root)
        self.save_optimizer = save_optimizer
        self.async_save = async_save
        if async_save and process_group is None and dist.is_initialized():
            # The background write runs collectives (plan, metadata gather) while the
            # main thread runs training's; on one shared group the two interleave in
            # different orders on different ranks and deadlock. A group of its own
            # (gloo, as DCP's async path requires) keeps them apart. Collective:
            # every rank constructs its Checkpointer at the same point.
            process_group = dist.new_group(backend="gloo")
        self.process_group = process_group
        self._pending: tuple[int, Future[Any]] | None = None

    @property
    def pending_step(self) -> int | None:
        return self._pending[0] if self._pending else None

    def save(
        self,
        state: TrainState,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | None = None,
        scheduler: Scheduler | None = None,
        *,
        critic: torch.nn.Module | None = None,
        critic_optimizer: torch.optim.Optimizer | None = None,
        critic_scheduler: Scheduler | None = None,
    ) -> None:
        """Write `state.step`; every rank must call it. Returns before the write ends when async.

        With `critic` (PPO), its weights and, when optimizer state is saved, its optimizer's
        go into the same step, under their own keys.
        """
        self.wait()  # at most one save in flight, and steps become latest in order
        directory = step_dir(self.root, state.step)
        if _rank() == 0:
            directory.mkdir(parents=True, exist_ok=True)
        _barrier()
        content = {part.key: part.state_dict()
                   for part in _parts(model, optimizer, critic, critic_optimizer, self.save_optimizer)}
        extra = {
            "train_state": state,
            "rng": _rng_states(),
            "scheduler": scheduler.state_dict() if scheduler is not None else None,
            "critic_scheduler": critic_scheduler.state_dict() if critic_scheduler is not None else None,
            "has_optimizer": "optimizer" in content,
            "has_critic": "critic" in content,
            "has_critic_optimizer": "critic_optimizer" in content,
            "world_size": dist.get_world_size() if dist.is_initialized() else 1,
        }
        # Small and per rank: written synchronously, before the shards, so the
        # marker (written after the shards) implies it.
        torch.save(extra, directory / f"extra_rank{_rank()}.pt")
        if self.async_save:
            # Stages tensors to CPU now, writes in a background thread; training goes on.
            with _single_process_ok():
                future = dcp.async_save(content, checkpoint_id=str(directory),
                                        process_group=self.process_group, no_dist=not dist.is_initialized())
            self._pending = (state.step, future if isinstance(future, Future) else future.upload_completion)
        else:
            with _single_process_ok():
                dcp.save(content, checkpoint_id=str(directory), process_group=self.process_group,
                         no_dist=not dist.is_initialized())
            self._finish(state.step)

    def wait(self) -> None:
        """Block until the save in flight (if any) is written and marked latest."""
        if self._pending is None:
            return
        step, future = self._pending
        self._pending = None
        future.result()
        self._finish(step)

    def close(self) -> None:
        self.wait()

    def _finish(self, step: int) -> None:
        # Every rank's shards and extras are on disk before rank 0 moves the marker.
        _barrier()
        if _rank() == 0:
            _write_atomic(self.root / LATEST, f"{step}\n")
        _barrier()


def resolve_step(root: str | Path, step: int | None = None) -> int | None:
    """The step to load: `step` if given (it must be complete), else the latest; None if none."""
    root = Path(root)
    if step is None:
        return latest_step(root)
    directory = step_dir(root, step)
    if not (directory / ".metadata").exists():
        have = sorted(p.name for p in root.glob("iter_*") if (p / ".metadata").exists())
        raise CheckpointError(
            f"step {step} has no complete checkpoint in {root} (no {directory.name}/.metadata); "
            f"complete steps: {', '.join(have) or 'none'}")
    return step


def load(
    root: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Scheduler | None = None,
    *,
    step: int | None = None,
    load_optimizer: OptimizerLocation | None = "gpu",
    load_rng: bool = True,
    process_group: dist.ProcessGroup | None = None,
    critic: torch.nn.Module | None = None,
    critic_optimizer: torch.optim.Optimizer | None = None,
    critic_scheduler: Scheduler | None = None,
) -> TrainState | None:
    """Restore a step (the latest complete one unless `step`) into model, optimizer, schedule, RNG.

    A schedule is restored only when one is given (`--no-load-optim` passes none, and keeps the
    optimizer's too). Returns the saved `TrainState`, or None when root holds no checkpoint.
    Every rank calls it.
    """
    found = resolve_step(root, step)
    if found is None:
        return None
    directory = step_dir(root, found)
    extra = _read_extra(directory, load_rng)
    parts = _parts(model, optimizer, critic, critic_optimizer, load_optimizer)
    _check_holds(directory, extra, {part.key for part in parts}, run_has_critic=critic is not None)
    # The templates decide where DCP reads into: device buffers ("gpu") or CPU memory ("cpu");
    # each part's restore then copies into its own state on the parameters' device.
    content = {part.key: part.state_dict() for part in parts}
    with _single_process_ok():
        dcp.load(content, checkpoint_id=str(directory), process_group=process_group,
                 no_dist=not dist.is_initialized())
    for part in parts:
        part.restore(content[part.key])
    if scheduler is not None and extra["scheduler"] is not None:
        scheduler.load_state_dict(extra["scheduler"])
    if critic_scheduler is not None and extra.get("critic_scheduler") is not None:
        critic_scheduler.load_state_dict(extra["critic_scheduler"])
    if load_rng:
        _set_rng_states(extra["rng"])
    state: TrainState = extra["train_state"]
    return state


def _read_extra(directory: Path, load_rng: bool) -> dict[str, Any]:
    """This rank's small state of the step (RNG, schedule, train state, what the step holds)."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    # RNG streams are per rank: restoring them needs this rank's own file and the
    # saved world size. Weights alone (a converted model, a reference) reshard freely.
    extra_path = directory / f"extra_rank{_rank() if load_rng else 0}.pt"
    if not extra_path.exists():
        raise CheckpointError(f"{extra_path} is missing: the checkpoint was saved by fewer ranks; resume "
                              "with the world size it was saved with, or load weights only")
    extra: dict[str, Any] = torch.load(extra_path, weights_only=False)
    if load_rng and extra["world_size"] != world:
        raise CheckpointError(f"{directory} was saved by {extra['world_size']} ranks, this run has {world}; "
                              "RNG and data positions are per rank, so resume with the same world size")
    return extra


def _check_holds(directory: Path, extra: dict[str, Any], keys: set[str], *, run_has_critic: bool) -> None:
    """Refuse, in one line, a load that asks for state the step does not hold (or the reverse)."""
    if "optimizer" in keys and not extra["has_optimizer"]:
        raise CheckpointError(f"{directory} holds no optimizer state; load without the optimizer "
                              "or pick a step saved with --save-optimizer")
    if run_has_critic != bool(extra.get("has_critic")):
        raise CheckpointError(
            f"{directory} {'holds no' if run_has_critic else 'holds a'} critic and this run "
            f"{'has one' if run_has_critic else 'has none'}; resume a PPO run from a PPO checkpoint "
            "(--use-critic on both), or the other way round")
    if "critic_optimizer" in keys and not extra.get("has_critic_optimizer"):
        raise CheckpointError(f"{directory} holds no critic optimizer state; pick a step saved "
                              "with --save-optimizer")
