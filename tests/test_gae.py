"""Generalised advantage estimation."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import compute_gae, discounted_returns_reference

NUM_GPUS = 0


def _data(seed=0, n=9):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(2, n, generator=g), torch.randn(2, n, generator=g)


def test_lambda_zero_is_one_step_td():
    r, v = _data()
    adv, _ = compute_gae(r, v, gamma=0.9, lam=0.0)
    next_v = torch.cat([v[:, 1:], torch.zeros(2, 1)], dim=1)
    torch.testing.assert_close(adv, r + 0.9 * next_v - v)


def test_lambda_one_is_monte_carlo_minus_value():
    r, v = _data(1)
    adv, returns = compute_gae(r, v, gamma=0.95, lam=1.0)
    mc = discounted_returns_reference(r.double(), 0.95).float()
    torch.testing.assert_close(adv, mc - v, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(returns, mc, rtol=1e-5, atol=1e-5)


def test_returns_are_advantages_plus_values():
    r, v = _data(2)
    adv, returns = compute_gae(r, v, gamma=0.99, lam=0.95)
    torch.testing.assert_close(returns, adv + v)


def test_by_hand_two_steps():
    r = torch.tensor([0.0, 1.0])
    v = torch.tensor([0.5, 0.2])
    adv, _ = compute_gae(r, v, gamma=0.9, lam=0.8)
    d1 = 1.0 - 0.2
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    torch.testing.assert_close(adv, torch.tensor([d0 + 0.9 * 0.8 * d1, d1]))


def test_shape_mismatch():
    with pytest.raises(ValueError, match="differ"):
        compute_gae(torch.zeros(3), torch.zeros(4), 0.9, 0.9)


def test_gae_over_the_last_dimension_of_a_3d_batch_in_float32():
    torch.manual_seed(0)
    rewards = torch.randn(2, 3, 4, dtype=torch.float64)
    values = torch.randn(2, 3, 4, dtype=torch.float64)
    adv, ret = compute_gae(rewards, values, gamma=0.9, lam=0.8)
    assert adv.dtype == ret.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            a, r = compute_gae(rewards[i, j], values[i, j], gamma=0.9, lam=0.8)
            torch.testing.assert_close(adv[i, j], a)
            torch.testing.assert_close(ret[i, j], r)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
