"""Whitening advantages sharded over ranks (DP or CP) equals whitening the whole batch.

Real gloo groups of 2 and 4 CPU ranks; each rank holds a zig-zag shard of
every sequence, and `masked_whiten(process_group=...)` must reproduce the
single-process result on its shard.
"""

import sys

import pytest
import torch
from _gloo import run_ranks

from slime.utils.cp_utils import zigzag_split
from slime.utils.ppo_utils import masked_whiten

NUM_GPUS = 0
SEQ = 16


def make_batch():
    g = torch.Generator().manual_seed(7)
    values = torch.randn(3, SEQ, generator=g, dtype=torch.float64) * 2 + 1
    mask = (torch.rand(3, SEQ, generator=g) > 0.3).to(torch.float64)
    return values, mask


def whiten_on_rank(rank, world_size):
    import torch.distributed as dist

    values, mask = make_batch()
    out = {}
    for size in (2, 4):
        group = dist.new_group(list(range(size)))
        if rank >= size:
            continue
        v = zigzag_split(values, size, rank, dim=1)
        m = zigzag_split(mask, size, rank, dim=1)
        out[size] = (
            masked_whiten(v, m, process_group=group),
            masked_whiten(v, m),  # local statistics only: the bug
        )
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_ranks(whiten_on_rank, 4, tmp_path_factory.mktemp("gloo"))


@pytest.mark.parametrize("size", [2, 4])
def test_sharded_whitening_equals_whole_batch(results, size):
    values, mask = make_batch()
    whole = masked_whiten(values, mask)
    for rank in range(size):
        expected = zigzag_split(whole, size, rank, dim=1)
        torch.testing.assert_close(results[rank][size][0], expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("size", [2, 4])
def test_local_statistics_would_differ(results, size):
    values, mask = make_batch()
    whole = masked_whiten(values, mask)
    diffs = [
        (results[r][size][1] - zigzag_split(whole, size, r, dim=1)).abs().max().item()
        for r in range(size)
    ]
    assert max(diffs) > 1e-3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
