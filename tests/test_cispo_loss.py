"""CISPO: a clipped, detached importance weight on REINFORCE; no token loses its gradient."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import compute_cispo_loss, compute_policy_loss

NUM_GPUS = 0


def test_weight_is_clipped_above():
    lp = torch.log(torch.tensor([3.0], dtype=torch.float64))
    old = torch.zeros(1, dtype=torch.float64)
    loss, clipped = compute_cispo_loss(lp, old, torch.tensor([1.0], dtype=torch.float64), eps_clip_high=0.5)
    assert loss.item() == pytest.approx(-1.5 * lp.item())
    assert clipped.item() == 1.0


def test_weight_is_the_ratio_of_new_to_old_probabilities():
    # Non-zero old log-probs: the weight is exp(new - old), 0.6 / 0.5 = 1.2 (inside the clip).
    lp = torch.log(torch.tensor([0.6, 0.2], dtype=torch.float64))
    old = torch.log(torch.tensor([0.5, 0.4], dtype=torch.float64))
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, clipped = compute_cispo_loss(lp, old, adv, eps_clip_high=0.5)
    torch.testing.assert_close(loss, torch.stack([-1.2 * lp[0], 0.5 * lp[1]]))
    assert clipped.tolist() == [0.0, 0.0]


def test_weight_is_clipped_at_one_plus_eps_high_not_below_it():
    lp = torch.log(torch.tensor([1.3, 2.0], dtype=torch.float64))
    old = torch.zeros(2, dtype=torch.float64)
    loss, clipped = compute_cispo_loss(lp, old, torch.ones(2, dtype=torch.float64), eps_clip_high=0.5)
    torch.testing.assert_close(loss, torch.stack([-1.3 * lp[0], -1.5 * lp[1]]))
    assert clipped.tolist() == [0.0, 1.0]


def test_gradient_is_weight_times_advantage_even_when_clipped():
    lp = torch.log(torch.tensor([3.0, 0.5], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(2, dtype=torch.float64)
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    loss, _ = compute_cispo_loss(lp, old, adv, eps_clip_high=0.5)
    loss.sum().backward()
    # d/dlogp of -A * sg(w) * logp = -A * w, with w = min(ratio, 1.5)
    torch.testing.assert_close(lp.grad, torch.tensor([-1.5, 1.0], dtype=torch.float64))


def test_ppo_drops_the_gradient_cispo_keeps():
    lp = torch.log(torch.tensor([3.0], dtype=torch.float64)).requires_grad_(True)
    old = torch.zeros(1, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    ppo, _ = compute_policy_loss(old - lp, adv, eps_clip=0.2)
    ppo.sum().backward()
    assert lp.grad.item() == 0.0
    lp.grad = None
    cispo, _ = compute_cispo_loss(lp, old, adv, eps_clip_high=0.2)
    cispo.sum().backward()
    assert lp.grad.item() != 0.0


def test_optional_lower_clip():
    lp = torch.log(torch.tensor([0.1], dtype=torch.float64))
    old = torch.zeros(1, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    free, _ = compute_cispo_loss(lp, old, adv, eps_clip_high=0.2)
    low, c = compute_cispo_loss(lp, old, adv, eps_clip_high=0.2, eps_clip_low=0.5)
    assert free.item() == pytest.approx(-0.1 * lp.item())
    assert low.item() == pytest.approx(-0.5 * lp.item())
    assert c.item() == 1.0


def test_no_gradient_to_old_log_probs():
    lp = torch.tensor([-1.0], requires_grad=True)
    old = torch.tensor([-1.1], requires_grad=True)  # ratio 1.105: inside the clip range
    loss, _ = compute_cispo_loss(lp, old, torch.ones(1), eps_clip_high=0.2)
    loss.sum().backward()
    assert old.grad is None or old.grad.abs().sum() == 0


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
