"""Contract of a rollout function plugin.

Checks our reference implementation by default; point it at your own with
`SLIME_PLUGIN_ROLLOUT=pkg.mod:fn python tests/plugin_contracts/test_rollout_contract.py`.
Your function receives a data source with `get_samples(num_groups)`.
"""

import os
import sys

import pytest

from slime.rollout.reference import ListDataSource
from slime.utils.arguments import parse_args
from slime.utils.misc import load_function
from slime.utils.plugin_contracts import (
    DEFAULTS,
    ENV_ROLLOUT,
    ContractViolation,
    check_eval_rollout,
    check_rollout_function,
)
from slime.utils.types import Status

NUM_GPUS = 0

ITEMS = [("What is 2+3?", "5"), ("What is 6*7?", "42"), ("What is 10-4?", "6")]


@pytest.fixture
def rollout_fn():
    return load_function(os.environ.get(ENV_ROLLOUT) or DEFAULTS[ENV_ROLLOUT])


def _args(**overrides):
    args = parse_args([
        "--rollout-batch-size", "3", "--n-samples-per-prompt", "4", "--actor-num-gpus-per-node", "1",
        "--rm-type", "math", "--rollout-max-response-len", "64",
    ])
    for k, v in overrides.items():
        setattr(args, k, v)
    return args


def _source(args):
    return ListDataSource(items=list(ITEMS), n_samples_per_prompt=args.n_samples_per_prompt)


def test_training_rollout_returns_trainable_groups(rollout_fn):
    args = _args()
    groups = check_rollout_function(rollout_fn, args, _source(args))
    assert all(s.status in (Status.COMPLETED, Status.TRUNCATED, Status.ABORTED) for g in groups for s in g)


def test_consecutive_rollouts_consume_new_prompts(rollout_fn):
    args = _args(rollout_batch_size=1)
    source = _source(args)
    first = check_rollout_function(rollout_fn, args, source, rollout_id=0)
    second = check_rollout_function(rollout_fn, args, source, rollout_id=1)
    assert first[0][0].prompt != second[0][0].prompt


def test_evaluation_rollout(rollout_fn):
    args = _args()
    out = check_eval_rollout(rollout_fn, args, _source(args))
    assert all(len(v["rewards"]) > 0 for v in out.values())


def test_reference_rewards_follow_the_answers():
    # Greedy decoding of the reference model is always right; evaluation must see that.
    args = _args()
    fn = load_function(DEFAULTS[ENV_ROLLOUT])
    out = check_eval_rollout(fn, args, _source(args))
    assert out["eval"]["rewards"] == [1.0] * 12


# The contract must reject plugins that would break training.

def _wrong_group_size(args, rollout_id, data_source, evaluation=False):
    groups = load_function(DEFAULTS[ENV_ROLLOUT])(args, rollout_id, data_source, evaluation)
    return [g[:-1] for g in groups]


def _no_reward(args, rollout_id, data_source, evaluation=False):
    groups = load_function(DEFAULTS[ENV_ROLLOUT])(args, rollout_id, data_source, evaluation)
    groups[0][0].reward = None
    return groups


def _too_few_groups(args, rollout_id, data_source, evaluation=False):
    return load_function(DEFAULTS[ENV_ROLLOUT])(args, rollout_id, data_source, evaluation)[:1]


def _old_signature(args, data_source):
    return []


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (_wrong_group_size, "has 3 samples"),
        (_no_reward, "finite reward"),
        (_too_few_groups, "returned 1 groups"),
        (_old_signature, "cannot be called"),
    ],
)
def test_broken_plugins_are_rejected(bad, match):
    args = _args()
    with pytest.raises(ContractViolation, match=match):
        check_rollout_function(bad, args, _source(args))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
