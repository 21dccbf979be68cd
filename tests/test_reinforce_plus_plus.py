"""REINFORCE++ returns: KL penalty per token, reward on the last trained token."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import reinforce_plus_plus_returns

NUM_GPUS = 0


def test_no_kl_gives_the_reward_on_every_token_with_gamma_one():
    out = reinforce_plus_plus_returns([2.0], [torch.zeros(4)], [torch.ones(4)], kl_coef=0.1)
    torch.testing.assert_close(out[0], torch.full((4,), 2.0))


def test_kl_penalty_accumulates_backwards():
    kl = torch.tensor([0.1, 0.2, 0.3])
    out = reinforce_plus_plus_returns([1.0], [kl], [torch.ones(3)], kl_coef=0.5)[0]
    token_rewards = torch.tensor([-0.05, -0.1, -0.15 + 1.0])
    expected = token_rewards.flip(0).cumsum(0).flip(0)
    torch.testing.assert_close(out, expected)


def test_reward_lands_on_the_last_unmasked_token():
    # Trailing tokens masked out (e.g. an aborted tail): the reward must not go there.
    mask = torch.tensor([1, 1, 0, 0])
    out = reinforce_plus_plus_returns([1.0], [torch.zeros(4)], [mask], kl_coef=0.0)[0]
    torch.testing.assert_close(out, torch.tensor([1.0, 1.0, 0.0, 0.0]))


def test_masked_tokens_carry_no_penalty():
    kl = torch.tensor([1.0, 1.0, 1.0])
    mask = torch.tensor([1, 0, 1])
    out = reinforce_plus_plus_returns([0.0], [kl], [mask], kl_coef=1.0)[0]
    torch.testing.assert_close(out, torch.tensor([-2.0, 0.0, -1.0]))


def test_discount():
    out = reinforce_plus_plus_returns([1.0], [torch.zeros(3)], [torch.ones(3)], kl_coef=0.0, gamma=0.5)[0]
    torch.testing.assert_close(out, torch.tensor([0.25, 0.5, 1.0]))


def test_samples_are_independent():
    outs = reinforce_plus_plus_returns(
        [1.0, -1.0], [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.ones(3)], kl_coef=0.0
    )
    assert [o.tolist() for o in outs] == [[1.0, 1.0], [-1.0, -1.0, -1.0]]


def test_mismatched_inputs():
    with pytest.raises(ValueError, match="differ"):
        reinforce_plus_plus_returns([1.0], [torch.zeros(2)], [torch.ones(3)], kl_coef=0.1)
    with pytest.raises(ValueError):
        reinforce_plus_plus_returns([1.0, 2.0], [torch.zeros(2)], [torch.ones(2)], kl_coef=0.1)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
