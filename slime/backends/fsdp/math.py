"""Token-level pieces of a training step on padded micro-batches; the formulas are `ppo_utils`'.

Shapes: a micro-batch of B samples is right-padded to `[B, L]` tokens; its responses are
gathered into `[B, R]` (R the longest response) with a mask that is 0 on padding and on
tokens the loss must skip. The logit that predicts token j sits at position j - 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from slime.utils.ppo_utils import (
    compute_approx_kl,
    compute_gae,
    log_probs_and_entropy,
    masked_mean,
    reinforce_plus_plus_returns,
)


@dataclass(frozen=True, kw_only=True)
class MicroBatch:
    """Padded tensors of some samples of the rollout (`indices` into the batch)."""

    indices: tuple[int, ...]
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    positions: torch.Tensor  # [B, R] logit position of each response token
    targets: torch.Tensor  # [B, R] response token ids
    mask: torch.Tensor  # [B, R] float, 1 where the token counts


def make_micro_batch(indices: Sequence[int], tokens: Sequence[Sequence[int]],
                     response_lengths: Sequence[int], loss_masks: Sequence[Sequence[int]],
                     device: str) -> MicroBatch:
    """Pad the chosen samples; response tokens are the last `response_length` of each."""
    rows = [list(tokens[i]) for i in indices]
    longest = max(len(r) for r in rows)
    r_max = max(response_lengths[i] for i in indices)
    b = len(rows)
    input_ids = torch.zeros(b, longest, dtype=torch.long)
    attention = torch.zeros(b, longest, dtype=torch.long)
    positions = torch.zeros(b, r_max, dtype=torch.long)
    targets = torch.zeros(b, r_max, dtype=torch.long)
    mask = torch.zeros(b, r_max)
    for row, i in enumerate(indices):
        seq = rows[row]
        n, r = len(seq), response_lengths[i]
        input_ids[row, :n] = torch.tensor(seq)
        attention[row, :n] = 1
        positions[row, :r] = torch.arange(n - r - 1, n - 1)
        targets[row, :r] = torch.tensor(seq[n - r:])
        mask[row, :r] = torch.tensor(loss_masks[i], dtype=torch.float32)
    return MicroBatch(indices=tuple(indices), input_ids=input_ids.to(device),
                      attention_mask=attention.to(device), positions=positions.to(device),
                      targets=targets.to(device), mask=mask.to(device))


def gather_response(per_position: torch.Tensor, mb: MicroBatch) -> torch.Tensor:
    """`[B, L, ...]` values at the response positions → `[B, R, ...]`."""
    index = mb.positions
    if per_position.dim() == 3:
        index = index.unsqueeze(-1).expand(-1, -1, per_position.shape[-1])
    return per_position.gather(1, index)


def response_log_probs(logits: torch.Tensor, mb: MicroBatch,
                       temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs `[B, R]` of the response tokens and the entropy of each step's distribution."""
    return log_probs_and_entropy(gather_response(logits, mb), mb.targets, temperature)


def per_sample_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over each sample's counted tokens: `[B, R]` → `[B]`."""
    return masked_mean(values, mask, dim=-1)


def pad_rows(values: Sequence[torch.Tensor], width: int) -> torch.Tensor:
    """1-D tensors → `[B, width]`, zero-padded."""
    out = torch.zeros(len(values), width, dtype=torch.float32, device=values[0].device)
    for b, v in enumerate(values):
        out[b, : v.numel()] = v
    return out


def grpo_token_advantages(rewards: Sequence[float], response_lengths: Sequence[int]) -> list[torch.Tensor]:
    """GRPO: the sample's group-normalised reward on every response token."""
    return [torch.full((r,), float(a)) for a, r in zip(rewards, response_lengths, strict=True)]


def reinforce_pp_advantages(rewards: Sequence[float], log_probs: Sequence[torch.Tensor],
                            ref_log_probs: Sequence[torch.Tensor], masks: Sequence[torch.Tensor],
                            kl_coef: float, gamma: float) -> list[torch.Tensor]:
    """REINFORCE++ returns: a k1 KL penalty per token, the reward on the last counted token."""
    kls = [compute_approx_kl(lp, ref, "k1") for lp, ref in zip(log_probs, ref_log_probs, strict=True)]
    return reinforce_plus_plus_returns(list(rewards), kls, list(masks), kl_coef, gamma)


def ppo_advantages(rewards: Sequence[float], log_probs: Sequence[torch.Tensor],
                   ref_log_probs: Sequence[torch.Tensor] | None, values: Sequence[torch.Tensor],
                   masks: Sequence[torch.Tensor], kl_coef: float, gamma: float,
                   lam: float) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """PPO with a critic: per-token rewards (KL penalty, reward at the end) through GAE."""
    advantages, returns = [], []
    for i, (reward, lp, value, mask) in enumerate(zip(rewards, log_probs, values, masks, strict=True)):
        token_rewards = torch.zeros_like(lp, dtype=torch.float32)
        if ref_log_probs is not None and kl_coef:
            token_rewards -= kl_coef * compute_approx_kl(lp, ref_log_probs[i], "k1")
        active = torch.nonzero(mask).flatten()
        if active.numel():
            token_rewards[active[-1]] += reward
        adv, ret = compute_gae(token_rewards.unsqueeze(0), value.float().unsqueeze(0), gamma, lam)
        advantages.append(adv.squeeze(0) * mask)
        returns.append(ret.squeeze(0))
    return advantages, returns
