"""Dynamic sampling filter: groups with all-equal rewards go, the counts say how many, the rest stay in order."""

import sys

import pytest

from slime.rollout.filter import dynamic_filter, keep_group, trim_to_multiple
from slime.utils.types import Sample

NUM_GPUS = 0


def group(g, rewards):
    return [Sample(group_index=g, index=g * 10 + i, reward=r) for i, r in enumerate(rewards)]


def test_all_equal_groups_are_dropped_and_counted():
    groups = [group(0, [1, 1, 1, 1]), group(1, [0, 1, 0, 0]), group(2, [0, 0, 0, 0]), group(3, [0.5, 0.25, 0.5, 0.5])]
    result = dynamic_filter(groups)
    assert [g[0].group_index for g in result.kept] == [1, 3]
    assert result.dropped_groups == 2
    assert result.dropped_samples == 8
    stats = result.stats()
    assert stats["filter/dropped_groups"] == 2.0
    assert stats["filter/kept_groups"] == 2.0
    assert stats["filter/dropped_fraction"] == 0.5


def test_nothing_to_drop_keeps_everything():
    groups = [group(0, [0, 1]), group(1, [1, 0])]
    result = dynamic_filter(groups)
    assert result.kept == groups
    assert result.dropped_groups == result.dropped_samples == 0


def test_an_ungraded_sample_is_an_error():
    with pytest.raises(ValueError, match="grade it before filtering"):
        keep_group([Sample(index=3, reward=None), Sample(index=4, reward=1.0)])


@pytest.mark.parametrize(("sizes", "dp", "kept"), [
    ([4, 4, 4], 8, 2), ([4, 4, 4], 4, 3), ([3, 3, 3], 2, 2), ([3], 2, 0), ([2, 2], 1, 2),
])
def test_trim_keeps_the_longest_prefix_that_splits_evenly(sizes, dp, kept):
    groups = [group(g, [0.0, 1.0] * n)[:n] for g, n in enumerate(sizes)]
    out = trim_to_multiple(groups, dp)
    assert len(out) == kept
    assert sum(len(g) for g in out) % dp == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
