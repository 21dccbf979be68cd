"""DP × micro-batch scheduling under a token cap."""

import random
import sys

import pytest

from slime.utils.dp_schedule import partition_balanced, schedule

NUM_GPUS = 0


def _random_lengths(seed, n, low=1, high=400):
    rng = random.Random(seed)
    return [rng.randint(low, high) for _ in range(n)]


def _check(lengths, sched, dp, cap):
    kept = set(range(len(lengths))) - set(sched.dropped)
    seen = [i for r in range(dp) for i in sched.rank_samples(r)]
    assert len(seen) == len(set(seen)), "a sample is scheduled twice"
    assert set(seen) == kept, "scheduled samples are not exactly the kept ones"
    counts = {len(mbs) for mbs in sched.micro_batches}
    assert counts == {sched.num_micro_batches}, "ranks step through different micro-batch counts"
    for mbs in sched.micro_batches:
        for mb in mbs:
            tokens = sum(lengths[i] for i in mb)
            assert tokens <= cap or len(mb) == 1, f"micro-batch {mb} holds {tokens} > {cap} tokens"


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("dp", [1, 2, 3, 8])
def test_invariants_on_random_batches(seed, dp):
    lengths = _random_lengths(seed, 64)
    cap = 1024
    _check(lengths, schedule(lengths, dp, cap), dp, cap)


def test_oversized_sample_sits_alone():
    lengths = [100, 5000, 100, 100]
    sched = schedule(lengths, 2, 1000)
    _check(lengths, sched, 2, 1000)
    alone = [mb for mbs in sched.micro_batches for mb in mbs if 1 in mb]
    assert alone == [(1,)]


def test_equal_sample_count_drops_the_remainder():
    lengths = [10] * 10
    sched = schedule(lengths, 4, 100, equal_samples_per_rank=True)
    assert sched.dropped == (8, 9)
    assert [len(sched.rank_samples(r)) for r in range(4)] == [2, 2, 2, 2]
    _check(lengths, sched, 4, 100)


def test_tokens_are_balanced_across_ranks():
    lengths = _random_lengths(0, 128, 1, 2000)
    dp = 4
    sched = schedule(lengths, dp, 8192)
    loads = [sum(lengths[i] for i in sched.rank_samples(r)) for r in range(dp)]
    assert max(loads) - min(loads) <= max(lengths)
    # Far better than cutting the batch into contiguous blocks.
    naive = [sum(lengths[r * 32:(r + 1) * 32]) for r in range(dp)]
    assert max(loads) - min(loads) < (max(naive) - min(naive)) / 4


def test_sample_counts_per_rank_differ_by_at_most_one():
    lengths = [1000, 1, 1, 1, 1, 1, 1]
    groups = partition_balanced(lengths, list(range(7)), 2)
    assert sorted(len(g) for g in groups) == [3, 4]


def test_micro_batches_use_the_cap_not_one_sample_each():
    lengths = [100] * 16
    sched = schedule(lengths, 2, 400)
    assert sched.num_micro_batches == 2  # 8 samples x 100 tokens per rank, 4 per micro-batch


def test_deterministic():
    lengths = _random_lengths(5, 50)
    assert schedule(lengths, 4, 700) == schedule(lengths, 4, 700)


@pytest.mark.parametrize(
    ("args", "match"),
    [(([1, 2], 0, 10), "dp_size"), (([1, 2], 1, 0), "max_tokens"), (([1], 2, 10), "cannot feed"), (([-1, 2], 1, 10), ">= 0")],
)
def test_bad_input(args, match):
    with pytest.raises(ValueError, match=match):
        schedule(*args)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
