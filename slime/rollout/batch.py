"""What one rollout hands the trainer, and the debug dump/replay of it.

A `TrainBatch` is plain data (lists of ints and floats), so it pickles into a Ray call and
into `--save-debug-rollout-data DIR/rollout_{rollout_id}.pt` alike; loading a dump back
gives the same batch, which is how `--load-debug-rollout-data` trains with no engine.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from slime.utils.data import process_rollout_data
from slime.utils.types import Sample

DUMP_FORMAT = 1


@dataclass(frozen=True, kw_only=True)
class TrainBatch:
    """Samples of one rollout, flattened in group order; every tuple is indexed by sample."""

    rollout_id: int
    n_samples_per_prompt: int
    tokens: tuple[tuple[int, ...], ...]
    response_lengths: tuple[int, ...]
    loss_masks: tuple[tuple[int, ...], ...]
    raw_rewards: tuple[float, ...]
    rewards: tuple[float, ...]  # group-normalised for GRPO, as graded otherwise
    rollout_log_probs: tuple[tuple[float, ...], ...]
    weight_version: int  # the engines' version that generated every sample
    stats: dict[str, float] = field(default_factory=dict)  # filter counts, lengths, …

    def __post_init__(self) -> None:
        n = len(self.tokens)
        for name in ("response_lengths", "loss_masks", "raw_rewards", "rewards", "rollout_log_probs"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"TrainBatch.{name} has {len(getattr(self, name))} entries for {n} samples")
        for i, (r, m, lp) in enumerate(zip(self.response_lengths, self.loss_masks,
                                           self.rollout_log_probs, strict=True)):
            if not (len(m) == len(lp) == r) or r >= len(self.tokens[i]) or r < 1:
                raise ValueError(
                    f"sample {i}: response length {r}, mask {len(m)}, log-probs {len(lp)}, "
                    f"tokens {len(self.tokens[i])} disagree"
                )

    @property
    def size(self) -> int:
        """Number of samples."""
        return len(self.tokens)

    def mean_reward(self) -> float:
        """Mean graded reward."""
        return sum(self.raw_rewards) / max(1, len(self.raw_rewards))


def batch_from_groups(groups: list[list[Sample]], *, rollout_id: int, advantage_estimator: str,
                      weight_version: int, stats: dict[str, float] | None = None) -> TrainBatch:
    """Validate the groups and normalise rewards over them (`slime.utils.data`), then flatten."""
    n = len(groups[0]) if groups else 0
    (data,) = process_rollout_data(groups, dp_size=1, n_samples_per_prompt=n,
                                   advantage_estimator=advantage_estimator)
    flat = [s for g in groups for s in g]
    order = list(data.sample_indices)
    for s in flat:
        if s.rollout_log_probs is None:
            raise ValueError(f"sample {s.index} has no rollout log-probs; ask the engine for them")
    return TrainBatch(
        rollout_id=rollout_id,
        n_samples_per_prompt=n,
        tokens=data.tokens,
        response_lengths=data.response_lengths,
        loss_masks=data.loss_masks,
        raw_rewards=data.raw_rewards,
        rewards=data.rewards,
        rollout_log_probs=tuple(tuple(float(x) for x in flat[i].rollout_log_probs or ()) for i in order),
        weight_version=weight_version,
        stats=dict(stats or {}),
    )


def dump_path(template: str, rollout_id: int) -> Path:
    """`template` with `{rollout_id}` filled in."""
    return Path(template.format(rollout_id=rollout_id))


def save_batch(batch: TrainBatch, template: str) -> Path:
    """Write `batch` to its debug dump file (written whole, then renamed into place)."""
    import torch

    path = dump_path(template, batch.rollout_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    torch.save({"format": DUMP_FORMAT, "batch": dataclasses.asdict(batch)}, tmp)
    tmp.replace(path)
    return path


def load_batch(template: str, rollout_id: int) -> TrainBatch:
    """Read a dump written by `save_batch`; a missing or foreign file is a clear error."""
    import torch

    path = dump_path(template, rollout_id)
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: no rollout {rollout_id} dump; save it with --save-debug-rollout-data first"
        )
    payload: Any = torch.load(path, weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != DUMP_FORMAT:
        raise ValueError(f"{path} is not a rollout dump of format {DUMP_FORMAT}")
    raw = payload["batch"]
    tuples = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
              for k, v in raw.items()}
    return TrainBatch(**tuples)
