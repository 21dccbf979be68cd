"""What a user's plugin must do to plug into training; each check raises `ContractViolation`.

Rollout function: `fn(args, rollout_id, data_source, evaluation=False)` → groups of
samples (or, for evaluation, `{name: {"rewards": [...], ...}}`).
Generate function: `async fn(args, sample, sampling_params)` → the sample (or samples),
tokens extended by the response.
Runtime hook: `fn(args, rollout_id, groups)` → None or `{metric: float}`; must not
change the batch's shape.
Plugin path: `pkg.mod:fn` and `pkg.mod.fn` name the same callable.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import inspect
import math
from collections.abc import Callable
from typing import Any

from slime.utils.data import RolloutDataError, validate_groups, validate_sample
from slime.utils.misc import load_function
from slime.utils.types import Sample, Status

# Environment variables that point the contract tests at a user's plugin.
ENV_ROLLOUT = "SLIME_PLUGIN_ROLLOUT"
ENV_GENERATE = "SLIME_PLUGIN_GENERATE"
ENV_RUNTIME_HOOK = "SLIME_PLUGIN_RUNTIME_HOOK"
ENV_PATH = "SLIME_PLUGIN_PATH"

DEFAULTS = {
    ENV_ROLLOUT: "slime.rollout.reference:generate_rollout",
    ENV_GENERATE: "slime.rollout.reference:generate",
    ENV_RUNTIME_HOOK: "slime.rollout.reference:reward_stats_hook",
    ENV_PATH: "slime.rollout.reference:generate_rollout",
}


class ContractViolation(AssertionError):
    """A plugin breaks its contract; the message says which clause."""


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ContractViolation(message)


def _binds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    try:
        inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as exc:
        raise ContractViolation(
            f"{fn.__qualname__} cannot be called as the framework calls it: {exc}"
        ) from None


def check_rollout_function(
    fn: Callable[..., Any], args: argparse.Namespace, data_source: Any, rollout_id: int = 0
) -> list[list[Sample]]:
    """Run a training rollout and check its output; returns it."""
    _binds(fn, args, rollout_id, data_source, evaluation=False)
    out = fn(args, rollout_id, data_source, evaluation=False)
    _require(isinstance(out, list), f"rollout must return a list of groups, got {type(out).__name__}")
    _require(
        len(out) == args.rollout_batch_size,
        f"rollout returned {len(out)} groups; --rollout-batch-size is {args.rollout_batch_size}",
    )
    for group in out:
        _require(isinstance(group, list) and all(isinstance(s, Sample) for s in group),
                 "each group must be a list of Sample")
    try:
        validate_groups(out, args.n_samples_per_prompt)
    except RolloutDataError as exc:
        raise ContractViolation(f"rollout output is not trainable: {exc}") from None
    for sample in (s for g in out for s in g):
        _require(
            isinstance(sample.reward, (int, float)) and math.isfinite(sample.reward),
            f"sample {sample.index} has reward {sample.reward!r}; every sample needs a finite reward",
        )
    return out  # type: ignore[no-any-return]


def check_eval_rollout(
    fn: Callable[..., Any], args: argparse.Namespace, data_source: Any, rollout_id: int = 0
) -> dict[str, dict[str, list[Any]]]:
    """Run an evaluation rollout: a dict of datasets, each with a `rewards` list."""
    out = fn(args, rollout_id, data_source, evaluation=True)
    _require(isinstance(out, dict) and bool(out), "evaluation must return {dataset: {'rewards': [...]}}")
    for name, result in out.items():
        _require(isinstance(result, dict) and isinstance(result.get("rewards"), list),
                 f"evaluation result {name!r} lacks a 'rewards' list")
        _require(all(isinstance(r, (int, float)) for r in result["rewards"]),
                 f"evaluation result {name!r} has non-numeric rewards")
    return out  # type: ignore[no-any-return]


def check_generate_function(
    fn: Callable[..., Any], args: argparse.Namespace, sample: Sample, sampling_params: dict[str, Any]
) -> list[Sample]:
    """Run a generate function on a copy of `sample` and check what it returns."""
    _require(inspect.iscoroutinefunction(fn), f"{fn.__qualname__} must be `async def`")
    _binds(fn, args, sample, sampling_params)
    prompt_tokens = list(sample.tokens)
    out = asyncio.run(fn(args, copy.deepcopy(sample), dict(sampling_params)))
    results = out if isinstance(out, list) else [out]
    _require(bool(results) and all(isinstance(s, Sample) for s in results),
             "generate must return a Sample or a non-empty list of Sample")
    limit = sampling_params.get("max_new_tokens")
    for s in results:
        _require(s.status in (Status.COMPLETED, Status.TRUNCATED, Status.ABORTED),
                 f"generate left status {s.status.value}; set it from the finish reason")
        _require(s.tokens[: len(prompt_tokens)] == prompt_tokens,
                 "sample.tokens must start with the prompt tokens")
        _require(len(s.tokens) - len(prompt_tokens) == s.response_length,
                 f"response_length {s.response_length} but {len(s.tokens) - len(prompt_tokens)} "
                 "tokens were appended")
        if limit is not None:
            _require(s.response_length <= limit,
                     f"response has {s.response_length} tokens; max_new_tokens is {limit}")
        try:
            validate_sample(s)
        except RolloutDataError as exc:
            raise ContractViolation(str(exc)) from None
        if s.rollout_log_probs is not None:
            _require(all(lp <= 0 for lp in s.rollout_log_probs), "log-probabilities must be <= 0")
    return results


def check_runtime_hook(
    fn: Callable[..., Any], args: argparse.Namespace, rollout_id: int, groups: list[list[Sample]]
) -> dict[str, float]:
    """Run a hook on a copy of `groups`; it may adjust rewards but not the batch's shape."""
    _binds(fn, args, rollout_id, groups)
    work = copy.deepcopy(groups)
    out = fn(args, rollout_id, work)
    _require(out is None or isinstance(out, dict), "a hook returns None or {metric: float}")
    metrics = dict(out or {})
    for key, value in metrics.items():
        _require(isinstance(key, str) and isinstance(value, (int, float)),
                 f"hook metric {key!r}: {value!r} is not a name and a number")
    shape = [[(len(s.tokens), s.response_length) for s in g] for g in groups]
    _require([[(len(s.tokens), s.response_length) for s in g] for g in work] == shape,
             "the hook changed the number or the lengths of samples")
    return {k: float(v) for k, v in metrics.items()}


def alternate_path(path: str) -> str:
    """The other spelling of a plugin path: `a.b:f` ↔ `a.b.f` (class methods keep the colon)."""
    if ":" in path:
        module, _, attrs = path.partition(":")
        return f"{module}.{attrs}"
    module, _, attr = path.rpartition(".")
    return f"{module}:{attr}"


def check_plugin_path(path: str) -> Callable[..., Any]:
    """Both spellings of `path` load, to the very same callable."""
    first = load_function(path)
    second = load_function(alternate_path(path))
    _require(first is second, f"{path!r} and {alternate_path(path)!r} load different objects")
    _require(load_function(path) is first, f"loading {path!r} twice gave two objects")
    return first
