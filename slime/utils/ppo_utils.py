"""PPO/GRPO math on token tensors: KL estimators, policy losses, advantages, returns, whitening.

Conventions: per-token tensors of one sequence are 1-D `[T]`; batched ones are
`[B, T]`. `ppo_kl` is `old_log_prob - new_log_prob`, so the importance ratio is
`exp(-ppo_kl)`. Loss functions return per-token losses; reduction happens in
the caller (see `slime.utils.cp_utils.sum_of_sample_means`).
"""

from __future__ import annotations

from typing import Literal

import torch

KLType = Literal["k1", "k2", "k3", "low_var_kl"]
KL_TYPES: tuple[KLType, ...] = ("k1", "k2", "k3", "low_var_kl")


def compute_approx_kl(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: KLType
) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy.

    k1 = log r, k2 = (log r)^2 / 2, k3 = r' - 1 - log r' with r' = ref/policy
    (unbiased and never negative); `low_var_kl` is k3 clamped to [-10, 10].
    """
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return log_ratio.square() / 2
    if kl_type in ("k3", "low_var_kl"):
        kl = torch.expm1(-log_ratio) + log_ratio
        return kl.clamp(-10, 10) if kl_type == "low_var_kl" else kl
    raise ValueError(f"unknown kl_type {kl_type!r}; pick one of {', '.join(KL_TYPES)}")


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped surrogate loss per token and the clip indicator.

    The ratio is clipped to [1 - eps_clip, 1 + eps_clip_high]. With dual clip
    (`eps_clip_c` > 1), a negative advantage's loss is capped at
    `-advantage * eps_clip_c`, so a huge ratio on a bad token cannot explode.
    """
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"eps_clip_c must be > 1.0 for dual clip, got {eps_clip_c}")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(-ppo_kl)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + high)
    loss = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = (loss_clipped > loss_unclipped).float()
    if eps_clip_c is not None:
        capped = torch.minimum(loss, -advantages * eps_clip_c)
        loss = torch.where(advantages < 0, capped, loss)
    return loss, clipfrac


def compute_cispo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip_high: float,
    eps_clip_low: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO: REINFORCE weighted by a clipped, detached importance ratio.

    Unlike PPO clipping, no token's gradient is dropped: the ratio is only a
    weight (stop-gradient), and the gradient flows through `log_probs`.
    """
    ratio = torch.exp(log_probs.detach() - old_log_probs.detach())
    low = 0.0 if eps_clip_low is None else 1 - eps_clip_low
    weight = ratio.clamp(min=low, max=1 + eps_clip_high)
    clipped = (weight != ratio).float()
    return -advantages * weight * log_probs, clipped


def compute_grpo_advantages(
    rewards: torch.Tensor, group_size: int, *, normalize_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Group-relative advantages: each reward minus its group's mean (and over its std)."""
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be 1-D with a multiple of group_size={group_size} entries, "
            f"got shape {tuple(rewards.shape)}"
        )
    groups = rewards.float().view(-1, group_size)
    centered = groups - groups.mean(dim=1, keepdim=True)
    if normalize_std and group_size > 1:
        centered = centered / (groups.std(dim=1, keepdim=True) + eps)
    return centered.reshape(-1)


