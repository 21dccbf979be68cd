"""The learning-rate schedule and the optimizer's param groups, as slime trains with Megatron's.

`Schedule` is the closed form: linear warm-up from `init_lr` to `max_lr` over `warmup_iters`
steps, then `constant`, `linear` or `cosine` decay to `min_lr` at `decay_iters`, and `min_lr`
after it (Megatron's `OptimizerParamScheduler` semantics, counted in optimizer steps rather
than samples: every step of this trainer consumes the same global batch, so the two differ by
a constant factor). `ParamScheduler` is the one object that moves it: after each optimizer
step it sets every param group's `lr` for the next one. Its own state is its position; the lr
the next step uses lives in the optimizer's param groups and comes back with them on resume.

`param_groups` splits parameters as Megatron does: biases and 1-D tensors (norm weights) get
no weight decay, every other tensor gets `--weight-decay`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

import torch

DecayStyle = Literal["constant", "linear", "cosine"]
DECAY_STYLES: tuple[DecayStyle, ...] = ("constant", "linear", "cosine")
# What a checkpoint's schedule must agree with the run's on, unless told which one wins.
ScheduleOnLoad = Literal["check", "override", "checkpoint"]


class ScheduleError(ValueError):
    """A schedule that cannot be built or restored as asked; the message says what to change."""


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """The lr at every optimizer step, in closed form."""

    max_lr: float
    min_lr: float = 0.0
    init_lr: float = 0.0
    warmup_iters: int = 0
    decay_iters: int = 1
    style: DecayStyle = "constant"

    def __post_init__(self) -> None:
        if self.style not in DECAY_STYLES:
            raise ScheduleError(f"--lr-decay-style {self.style!r}: use one of {', '.join(DECAY_STYLES)}")
        if not 0.0 <= self.min_lr <= self.max_lr:
            raise ScheduleError(f"--min-lr {self.min_lr} must lie between 0 and --lr {self.max_lr}")
        if self.decay_iters < 1 or not 0 <= self.warmup_iters < self.decay_iters:
            raise ScheduleError(f"the warm-up ({self.warmup_iters} steps) must be shorter than the decay "
                                f"({self.decay_iters} steps); lower --lr-warmup-iters or raise "
                                "--lr-decay-iters")

    def lr_at(self, step: int) -> float:
        """The lr of the update made after `step` earlier updates."""
        if self.warmup_iters > 0 and step <= self.warmup_iters:
            return self.init_lr + (self.max_lr - self.init_lr) * step / self.warmup_iters
        if self.style == "constant":
            return self.max_lr
        if step > self.decay_iters:
            return self.min_lr
        ratio = (step - self.warmup_iters) / (self.decay_iters - self.warmup_iters)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.max_lr - self.min_lr)

    def with_max_lr(self, max_lr: float) -> Schedule:
        """The same shape at another peak (the critic's): min and initial lr keep their ratio to it."""
        scale = max_lr / self.max_lr if self.max_lr else 0.0
        return replace(self, max_lr=max_lr, min_lr=self.min_lr * scale, init_lr=self.init_lr * scale)


def schedule_for(*, lr: float, min_lr: float, init_lr: float, style: str, warmup_iters: int,
                 warmup_fraction: float | None, decay_iters: int | None, train_iters: int) -> Schedule:
    """The schedule the command line asks for; decay over the whole run unless told otherwise."""
    decay = train_iters if decay_iters is None else decay_iters
    if warmup_fraction is not None:
        if warmup_iters:
            raise ScheduleError("--lr-warmup-fraction and --lr-warmup-iters both set the warm-up; keep one")
        if not 0.0 <= warmup_fraction < 1.0:
            raise ScheduleError(f"--lr-warmup-fraction must be in [0, 1), got {warmup_fraction}")
        warmup_iters = int(warmup_fraction * decay)  # a fraction of the decay, as Megatron counts it
    return Schedule(max_lr=lr, min_lr=min_lr, init_lr=init_lr, warmup_iters=warmup_iters,
                    decay_iters=decay, style=style)  # type: ignore[arg-type]


def param_groups(named: Iterable[tuple[str, torch.nn.Parameter]],
                 weight_decay: float) -> list[dict[str, Any]]:
    """Two groups: decayed weights, then biases and 1-D tensors without decay (empty ones dropped)."""
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for name, param in named:
        if not param.requires_grad:
            continue
        (no_decay if name.endswith(".bias") or len(param.shape) == 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class ParamScheduler:
    """Moves every param group's lr along one `Schedule`, one optimizer step at a time."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Schedule, *,
                 on_load: ScheduleOnLoad = "check") -> None:
        self.optimizer, self.schedule, self.on_load = optimizer, schedule, on_load
        self.num_steps = 0
        self._apply()

    def _apply(self) -> None:
        lr = self.schedule.lr_at(self.num_steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def step(self) -> None:
        """After an optimizer step: the groups get the lr of the next one."""
        self.num_steps += 1
        self._apply()

    def current_lr(self) -> list[float]:
        return [float(g["lr"]) for g in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        """Position, settings and the lr per group it last set (saved with each checkpoint)."""
        return {"num_steps": self.num_steps, "schedule": asdict(self.schedule), "lr": self.current_lr()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the position. The groups' lr are the optimizer's and are restored with it;
        only a schedule changed on purpose (`override`) rewrites them here."""
        saved = Schedule(**state["schedule"])
        if saved != self.schedule:
            if self.on_load == "check":
                differ = ", ".join(f"{k} {v!r} (run: {getattr(self.schedule, k)!r})"
                                   for k, v in asdict(saved).items() if getattr(self.schedule, k) != v)
                raise ScheduleError(f"the checkpoint's lr schedule differs: {differ}; pass "
                                    "--override-opt_param-scheduler to use this run's, or "
                                    "--use-checkpoint-opt_param-scheduler to keep the checkpoint's")
            if self.on_load == "checkpoint":
                self.schedule = saved
        self.num_steps = int(state["num_steps"])
        if saved != self.schedule:  # overridden: the new schedule at the restored position
            self._apply()
