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


def test_masked_mean_of_one_unmasked_entry_is_that_entry():
    values = torch.tensor([3.0, 5.0])
    assert masked_mean(values, torch.tensor([1, 0])).item() == 3.0
    assert masked_mean(values, torch.tensor([0, 0])).item() == 0.0  # nothing unmasked: 0, not NaN
    torch.testing.assert_close(masked_mean(torch.tensor([[3.0, 5.0], [1.0, 7.0]]),
                                           torch.tensor([[1, 0], [1, 1]]), dim=1), torch.tensor([3.0, 4.0]))


def test_two_unmasked_entries_are_enough_and_one_is_not():
    out = masked_whiten(torch.tensor([1.0, 3.0, 9.0]), torch.tensor([1, 1, 0]))
    s = 2 ** 0.5  # unbiased std of {1, 3}
    torch.testing.assert_close(out, torch.tensor([-1 / s, 1 / s, 0.0]))
    with pytest.raises(ValueError) as err:
        masked_whiten(torch.tensor([1.0, 3.0]), torch.tensor([1, 0]))
    assert str(err.value) == "masked_whiten needs at least two unmasked entries"


def test_eps_is_added_to_the_variance_and_small_variances_are_kept():
    values = torch.tensor([0.0, 0.2], dtype=torch.float64)
    mask = torch.ones(2)
    var = 0.02  # unbiased variance of {0, 0.2}: far below 1
    torch.testing.assert_close(masked_whiten(values, mask, eps=0.0),
                               torch.tensor([-0.1, 0.1], dtype=torch.float64) / var ** 0.5)
    torch.testing.assert_close(masked_whiten(values, mask, eps=1.0),
                               torch.tensor([-0.1, 0.1], dtype=torch.float64) / (var + 1.0) ** 0.5)


def test_float32_values_are_whitened_in_float64():
    # Sum-of-squares variance cancels catastrophically in float32 when values share a large
    # offset; the statistics are taken in float64, so the offset changes nothing.
    values = torch.tensor([0.0, 1.0, 2.0, 3.0])
    mask = torch.ones(4)
    torch.testing.assert_close(masked_whiten(values + 1e5, mask), masked_whiten(values, mask))


def test_statistics_go_through_the_group_all_reduce(tmp_path):
    # A real one-rank gloo group: the sums are all-reduced (a no-op on one rank) and the
    # result is the local whitening. The sharded cases run on several ranks in
    # test_advantage_whitening_cp.py.
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        values = torch.tensor([1.0, 2.0, 4.0, 8.0])
        mask = torch.tensor([1, 1, 0, 1])
        torch.testing.assert_close(masked_whiten(values, mask, process_group=dist.group.WORLD),
                                   masked_whiten(values, mask))
    finally:
        dist.destroy_process_group()


def test_whiten_returns_the_input_dtype():
    out = masked_whiten(torch.tensor([1.0, 2.0, 4.0]), torch.ones(3))
    assert out.dtype == torch.float32


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
