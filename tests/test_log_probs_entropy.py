"""Log-probabilities, entropy, temperature and the response span of packed logits."""

import sys

import pytest
import torch

from slime.utils.cp_utils import response_logits
from slime.utils.ppo_utils import log_probs_and_entropy

NUM_GPUS = 0


def _logits(n=6, vocab=11, seed=0):
    return torch.randn(n, vocab, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_log_probs_match_softmax():
    logits = _logits()
    tokens = torch.tensor([0, 3, 10, 4, 4, 1])
    lp, _ = log_probs_and_entropy(logits, tokens)
    expected = torch.log(torch.softmax(logits, -1)[torch.arange(6), tokens])
    torch.testing.assert_close(lp, expected.float())
    assert torch.all(lp < 0)


def test_temperature_divides_logits():
    logits = _logits()
    tokens = torch.zeros(6, dtype=torch.long)
    hot, _ = log_probs_and_entropy(logits, tokens, temperature=2.0)
    plain, _ = log_probs_and_entropy(logits / 2.0, tokens)
    torch.testing.assert_close(hot, plain)


def test_entropy_bounds():
    uniform = torch.zeros(3, 8)
    _, ent = log_probs_and_entropy(uniform, torch.zeros(3, dtype=torch.long))
    torch.testing.assert_close(ent, torch.full((3,), torch.log(torch.tensor(8.0)).item()))
    peaked = torch.tensor([[100.0, 0.0, 0.0]])
    _, ent = log_probs_and_entropy(peaked, torch.zeros(1, dtype=torch.long))
    assert ent.item() == pytest.approx(0.0, abs=1e-6)


def test_bad_temperature():
    with pytest.raises(ValueError, match="positive"):
        log_probs_and_entropy(_logits(), torch.zeros(6, dtype=torch.long), temperature=0.0)


def test_response_span_is_shifted_by_one():
    # Two packed samples: lengths 5 (response 2) and 4 (response 3). Row i = position i.
    logits = torch.arange(9, dtype=torch.float64).unsqueeze(1)
    spans = response_logits(logits, [5, 4], [2, 3])
    assert spans[0].flatten().tolist() == [2.0, 3.0]  # predicts tokens 3 and 4 of sample 0
    assert spans[1].flatten().tolist() == [5.0, 6.0, 7.0]  # predicts tokens 1..3 of sample 1


def test_response_span_log_probs_score_the_response_tokens():
    tokens = torch.tensor([5, 1, 2, 7, 3])
    logits = torch.full((5, 8), -20.0)
    logits[torch.arange(4), tokens[1:]] = 20.0  # position t predicts token t+1 perfectly
    (span,) = response_logits(logits, [5], [2])
    lp, _ = log_probs_and_entropy(span, tokens[-2:])
    assert torch.all(lp > -1e-6)


def test_response_span_errors():
    with pytest.raises(ValueError, match="cover"):
        response_logits(torch.zeros(4, 2), [5], [2])
    with pytest.raises(ValueError, match="response length"):
        response_logits(torch.zeros(4, 2), [4], [4])


def test_batched_logits_use_the_last_dimension():
    # [batch, tokens, vocab]: with a 2-D input dim 1 and dim -1 coincide, with 3-D they do not.
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 5)
    tokens = torch.randint(0, 5, (2, 3))
    chosen, entropy = log_probs_and_entropy(logits, tokens)
    logp = torch.log_softmax(logits, dim=-1)
    for b in range(2):
        for t in range(3):
            assert chosen[b, t].item() == pytest.approx(logp[b, t, tokens[b, t]].item(), abs=1e-6)
            p = logp[b, t].exp()
            assert entropy[b, t].item() == pytest.approx(-(p * logp[b, t]).sum().item(), abs=1e-6)
    assert chosen.shape == entropy.shape == (2, 3)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
