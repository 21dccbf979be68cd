"""Rollout groups → validated per-rank training data; rewards normalised over the global groups."""

import sys

import pytest
import torch

from slime.utils.data import RolloutDataError, process_rollout_data, validate_groups
from slime.utils.types import Sample, Status

NUM_GPUS = 0


def _sample(group, index, prompt_len=3, response_len=2, reward=1.0, **kw):
    return Sample(
        group_index=group, index=index, tokens=list(range(prompt_len + response_len)),
        response_length=response_len, reward=reward, status=kw.pop("status", Status.COMPLETED), **kw,
    )


def _groups(rewards, lengths=None):
    groups, idx = [], 0
    for g, rs in enumerate(rewards):
        group = []
        for r in rs:
            resp = lengths[idx] if lengths else 2
            group.append(_sample(g, idx, response_len=resp, reward=r))
            idx += 1
        groups.append(group)
    return groups


def test_ranks_cover_every_sample_once():
    groups = _groups([[1, 0, 0, 1], [0, 0, 0, 1], [1, 1, 1, 0]], lengths=list(range(1, 13)))
    ranks = process_rollout_data(groups, dp_size=3, n_samples_per_prompt=4)
    seen = sorted(i for r in ranks for i in r.sample_indices)
    assert seen == list(range(12))
    assert [len(r.sample_indices) for r in ranks] == [4, 4, 4]


def test_rewards_are_normalised_over_global_groups():
    raw = [[1.0, 0.0, 0.0, 0.0], [3.0, 1.0, 2.0, 2.0]]
    ranks = process_rollout_data(_groups(raw, lengths=[9, 1, 8, 2, 7, 3, 6, 4]), dp_size=2, n_samples_per_prompt=4)
    # By hand: (r - group mean) / (group std + eps), per prompt group.
    expected = torch.cat([(g - g.mean()) / (g.std() + 1e-6) for g in torch.tensor(raw, dtype=torch.float64)])
    local_differs = []
    for r in ranks:
        for i, got in zip(r.sample_indices, r.rewards, strict=True):
            assert got == pytest.approx(expected[i].item())
        # Normalising a rank's slice alone (partial groups) gives something else.
        local = torch.tensor(r.raw_rewards)
        local_norm = (local - local.mean()) / (local.std() + 1e-6)
        local_differs.append(not torch.allclose(torch.tensor(r.rewards, dtype=torch.float32), local_norm))
    assert any(local_differs)
    assert {len({i // 4 for i in r.sample_indices}) for r in ranks} == {2}  # groups are split


def test_raw_rewards_are_this_ranks_slice():
    raw = [[1.0, 2.0], [3.0, 4.0]]
    ranks = process_rollout_data(_groups(raw, lengths=[4, 1, 2, 3]), dp_size=2, n_samples_per_prompt=2)
    flat = [1.0, 2.0, 3.0, 4.0]
    for r in ranks:
        assert list(r.raw_rewards) == [flat[i] for i in r.sample_indices]


def test_ppo_keeps_raw_rewards():
    ranks = process_rollout_data(_groups([[1.0, 0.0]]), dp_size=1, n_samples_per_prompt=2, advantage_estimator="ppo")
    assert ranks[0].rewards == ranks[0].raw_rewards == (1.0, 0.0)


def test_lengths_and_masks_travel_with_samples():
    groups = _groups([[0.0, 1.0]], lengths=[2, 5])
    groups[0][1].loss_mask = [1, 0, 0, 1, 1]
    (rank,) = process_rollout_data(groups, dp_size=1, n_samples_per_prompt=2)
    by_index = dict(zip(rank.sample_indices, zip(rank.total_lengths, rank.response_lengths, rank.loss_masks, strict=True), strict=True))
    assert by_index[0] == (5, 2, (1, 1))
    assert by_index[1] == (8, 5, (1, 0, 0, 1, 1))


def test_aborted_samples_are_masked_out():
    groups = _groups([[1.0, 0.0]])
    groups[0][1].status = Status.ABORTED
    (rank,) = process_rollout_data(groups, dp_size=1, n_samples_per_prompt=2)
    masks = dict(zip(rank.sample_indices, rank.loss_masks, strict=True))
    assert masks == {0: (1, 1), 1: (0, 0)}


def test_dict_rewards_need_a_key():
    groups = _groups([[0.0, 1.0]])
    for s in groups[0]:
        s.reward = {"acc": s.reward, "format": 1.0}
    with pytest.raises(RolloutDataError, match="pass reward_key"):
        process_rollout_data(groups, dp_size=1, n_samples_per_prompt=2)
    (rank,) = process_rollout_data(groups, dp_size=1, n_samples_per_prompt=2, reward_key="acc")
    assert sorted(rank.raw_rewards) == [0.0, 1.0]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda s: setattr(s, "status", Status.PENDING), "pending"),
        (lambda s: setattr(s, "response_length", 5), "response_length 5"),
        (lambda s: setattr(s, "loss_mask", [1]), "loss_mask has 1 entries for 2"),
        (lambda s: setattr(s, "loss_mask", [1, 2]), "0 or 1"),
        (lambda s: setattr(s, "rollout_log_probs", [-0.1, -0.2, -0.3]), "rollout_log_probs has 3"),
        (lambda s: setattr(s, "reward", None), "not a number"),
        (lambda s: setattr(s, "group_index", 9), "mixes samples"),
    ],
)
def test_malformed_samples_are_named(mutate, match):
    groups = _groups([[1.0, 0.0]])
    mutate(groups[0][1])
    with pytest.raises(RolloutDataError, match=match):
        process_rollout_data(groups, dp_size=1, n_samples_per_prompt=2)


def test_group_size_and_split_checks():
    with pytest.raises(RolloutDataError, match="has 2 samples"):
        validate_groups(_groups([[1.0, 0.0]]), 4)
    with pytest.raises(RolloutDataError, match="no groups"):
        validate_groups([], 4)
    with pytest.raises(RolloutDataError, match="do not split evenly"):
        process_rollout_data(_groups([[1.0, 0.0, 1.0]]), dp_size=2, n_samples_per_prompt=3)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
