"""Contract of a custom generate function (`--custom-generate-function-path`).

Default: the reference implementation. Yours:
`SLIME_PLUGIN_GENERATE=pkg.mod:generate python tests/plugin_contracts/test_generate_contract.py`.
"""

import argparse
import os
import sys

import pytest

from slime.rollout.reference import ListDataSource, encode, generate, generate_rollout
from slime.utils.misc import load_function
from slime.utils.plugin_contracts import DEFAULTS, ENV_GENERATE, ContractViolation, check_generate_function
from slime.utils.types import Sample, Status

NUM_GPUS = 0


@pytest.fixture
def generate_fn():
    return load_function(os.environ.get(ENV_GENERATE) or DEFAULTS[ENV_GENERATE])


def _args():
    return argparse.Namespace(rollout_temperature=1.0, rm_type="math", rollout_batch_size=2,
                              n_samples_per_prompt=2, rollout_max_response_len=64)


def _sample(prompt="What is 3*4?"):
    return Sample(group_index=0, index=0, prompt=prompt, tokens=encode(prompt), label="12")


def test_generates_a_consistent_sample(generate_fn):
    (s,) = check_generate_function(generate_fn, _args(), _sample(), {"temperature": 0.0, "max_new_tokens": 64})
    assert s.response_length > 0


def test_respects_max_new_tokens(generate_fn):
    (s,) = check_generate_function(generate_fn, _args(), _sample(), {"temperature": 0.0, "max_new_tokens": 4})
    assert s.response_length <= 4
    assert s.status in (Status.TRUNCATED, Status.COMPLETED)


def test_chat_prompts(generate_fn):
    msgs = [{"role": "user", "content": "What is 1+1?"}]
    sample = Sample(prompt=msgs, tokens=encode("What is 1+1?"))
    check_generate_function(generate_fn, _args(), sample, {"temperature": 0.0, "max_new_tokens": 64})


def test_reference_truncation_and_answer():
    (s,) = check_generate_function(generate, _args(), _sample(), {"temperature": 0.0, "max_new_tokens": 5})
    assert s.status is Status.TRUNCATED
    (s,) = check_generate_function(generate, _args(), _sample(), {"temperature": 0.0, "max_new_tokens": 64})
    assert s.status is Status.COMPLETED
    assert r"\boxed{12}" in s.response


def test_rollout_uses_the_configured_generate_function():
    args = _args()
    args.custom_generate_function_path = "slime.rollout.reference:generate"
    groups = generate_rollout(args, 0, ListDataSource(items=[("What is 1+2?", "3")], n_samples_per_prompt=2))
    assert len(groups) == 2 and all(s.response for g in groups for s in g)


def _not_async(args, sample, sampling_params):
    return sample


async def _forgets_status(args, sample, sampling_params):
    sample.tokens = [*sample.tokens, 1, 2]
    sample.response_length = 2
    return sample


async def _drops_prompt(args, sample, sampling_params):
    sample.tokens = [1, 2, 3]
    sample.response_length = 3
    sample.status = Status.COMPLETED
    return sample


async def _miscounts(args, sample, sampling_params):
    sample.tokens = [*sample.tokens, 1, 2, 3]
    sample.response_length = 2
    sample.status = Status.COMPLETED
    return sample


async def _too_long(args, sample, sampling_params):
    sample.tokens = [*sample.tokens, *range(10)]
    sample.response_length = 10
    sample.status = Status.COMPLETED
    return sample


async def _positive_log_probs(args, sample, sampling_params):
    sample.tokens = [*sample.tokens, 1]
    sample.response_length = 1
    sample.rollout_log_probs = [0.5]
    sample.status = Status.COMPLETED
    return sample


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (_not_async, "async def"),
        (_forgets_status, "status pending"),
        (_drops_prompt, "start with the prompt"),
        (_miscounts, "response_length 2 but 3"),
        (_too_long, "max_new_tokens is 4"),
        (_positive_log_probs, "<= 0"),
    ],
)
def test_broken_generate_functions_are_rejected(bad, match):
    with pytest.raises(ContractViolation, match=match):
        check_generate_function(bad, _args(), _sample(), {"max_new_tokens": 4})


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
