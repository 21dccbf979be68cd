"""Context parallelism: zig-zag sequence sharding and a loss that does not depend on the split.

Causal attention makes late tokens costlier than early ones, so a sequence is
cut into `2 * cp_size` chunks and rank r takes chunks r and `2*cp_size-1-r`:
every rank gets one cheap and one expensive chunk.
"""

from __future__ import annotations

import torch


def pad_length(length: int, cp_size: int) -> int:
    """Smallest length >= `length` that splits into `2 * cp_size` equal chunks."""
    unit = 2 * cp_size
    return -(-length // unit) * unit


def zigzag_indices(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Positions of a length-`length` sequence that rank `cp_rank` holds, in order."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"cp_rank {cp_rank} is outside a context-parallel group of {cp_size}")
    if length % (2 * cp_size):
        raise ValueError(
            f"length {length} must be a multiple of 2 * cp_size = {2 * cp_size}; pad it first"
        )
    chunk = length // (2 * cp_size)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    mirror = 2 * cp_size - 1 - cp_rank
    second = torch.arange(mirror * chunk, (mirror + 1) * chunk)
    return torch.cat([first, second])


def zigzag_split(x: torch.Tensor, cp_size: int, cp_rank: int, dim: int = 0) -> torch.Tensor:
    """This rank's zig-zag shard of `x` along `dim`."""
    return x.index_select(dim, zigzag_indices(x.shape[dim], cp_size, cp_rank))


def zigzag_merge(shards: list[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """Inverse of `zigzag_split`: the shards of ranks 0..cp_size-1 back into one sequence."""
    cp_size = len(shards)
    if cp_size == 0:
        raise ValueError("zigzag_merge needs at least one shard")
    half = shards[0].shape[dim] // 2
    chunks: list[torch.Tensor | None] = [None] * (2 * cp_size)
    for rank, shard in enumerate(shards):
        if shard.shape[dim] != 2 * half:
            raise ValueError("all shards must have the same, even length")
        chunks[rank] = shard.narrow(dim, 0, half)
        chunks[2 * cp_size - 1 - rank] = shard.narrow(dim, half, half)
    return torch.cat([c for c in chunks if c is not None], dim=dim)


def sum_of_sample_means(
    token_losses: list[torch.Tensor],
    loss_masks: list[torch.Tensor],
    mask_totals: list[int] | list[float],
) -> torch.Tensor:
    """Σ over samples of (Σ masked token losses held here) / (masked tokens of the whole sample).

    Dividing by the whole sample's token count, not the local shard's, is what
    makes the all-reduced sum over CP ranks the sample's true mean; dividing
    that by the global sample count then makes it invariant to the DP split.
    """
    dtype = torch.float32
    for loss in token_losses:  # at least fp32; fp64 inputs keep fp64
        dtype = torch.promote_types(dtype, loss.dtype)
    total = torch.zeros((), dtype=dtype)
    for loss, mask, count in zip(token_losses, loss_masks, mask_totals, strict=True):
        total = total + (loss.to(dtype) * mask.to(dtype)).sum() / max(float(count), 1.0)
    return total


def response_logits(
    logits: torch.Tensor, total_lengths: list[int], response_lengths: list[int]
) -> list[torch.Tensor]:
    """Per sample of a packed `[sum(total_lengths), V]` tensor, the logits that predict its response.

    Position t predicts token t+1, so a response occupying positions
    [L - R, L) is predicted by positions [L - R - 1, L - 1).
    """
    if logits.shape[0] != sum(total_lengths):
        raise ValueError(f"logits cover {logits.shape[0]} positions, samples {sum(total_lengths)}")
    out, offset = [], 0
    for total, response in zip(total_lengths, response_lengths, strict=True):
        if not 0 < response < total:
            raise ValueError(f"response length {response} must be in (0, {total})")
        out.append(logits[offset + total - response - 1 : offset + total - 1])
        offset += total
    return out
