"""Clipped PPO surrogate with asymmetric and dual clipping."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import compute_policy_loss

NUM_GPUS = 0


def _kl_for_ratio(ratio):
    return -torch.log(torch.tensor(ratio, dtype=torch.float64))


def test_ratio_one_gives_minus_advantage():
    adv = torch.tensor([1.0, -2.0, 0.5])
    loss, clipfrac = compute_policy_loss(torch.zeros(3), adv, eps_clip=0.2)
    torch.testing.assert_close(loss, -adv)
    assert clipfrac.sum() == 0


@pytest.mark.parametrize(
    ("ratio", "adv", "expected", "clipped"),
    [
        (1.5, 1.0, -1.2, 1.0),  # positive advantage: gain capped at 1 + eps
        (0.5, 1.0, -0.5, 0.0),  # positive advantage, low ratio: unclipped (pessimistic)
        (0.5, -1.0, 0.8, 1.0),  # negative advantage: clipped at 1 - eps
        (1.5, -1.0, 1.5, 0.0),  # negative advantage, high ratio: unclipped (pessimistic)
    ],
)
def test_pessimistic_clipping(ratio, adv, expected, clipped):
    loss, clipfrac = compute_policy_loss(
        _kl_for_ratio([ratio]), torch.tensor([adv], dtype=torch.float64), eps_clip=0.2
    )
    assert loss.item() == pytest.approx(expected)
    assert clipfrac.item() == clipped


def test_asymmetric_upper_bound():
    loss, _ = compute_policy_loss(
        _kl_for_ratio([2.0]), torch.tensor([1.0], dtype=torch.float64), eps_clip=0.2, eps_clip_high=0.28
    )
    assert loss.item() == pytest.approx(-1.28)


def test_dual_clip_caps_negative_advantage_losses():
    ratio = [10.0]
    adv = torch.tensor([-1.0], dtype=torch.float64)
    plain, _ = compute_policy_loss(_kl_for_ratio(ratio), adv, eps_clip=0.2)
    dual, _ = compute_policy_loss(_kl_for_ratio(ratio), adv, eps_clip=0.2, eps_clip_c=3.0)
    assert plain.item() == pytest.approx(10.0)
    assert dual.item() == pytest.approx(3.0)


def test_dual_clip_leaves_positive_advantages_alone():
    adv = torch.tensor([2.0], dtype=torch.float64)
    a, _ = compute_policy_loss(_kl_for_ratio([10.0]), adv, eps_clip=0.2)
    b, _ = compute_policy_loss(_kl_for_ratio([10.0]), adv, eps_clip=0.2, eps_clip_c=3.0)
    assert a.item() == b.item()


def test_dual_clip_leaves_small_positive_advantages_alone():
    adv = torch.tensor([0.5, 2.0], dtype=torch.float64)
    a, _ = compute_policy_loss(_kl_for_ratio([10.0, 10.0]), adv, eps_clip=0.2)
    b, _ = compute_policy_loss(_kl_for_ratio([10.0, 10.0]), adv, eps_clip=0.2, eps_clip_c=3.0)
    torch.testing.assert_close(a, b)


def test_dual_clip_bound_must_exceed_one():
    with pytest.raises(ValueError, match=r"> 1.0"):
        compute_policy_loss(torch.zeros(1), torch.ones(1), eps_clip=0.2, eps_clip_c=0.9)
    with pytest.raises(ValueError) as err:
        compute_policy_loss(torch.zeros(1), torch.ones(1), eps_clip=0.2, eps_clip_c=1.0)
    assert str(err.value) == "eps_clip_c must be > 1.0 for dual clip, got 1.0"
    adv = torch.tensor([-1.0], dtype=torch.float64)
    loss, _ = compute_policy_loss(_kl_for_ratio([10.0]), adv, eps_clip=0.2, eps_clip_c=1.5)
    assert loss.item() == pytest.approx(1.5)


def test_no_gradient_through_clipped_tokens():
    new_lp = torch.log(torch.tensor([1.5, 1.0], dtype=torch.float64)).requires_grad_(True)
    old_lp = torch.zeros(2, dtype=torch.float64)
    loss, _ = compute_policy_loss(old_lp - new_lp, torch.tensor([1.0, 1.0], dtype=torch.float64), 0.2)
    loss.sum().backward()
    assert new_lp.grad[0].item() == 0.0  # clipped: ratio 1.5 > 1.2
    assert new_lp.grad[1].item() == pytest.approx(-1.0)  # d(-ratio)/d(logp) at ratio 1
    assert old_lp.grad is None


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
