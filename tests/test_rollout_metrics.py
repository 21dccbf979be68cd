"""Rollout metrics: rewards, lengths, truncation, zero-signal groups, pass@n; merged across ranks."""

import sys

import pytest

from slime.utils.metrics import aggregate
from slime.utils.rollout_metrics import rollout_metrics
from slime.utils.types import Sample, Status

NUM_GPUS = 0


def _s(reward, length, status=Status.COMPLETED):
    return Sample(reward=reward, response_length=length, tokens=[0] * (length + 1), status=status)


def test_metrics_of_one_rollout():
    groups = [
        [_s(1.0, 10), _s(0.0, 30, Status.TRUNCATED)],
        [_s(0.0, 20), _s(0.0, 40, Status.ABORTED)],
    ]
    m = rollout_metrics(groups).results()
    assert m["rollout/reward"] == pytest.approx(0.25)
    assert m["rollout/response_len"] == pytest.approx(25.0)
    assert m["rollout/response_len_max"] == 40.0
    assert m["rollout/truncated_frac"] == pytest.approx(0.25)
    assert m["rollout/aborted_frac"] == pytest.approx(0.25)
    assert m["rollout/zero_std_groups"] == 1.0  # group 2: all zero, no GRPO signal
    assert m["rollout/pass_at_n"] == pytest.approx(0.5)


def test_merging_ranks_weights_by_samples_not_ranks():
    rank0 = rollout_metrics([[_s(1.0, 10)]])
    rank1 = rollout_metrics([[_s(0.0, 10), _s(0.0, 10), _s(0.0, 10)]])
    m = aggregate([rank0, rank1]).results()
    assert m["rollout/reward"] == pytest.approx(0.25)
    assert m["rollout/zero_std_groups"] == 2.0
    assert m["rollout/groups"] == 2.0
    assert m["rollout/pass_at_n"] == pytest.approx(0.5)


def test_empty_rollout_reports_nothing():
    assert rollout_metrics([]).results() == {}


def test_non_numeric_rewards_are_left_out_of_the_mean():
    m = rollout_metrics([[_s(1.0, 5), _s({"acc": 1.0}, 5)]]).results()
    assert m["rollout/reward"] == 1.0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
