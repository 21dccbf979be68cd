"""Split a rollout batch across data-parallel ranks and micro-batches under a token cap.

Every rank must step through the same number of micro-batches (collectives
run once per micro-batch), so the count is agreed globally; each rank's
micro-batches are then packed to balance tokens. A micro-batch exceeds the cap
only when it holds a single sample longer than the cap.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class Schedule:
    """Sample indices per rank, per micro-batch; `dropped` did not fit an equal split."""

    micro_batches: tuple[tuple[tuple[int, ...], ...], ...]  # [rank][micro_batch] -> indices
    dropped: tuple[int, ...]
    max_tokens_per_micro_batch: int

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches per rank (the same on every rank)."""
        return len(self.micro_batches[0]) if self.micro_batches else 0

    def rank_samples(self, rank: int) -> list[int]:
        """All sample indices of one rank, in micro-batch order."""
        return [i for mb in self.micro_batches[rank] for i in mb]


def partition_balanced(lengths: list[int], indices: list[int], parts: int) -> list[list[int]]:
    """Split `indices` into `parts` groups of equal size (±1) with balanced token sums.

    Longest first, each into the lightest group that still has room (LPT with a
    cardinality cap).
    """
    if parts < 1:
        raise ValueError(f"parts must be >= 1, got {parts}")
    cap = -(-len(indices) // parts)
    groups: list[list[int]] = [[] for _ in range(parts)]
    heap = [(0, p) for p in range(parts)]
    order = sorted(indices, key=lambda i: (-lengths[i], i))
    for i in order:
        full = []
        tokens, p = heapq.heappop(heap)
        while len(groups[p]) >= cap:
            full.append((tokens, p))
            tokens, p = heapq.heappop(heap)
        groups[p].append(i)
        heapq.heappush(heap, (tokens + lengths[i], p))
        for item in full:
            heapq.heappush(heap, item)
    return [sorted(g) for g in groups]


def _pack(lengths: list[int], indices: list[int], bins: int) -> list[list[int]]:
    loads = [(0, b) for b in range(bins)]
    out: list[list[int]] = [[] for _ in range(bins)]
    for i in sorted(indices, key=lambda i: (-lengths[i], i)):
        tokens, b = heapq.heappop(loads)
        out[b].append(i)
        heapq.heappush(loads, (tokens + lengths[i], b))
    return [sorted(mb) for mb in out]


def _fits(lengths: list[int], mb: list[int], cap: int) -> bool:
    return len(mb) <= 1 or sum(lengths[i] for i in mb) <= cap


def schedule(
    lengths: list[int],
    dp_size: int,
    max_tokens_per_micro_batch: int,
    *,
    equal_samples_per_rank: bool = False,
) -> Schedule:
    """Assign sample indices (by token length) to `dp_size` ranks and their micro-batches.

    With `equal_samples_per_rank`, the last `len(lengths) % dp_size` samples are
    dropped so every rank gets the same number (as a global batch requires).
    """
    if dp_size < 1:
        raise ValueError(f"dp_size must be >= 1, got {dp_size}")
    if max_tokens_per_micro_batch < 1:
        raise ValueError(f"max_tokens_per_micro_batch must be >= 1, got {max_tokens_per_micro_batch}")
    if any(n < 0 for n in lengths):
        raise ValueError("sample lengths must be >= 0")
    keep = len(lengths)
    if equal_samples_per_rank:
        keep -= keep % dp_size
    if keep < dp_size:
        raise ValueError(f"{keep} samples cannot feed {dp_size} data-parallel ranks")
    ranks = partition_balanced(lengths, list(range(keep)), dp_size)
    # Fewest bins that could hold the largest rank's tokens, then grow until all fit.
    biggest = max(sum(lengths[i] for i in r) for r in ranks)
    bins = max(1, -(-biggest // max_tokens_per_micro_batch))
    while True:
        packed = [_pack(lengths, r, bins) for r in ranks]
        if all(_fits(lengths, mb, max_tokens_per_micro_batch) for r in packed for mb in r):
            break
        bins += 1
    # An empty micro-batch is only possible when a rank has fewer samples than
    # `bins`; drop the empty ones to the end so real work comes first.
    packed = [sorted(r, key=lambda mb: not mb) for r in packed]
    return Schedule(
        micro_batches=tuple(tuple(tuple(mb) for mb in r) for r in packed),
        dropped=tuple(range(keep, len(lengths))),
        max_tokens_per_micro_batch=max_tokens_per_micro_batch,
    )
