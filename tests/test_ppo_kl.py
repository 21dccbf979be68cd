"""Approximate KL estimators k1, k2, k3 and low-variance KL."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import compute_approx_kl

NUM_GPUS = 0


def _pair():
    g = torch.Generator().manual_seed(1)
    return -torch.rand(64, generator=g) * 3, -torch.rand(64, generator=g) * 3


@pytest.mark.parametrize("kl_type", ["k1", "k2", "k3", "low_var_kl"])
def test_zero_when_policies_agree(kl_type):
    lp = -torch.rand(10)
    assert torch.all(compute_approx_kl(lp, lp.clone(), kl_type) == 0)


def test_formulas():
    lp, ref = _pair()
    log_ratio = lp - ref
    torch.testing.assert_close(compute_approx_kl(lp, ref, "k1"), log_ratio)
    torch.testing.assert_close(compute_approx_kl(lp, ref, "k2"), log_ratio**2 / 2)
    torch.testing.assert_close(
        compute_approx_kl(lp, ref, "k3"), torch.exp(ref - lp) - (ref - lp) - 1, rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("kl_type", ["k2", "k3", "low_var_kl"])
def test_nonnegative(kl_type):
    lp, ref = _pair()
    assert torch.all(compute_approx_kl(lp, ref, kl_type) >= 0)


def test_k3_is_unbiased_for_the_true_kl():
    # Sample from p, estimate KL(p || q) with k3: the mean converges to the exact value.
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    idx = torch.multinomial(p, 200_000, replacement=True, generator=g)
    k3 = compute_approx_kl(p.log()[idx], q.log()[idx], "k3")
    exact = (p * (p / q).log()).sum()
    assert k3.mean().item() == pytest.approx(exact.item(), abs=5e-3)


def test_low_var_kl_is_clamped():
    lp = torch.tensor([0.0, 0.0])
    ref = torch.tensor([-50.0, 50.0])  # exp(50) would be astronomically large
    out = compute_approx_kl(lp, ref, "low_var_kl")
    assert out.max().item() == 10
    assert torch.isfinite(out).all()
    assert compute_approx_kl(lp, ref, "k3")[1].item() > 1e20  # unclamped k3 explodes


def test_gradient_flows_to_the_policy_only():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-1.5, -1.0], requires_grad=True)
    compute_approx_kl(lp, ref.detach(), "k3").sum().backward()
    assert lp.grad is not None and torch.all(lp.grad != 0)
    assert ref.grad is None


def test_unknown_type():
    with pytest.raises(ValueError, match="pick one of"):
        compute_approx_kl(torch.zeros(1), torch.zeros(1), "k4")


def test_unknown_kl_type_names_the_choices():
    with pytest.raises(ValueError) as err:
        compute_approx_kl(torch.zeros(1), torch.zeros(1), "k4")
    assert str(err.value) == "unknown kl_type 'k4'; pick one of k1, k2, k3, low_var_kl"


def test_low_var_kl_is_k3_capped_at_ten():
    lp = torch.tensor([0.0, -20.0, 0.5])
    ref = torch.zeros(3)
    k3 = compute_approx_kl(lp, ref, "k3")
    low = compute_approx_kl(lp, ref, "low_var_kl")
    assert k3[1].item() > 10
    torch.testing.assert_close(low, torch.stack([k3[0], torch.tensor(10.0), k3[2]]))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
