"""Zig-zag context-parallel split and its inverse."""

import sys

import pytest
import torch

from slime.utils.cp_utils import pad_length, zigzag_indices, zigzag_merge, zigzag_split

NUM_GPUS = 0


def test_rank_takes_chunk_r_and_its_mirror():
    # 16 positions, cp=2 -> 4 chunks of 4: rank 0 gets chunks 0 and 3, rank 1 gets 1 and 2.
    assert zigzag_indices(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert zigzag_indices(16, 2, 1).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_shards_partition_the_sequence(cp):
    n = 2 * cp * 5
    seen = torch.cat([zigzag_indices(n, cp, r) for r in range(cp)])
    assert sorted(seen.tolist()) == list(range(n))


@pytest.mark.parametrize("cp", [1, 2, 4])
@pytest.mark.parametrize("dim", [0, 1])
def test_merge_inverts_split(cp, dim):
    x = torch.randn(24, 24)
    shards = [zigzag_split(x, cp, r, dim=dim) for r in range(cp)]
    torch.testing.assert_close(zigzag_merge(shards, dim=dim), x)


def test_causal_work_is_balanced():
    # Attention cost of position t is t + 1; each rank's total must be equal.
    n, cp = 64, 4
    costs = [(zigzag_indices(n, cp, r) + 1).sum().item() for r in range(cp)]
    assert len(set(costs)) == 1
    contiguous = [sum(range(r * n // cp + 1, (r + 1) * n // cp + 1)) for r in range(cp)]
    assert len(set(contiguous)) == cp  # the naive split is unbalanced


@pytest.mark.parametrize(("length", "cp", "padded"), [(7, 2, 8), (8, 2, 8), (1, 4, 8), (9, 1, 10)])
def test_pad_length(length, cp, padded):
    assert pad_length(length, cp) == padded


def test_errors():
    with pytest.raises(ValueError, match="multiple"):
        zigzag_indices(10, 2, 0)
    with pytest.raises(ValueError, match="outside"):
        zigzag_indices(8, 2, 2)
    with pytest.raises(ValueError, match="at least one"):
        zigzag_merge([])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
