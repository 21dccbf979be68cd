"""Masked whitening: statistics from unmasked entries only."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import masked_mean, masked_whiten

NUM_GPUS = 0


def _data():
    g = torch.Generator().manual_seed(0)
    values = torch.randn(4, 10, generator=g, dtype=torch.float64) * 3 + 2
    mask = (torch.rand(4, 10, generator=g) > 0.4).to(torch.float64)
    return values, mask


def test_masked_entries_have_mean_zero_var_one():
    v, m = _data()
    w = masked_whiten(v, m)
    sel = w[m.bool()]
    assert sel.mean().item() == pytest.approx(0.0, abs=1e-10)
    assert sel.var().item() == pytest.approx(1.0, rel=1e-6)


def test_masked_out_entries_do_not_affect_the_result():
    v, m = _data()
    poisoned = torch.where(m.bool(), v, torch.full_like(v, 1e6))
    torch.testing.assert_close(masked_whiten(poisoned, m), masked_whiten(v, m))


def test_masked_out_entries_come_back_zero():
    v, m = _data()
    assert torch.all(masked_whiten(v, m)[~m.bool()] == 0)


def test_equals_plain_whitening_of_the_selected_values():
    v, m = _data()
    sel = v[m.bool()]
    expected = (sel - sel.mean()) / torch.sqrt(sel.var() + 1e-8)
    torch.testing.assert_close(masked_whiten(v, m)[m.bool()], expected)


def test_shift_mean_false_keeps_the_mean():
    v, m = _data()
    w = masked_whiten(v, m, shift_mean=False)
    assert w[m.bool()].mean().item() == pytest.approx(v[m.bool()].mean().item())


def test_too_few_entries():
    with pytest.raises(ValueError, match="at least two"):
        masked_whiten(torch.ones(3), torch.tensor([0, 1, 0]))


def test_masked_mean():
    v = torch.tensor([[1.0, 2.0, 100.0], [3.0, 100.0, 100.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_mean(v, m).item() == pytest.approx(2.0)
    torch.testing.assert_close(masked_mean(v, m, dim=1), torch.tensor([1.5, 3.0]))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
