"""The sum-of-sample-means loss and its gradient are the same for every DP x CP split.

Runs real gloo process groups: 4 CPU ranks host the layouts (1,1), (2,1),
(1,2) and (2,2) as sub-groups, and each layout's all-reduced loss and gradient
must equal the single-process reference.
"""

import sys

import pytest
import torch
from _gloo import run_ranks

from slime.utils.cp_utils import pad_length, sum_of_sample_means, zigzag_split
from slime.utils.dp_schedule import partition_balanced

NUM_GPUS = 0

LAYOUTS = [(1, 1), (2, 1), (1, 2), (2, 2)]  # (dp, cp)
LENGTHS = [5, 12, 7, 16, 3, 9]
DIM = 4


def make_batch():
    """Deterministic samples: features, targets, loss masks (some tokens masked out)."""
    g = torch.Generator().manual_seed(0)
    batch = []
    for n in LENGTHS:
        x = torch.randn(n, DIM, generator=g, dtype=torch.float64)
        y = torch.randn(n, generator=g, dtype=torch.float64)
        mask = (torch.rand(n, generator=g) > 0.3).to(torch.float64)
        mask[0] = 1.0
        batch.append((x, y, mask))
    w = torch.randn(DIM, generator=g, dtype=torch.float64)
    return batch, w


def token_loss(x, y, w):
    return (x @ w - y) ** 2


def reference():
    batch, w = make_batch()
    w = w.clone().requires_grad_(True)
    means = [(token_loss(x, y, w) * m).sum() / m.sum() for x, y, m in batch]
    loss = torch.stack(means).mean()
    loss.backward()
    return loss.item(), w.grad.clone()


def shard_loss(w, batch, indices, cp, cp_rank, *, per_shard_mean=False):
    losses, masks, totals = [], [], []
    for i in indices:
        x, y, m = batch[i]
        padded = pad_length(len(y), cp)
        pad = padded - len(y)
        x = torch.cat([x, torch.zeros(pad, DIM, dtype=x.dtype)])
        y = torch.cat([y, torch.zeros(pad, dtype=y.dtype)])
        m = torch.cat([m, torch.zeros(pad, dtype=m.dtype)])
        xs, ys, ms = (zigzag_split(t, cp, cp_rank) for t in (x, y, m))
        losses.append(token_loss(xs, ys, w))
        masks.append(ms)
        # The bug this test exists for: dividing by the shard's own token count.
        totals.append(ms.sum().item() if per_shard_mean else m.sum().item())
    return sum_of_sample_means(losses, masks, totals).double() / len(batch)


def layouts_on_rank(rank, world_size, per_shard_mean):
    import torch.distributed as dist

    batch, w0 = make_batch()
    results = {}
    for dp, cp in LAYOUTS:
        members = list(range(dp * cp))
        group = dist.new_group(members)  # every rank must take part in creating every group
        if rank not in members:
            continue
        dp_rank, cp_rank = divmod(rank, cp)
        indices = partition_balanced(LENGTHS, list(range(len(LENGTHS))), dp)[dp_rank]
        w = w0.clone().requires_grad_(True)
        loss = shard_loss(w, batch, indices, cp, cp_rank, per_shard_mean=per_shard_mean)
        loss.backward()
        packed = torch.cat([loss.detach().reshape(1), w.grad])
        dist.all_reduce(packed, group=group)
        results[(dp, cp)] = packed
    return results


@pytest.fixture(scope="module")
def distributed(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gloo")
    return run_ranks(layouts_on_rank, 4, tmp, False)


@pytest.mark.parametrize(("dp", "cp"), LAYOUTS)
def test_loss_and_grad_match_reference(distributed, dp, cp):
    ref_loss, ref_grad = reference()
    for rank in range(dp * cp):
        packed = distributed[rank][(dp, cp)]
        assert packed[0].item() == pytest.approx(ref_loss, rel=1e-12)
        torch.testing.assert_close(packed[1:], ref_grad, rtol=1e-10, atol=1e-12)


def test_every_rank_of_a_layout_agrees(distributed):
    for dp, cp in LAYOUTS:
        values = [distributed[r][(dp, cp)] for r in range(dp * cp)]
        for v in values[1:]:
            assert torch.equal(v, values[0])


def test_the_reference_would_catch_per_shard_normalisation():
    # Same computation in one process, emulating cp=2 shards with the bug: it must differ,
    # otherwise the distributed comparison above could not catch that bug.
    batch, w = make_batch()
    indices = list(range(len(LENGTHS)))
    buggy = sum(shard_loss(w, batch, indices, 2, r, per_shard_mean=True) for r in range(2))
    right = sum(shard_loss(w, batch, indices, 2, r) for r in range(2))
    ref_loss, _ = reference()
    assert right.item() == pytest.approx(ref_loss, rel=1e-12)
    assert abs(buggy.item() - ref_loss) > 1e-3


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
