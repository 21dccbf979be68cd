"""GRPO group-relative advantages."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import compute_grpo_advantages

NUM_GPUS = 0


def test_each_group_is_centered_and_scaled_on_its_own():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 7.0, 9.0, 11.0])
    adv = compute_grpo_advantages(rewards, 4).view(2, 4)
    assert torch.allclose(adv.sum(dim=1), torch.zeros(2), atol=1e-6)
    assert torch.allclose(adv.std(dim=1), torch.ones(2), atol=1e-4)


def test_values_against_hand_computation():
    rewards = torch.tensor([1.0, 0.0])
    adv = compute_grpo_advantages(rewards, 2)
    std = torch.tensor([1.0, 0.0]).std()
    torch.testing.assert_close(adv, torch.tensor([0.5, -0.5]) / (std + 1e-6))


def test_groups_are_not_mixed():
    # A bug that normalises over the whole batch would shift group 0 by group 1's mean.
    rewards = torch.tensor([0.0, 1.0, 100.0, 101.0])
    adv = compute_grpo_advantages(rewards, 2, normalize_std=False)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5, -0.5, 0.5]))


def test_uniform_group_gives_zero_not_nan():
    adv = compute_grpo_advantages(torch.tensor([1.0, 1.0, 1.0]), 3)
    assert torch.equal(adv, torch.zeros(3))


def test_group_of_one():
    assert torch.equal(compute_grpo_advantages(torch.tensor([3.0, 4.0]), 1), torch.zeros(2))


def test_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        compute_grpo_advantages(torch.zeros(5), 2)
    with pytest.raises(ValueError, match="1-D"):
        compute_grpo_advantages(torch.zeros(2, 2), 2)


def test_eps_is_added_to_the_std():
    # eps guards the division: it can only shrink an advantage, never grow or flip it.
    rewards = torch.tensor([0.0, 2.0])
    std = torch.tensor([0.0, 2.0]).std().item()  # sqrt(2): unbiased, as the code uses
    adv = compute_grpo_advantages(rewards, 2, eps=1.0)
    torch.testing.assert_close(adv, torch.tensor([-1.0, 1.0]) / (std + 1.0))
    plain = compute_grpo_advantages(rewards, 2)
    assert (adv.abs() < plain.abs()).all()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
