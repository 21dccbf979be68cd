"""Assertions shared by the adapter tests: a sample must be exactly what the engine produced."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise

from _engine import EngineCall

from slime.agent.trajectory import TrajectorySample


def assert_sample_is_chain(sample: TrajectorySample, calls: Sequence[EngineCall]) -> None:
    """The sample holds these engine calls in order: every token once, mask 1 only on outputs."""
    first, last = calls[0], calls[-1]
    for before, after in pairwise(calls):
        # Generated tokens are reused, never re-tokenized: each prompt extends the last turn.
        assert after.prompt_ids[: len(before.prompt_ids) + len(before.output_ids)] == (
            *before.prompt_ids,
            *before.output_ids,
        )
    assert sample.tokens == (*last.prompt_ids, *last.output_ids)
    assert sample.prompt_length == len(first.prompt_ids)
    assert len(sample.loss_mask) == len(sample.rollout_log_probs) == sample.response_length
    expected_mask = [0] * len(sample.tokens)
    expected_lp = [0.0] * len(sample.tokens)
    for call in calls:
        start = len(call.prompt_ids)
        for i, lp in enumerate(call.logprobs):
            expected_mask[start + i] = 1
            expected_lp[start + i] = lp
    assert list(sample.loss_mask) == expected_mask[sample.prompt_length :]
    assert list(sample.rollout_log_probs) == expected_lp[sample.prompt_length :]
    assert sum(sample.loss_mask) == sum(len(c.output_ids) for c in calls)
