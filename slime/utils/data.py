"""Turn rollout groups into per-rank training data, after checking they are well formed.

Rewards are normalised over the *global* groups before the batch is split:
a rank that normalised only its own slice would see partial groups and get
different advantages (the bug this order prevents).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from slime.utils.dp_schedule import partition_balanced
from slime.utils.ppo_utils import compute_grpo_advantages
from slime.utils.types import Sample, Status

GROUP_NORMALISED = ("grpo", "gspo", "cispo")


class RolloutDataError(ValueError):
    """Rollout output that training cannot use; the message names the sample and the problem."""


@dataclass(frozen=True, kw_only=True)
class RankData:
    """What one data-parallel rank trains on; every list is indexed like `sample_indices`."""

    sample_indices: tuple[int, ...]  # positions in the flattened global batch
    tokens: tuple[tuple[int, ...], ...]
    total_lengths: tuple[int, ...]
    response_lengths: tuple[int, ...]
    loss_masks: tuple[tuple[int, ...], ...]
    raw_rewards: tuple[float, ...]  # this rank's rewards as graded
    rewards: tuple[float, ...]  # after normalisation over the global groups


def _reward(sample: Sample, reward_key: str | None) -> float:
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None or reward_key not in reward:
            raise RolloutDataError(
                f"sample {sample.index}: reward is a dict {sorted(reward)}; pass reward_key"
            )
        reward = reward[reward_key]
    if not isinstance(reward, (int, float)) or isinstance(reward, bool):
        raise RolloutDataError(f"sample {sample.index}: reward {reward!r} is not a number")
    return float(reward)


def validate_sample(sample: Sample) -> None:
    """Raise `RolloutDataError` when a sample's lengths, masks or status are inconsistent."""
    where = f"sample {sample.index} (group {sample.group_index})"
    if sample.status == Status.PENDING:
        raise RolloutDataError(f"{where} is still pending; the rollout did not finish it")
    if not 0 <= sample.response_length < len(sample.tokens):
        raise RolloutDataError(
            f"{where}: response_length {sample.response_length} must be in [0, {len(sample.tokens)}) "
            "(tokens hold the prompt and the response)"
        )
    for name in ("loss_mask", "rollout_log_probs"):
        value = getattr(sample, name)
        if value is not None and len(value) != sample.response_length:
            raise RolloutDataError(
                f"{where}: {name} has {len(value)} entries for {sample.response_length} response tokens"
            )
    if sample.loss_mask is not None and any(m not in (0, 1) for m in sample.loss_mask):
        raise RolloutDataError(f"{where}: loss_mask entries must be 0 or 1")


def validate_groups(groups: list[list[Sample]], n_samples_per_prompt: int) -> None:
    """Every group has `n_samples_per_prompt` valid samples of one prompt."""
    if not groups:
        raise RolloutDataError("the rollout returned no groups")
    for g, group in enumerate(groups):
        if len(group) != n_samples_per_prompt:
            raise RolloutDataError(
                f"group {g} has {len(group)} samples; --n-samples-per-prompt is {n_samples_per_prompt}"
            )
        if len({s.group_index for s in group}) != 1:
            raise RolloutDataError(f"group {g} mixes samples of different prompts (group_index)")
        for sample in group:
            validate_sample(sample)


def _loss_mask(sample: Sample) -> tuple[int, ...]:
    if sample.status in (Status.ABORTED, Status.FAILED):
        # An unfinished response teaches nothing; it stays in the batch for shape only.
        return (0,) * sample.response_length
    if sample.loss_mask is None:
        return (1,) * sample.response_length
    return tuple(sample.loss_mask)


def process_rollout_data(
    groups: list[list[Sample]],
    *,
    dp_size: int,
    n_samples_per_prompt: int,
    advantage_estimator: str = "grpo",
    reward_key: str | None = None,
) -> list[RankData]:
    """Validate, normalise rewards over the global groups, and split across `dp_size` ranks."""
    validate_groups(groups, n_samples_per_prompt)
    flat = [s for group in groups for s in group]
    if len(flat) % dp_size:
        raise RolloutDataError(
            f"{len(flat)} samples do not split evenly over {dp_size} data-parallel ranks"
        )
    raw = torch.tensor([_reward(s, reward_key) for s in flat], dtype=torch.float64)
    if advantage_estimator in GROUP_NORMALISED:
        rewards = compute_grpo_advantages(raw, n_samples_per_prompt).double()
    else:
        rewards = raw
    lengths = [len(s.tokens) for s in flat]
    out = []
    for indices in partition_balanced(lengths, list(range(len(flat))), dp_size):
        out.append(
            RankData(
                sample_indices=tuple(indices),
                tokens=tuple(tuple(flat[i].tokens) for i in indices),
                total_lengths=tuple(lengths[i] for i in indices),
                response_lengths=tuple(flat[i].response_length for i in indices),
                loss_masks=tuple(_loss_mask(flat[i]) for i in indices),
                raw_rewards=tuple(float(raw[i]) for i in indices),
                rewards=tuple(float(rewards[i]) for i in indices),
            )
        )
    return out