def discounted_returns_reference(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """Serial G_t = r_t + gamma * G_{t+1} over the last dimension; the definition."""
    out = torch.zeros_like(rewards, dtype=torch.float64)
    running = torch.zeros(rewards.shape[:-1], dtype=torch.float64)
    for t in range(rewards.shape[-1] - 1, -1, -1):
        running = rewards[..., t].double() + gamma * running
        out[..., t] = running
    return out.to(rewards.dtype)


def discounted_returns(rewards: torch.Tensor, gamma: float, chunk_size: int = 128) -> torch.Tensor:
    """G_t = sum_k gamma^k r_{t+k} over the last dimension, computed one chunk at a time.

    Within a chunk the sum is a matrix product with an upper-triangular
    discount matrix; chunks are walked right to left, carrying the return at a
    chunk's first position into the chunk before it.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    r = rewards.double()
    length = r.shape[-1]
    out = torch.empty_like(r)
    carry = torch.zeros(r.shape[:-1], dtype=torch.float64)
    idx = torch.arange(min(chunk_size, max(length, 1)), dtype=torch.float64)
    power = idx.unsqueeze(0) - idx.unsqueeze(1)  # power[i, j] = j - i
    full = torch.where(power >= 0, gamma**power.clamp(min=0), torch.zeros_like(power))
    for end in range(length, 0, -chunk_size):
        start = max(0, end - chunk_size)
        n = end - start
        disc = full[:n, :n]
        tail = gamma ** torch.arange(n, 0, -1, dtype=torch.float64)  # gamma^(n - i)
        out[..., start:end] = r[..., start:end] @ disc.T + carry.unsqueeze(-1) * tail
        carry = out[..., start]
    return out.to(rewards.dtype)


def compute_gae(
    rewards: torch.Tensor, values: torch.Tensor, gamma: float, lam: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the last dimension; returns (advantages, returns).

    The value after the last token is 0 (the episode ends with the response).
    """
    if rewards.shape != values.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)} and values {tuple(values.shape)} differ")
    length = rewards.shape[-1]
    advantages = torch.zeros_like(rewards, dtype=torch.float32)
    last = torch.zeros(rewards.shape[:-1], dtype=torch.float32)
    for t in range(length - 1, -1, -1):
        next_value = values[..., t + 1].float() if t + 1 < length else torch.zeros_like(last)
        delta = rewards[..., t].float() + gamma * next_value - values[..., t].float()
        last = delta + gamma * lam * last
        advantages[..., t] = last
    return advantages, advantages + values.float()


def reinforce_plus_plus_returns(
    rewards: list[float],
    kls: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    kl_coef: float,
    gamma: float = 1.0,
) -> list[torch.Tensor]:
    """Per-token returns of REINFORCE++: a KL penalty on every token, the reward on the last one.

    Masked-out tokens (tool output, aborted tails) get neither penalty nor reward.
    """
    out = []
    for reward, kl, mask in zip(rewards, kls, loss_masks, strict=True):
        if kl.shape != mask.shape:
            raise ValueError(f"kl {tuple(kl.shape)} and loss mask {tuple(mask.shape)} differ")
        token_rewards = -kl_coef * kl.float() * mask.float()
        active = torch.nonzero(mask).flatten()
        if active.numel():
            token_rewards[active[-1]] += reward
        out.append(discounted_returns(token_rewards, gamma) * mask.float())
    return out


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is set."""
    mask = mask.to(values.dtype)
    if dim is None:
        return (values * mask).sum() / mask.sum().clamp(min=1)
    return (values * mask).sum(dim) / mask.sum(dim).clamp(min=1)


def masked_whiten(
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    shift_mean: bool = True,
    eps: float = 1e-8,
    process_group: object | None = None,
) -> torch.Tensor:
    """Normalise the masked entries to mean 0, variance 1; masked-out entries come back as 0.

    With `process_group`, the statistics cover the masked entries of every rank
    (sums all-reduced), so whitening a sharded batch equals whitening it whole.
    """
    m = mask.to(torch.float64)
    v = values.to(torch.float64)
    stats = torch.stack([(v * m).sum(), (v * v * m).sum(), m.sum()])
    if process_group is not None:
        import torch.distributed as dist

        dist.all_reduce(stats, group=process_group)
    total, total_sq, count = stats.unbind()
    if count < 2:
        raise ValueError("masked_whiten needs at least two unmasked entries")
    mean = total / count
    # Unbiased variance, as a reference whitening over a concatenated batch would compute it.
    var = (total_sq - count * mean * mean) / (count - 1)
    out = (v - mean) * torch.rsqrt(var.clamp(min=0) + eps)
    if not shift_mean:
        out = out + mean
    return (out * m).to(values.dtype)


def log_probs_and_entropy(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probability of each token under `logits / temperature`, and the distribution's entropy."""
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    chosen = logp.gather(-1, tokens.long().unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy
