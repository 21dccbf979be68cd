"""Chunked discounted returns equal the serial definition for every chunk size."""

import sys

import pytest
import torch

from slime.utils.ppo_utils import discounted_returns, discounted_returns_reference

NUM_GPUS = 0


def _rewards(shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("chunk_size", [1, 2, 3, 7, 16, 37, 64, 1000])
@pytest.mark.parametrize("gamma", [1.0, 0.99, 0.5, 0.0])
def test_chunked_equals_serial(chunk_size, gamma):
    r = _rewards((3, 37))
    torch.testing.assert_close(
        discounted_returns(r, gamma, chunk_size), discounted_returns_reference(r, gamma), rtol=1e-10, atol=1e-10
    )


def test_serial_reference_by_hand():
    r = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)
    torch.testing.assert_close(
        discounted_returns_reference(r, 0.5), torch.tensor([1 + 0.5 * 2 + 0.25 * 3, 2 + 1.5, 3.0], dtype=torch.float64)
    )


def test_gamma_one_is_a_reverse_cumsum():
    r = _rewards((50,), seed=3)
    torch.testing.assert_close(discounted_returns(r, 1.0, 8), r.flip(0).cumsum(0).flip(0))


def test_one_dimensional_and_empty():
    r = torch.tensor([0.0, 0.0, 1.0])
    torch.testing.assert_close(discounted_returns(r, 0.9, 2), torch.tensor([0.81, 0.9, 1.0]))
    assert discounted_returns(torch.zeros(2, 0), 0.9).shape == (2, 0)


def test_dtype_is_kept():
    assert discounted_returns(torch.ones(4, dtype=torch.float32), 0.9, 2).dtype == torch.float32


def test_bad_chunk_size():
    with pytest.raises(ValueError, match="chunk_size"):
        discounted_returns(torch.ones(3), 0.9, 0)


def test_3d_batches_and_the_input_dtype():
    torch.manual_seed(0)
    rewards = torch.randn(2, 3, 7)
    for fn in (discounted_returns_reference, lambda r, g: discounted_returns(r, g, chunk_size=3)):
        out = fn(rewards, 0.9)
        assert out.dtype == torch.float32
        for i in range(2):
            for j in range(3):
                g, want = 0.0, []
                for x in reversed(rewards[i, j].tolist()):
                    g = x + 0.9 * g
                    want.append(g)
                torch.testing.assert_close(out[i, j], torch.tensor(want[::-1]))


def test_a_single_step_is_its_reward():
    assert discounted_returns(torch.tensor([2.5]), 0.5).tolist() == [2.5]
    assert discounted_returns(torch.zeros(0), 0.5).shape == (0,)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
