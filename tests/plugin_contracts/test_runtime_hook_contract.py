"""Contract of a runtime hook run after each rollout: metrics out, batch shape untouched.

Default: the reference hook. Yours:
`SLIME_PLUGIN_RUNTIME_HOOK=pkg.mod:hook python tests/plugin_contracts/test_runtime_hook_contract.py`.
"""

import argparse
import os
import sys

import pytest

from slime.rollout.reference import ListDataSource, generate_rollout, reward_stats_hook
from slime.utils.misc import load_function
from slime.utils.plugin_contracts import DEFAULTS, ENV_RUNTIME_HOOK, ContractViolation, check_runtime_hook

NUM_GPUS = 0


def _args():
    return argparse.Namespace(rollout_temperature=2.0, rm_type="math", rollout_batch_size=2,
                              n_samples_per_prompt=4, rollout_max_response_len=64)


@pytest.fixture(scope="module")
def groups():
    args = _args()
    source = ListDataSource(items=[("What is 5+5?", "10"), ("What is 9-1?", "8")], n_samples_per_prompt=4)
    return generate_rollout(args, 0, source)


@pytest.fixture
def hook():
    return load_function(os.environ.get(ENV_RUNTIME_HOOK) or DEFAULTS[ENV_RUNTIME_HOOK])


def test_hook_honours_the_contract(hook, groups):
    metrics = check_runtime_hook(hook, _args(), 3, groups)
    assert all(isinstance(v, float) for v in metrics.values())


def test_hook_does_not_touch_the_callers_samples(hook, groups):
    before = [[s.to_dict() for s in g] for g in groups]
    check_runtime_hook(hook, _args(), 3, groups)
    assert [[s.to_dict() for s in g] for g in groups] == before


def test_reference_metrics(groups):
    metrics = check_runtime_hook(reward_stats_hook, _args(), 3, groups)
    rewards = [s.reward for g in groups for s in g]
    assert metrics["rollout/reward_mean"] == pytest.approx(sum(rewards) / len(rewards))
    assert metrics["rollout/id"] == 3.0


def _drops_a_sample(args, rollout_id, groups):
    groups[0].pop()


def _returns_text(args, rollout_id, groups):
    return {"note": "fine"}


def _returns_list(args, rollout_id, groups):
    return [1.0]


def _wrong_arity(args, groups):
    return None


def _truncates_tokens(args, rollout_id, groups):
    groups[1][0].tokens = groups[1][0].tokens[:-1]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (_drops_a_sample, "number or the lengths"),
        (_truncates_tokens, "number or the lengths"),
        (_returns_text, "not a name and a number"),
        (_returns_list, "returns None or"),
        (_wrong_arity, "cannot be called"),
    ],
)
def test_broken_hooks_are_rejected(bad, groups, match):
    with pytest.raises(ContractViolation, match=match):
        check_runtime_hook(bad, _args(), 0, groups)


def test_a_hook_may_reshape_rewards(groups):
    def clip(args, rollout_id, groups):
        for g in groups:
            for s in g:
                s.reward = max(0.0, s.reward - 0.5)

    assert check_runtime_hook(clip, _args(), 0, groups) == {}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
