"""Reference plugins: a rollout function, a generate function and a runtime hook.

They follow the same contracts as a user's plugins (`slime.utils.plugin_contracts`)
but need no inference engine: a character-level "model" answers arithmetic
prompts, sometimes wrongly when sampled hot, so groups carry mixed rewards.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import operator
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from slime.utils.types import Sample, Status

SamplingParams = dict[str, Any]
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
}


def encode(text: str) -> list[int]:
    """Character-level tokens (code points)."""
    return [ord(c) for c in text]


def decode(tokens: list[int]) -> str:
    """Inverse of `encode`."""
    return "".join(chr(t) for t in tokens)


def _evaluate(expr: str) -> int | None:
    def walk(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return int(_OPS[type(node.op)](walk(node.left), walk(node.right)))
        raise ValueError(expr)

    try:
        return walk(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError):
        return None


def _question(prompt: str | list[dict[str, Any]]) -> str:
    if isinstance(prompt, list):  # chat messages: the last user turn
        return str(prompt[-1]["content"])
    return prompt


async def generate(args: argparse.Namespace, sample: Sample, sampling_params: SamplingParams) -> Sample:
    """Answer `What is <expr>?` with `\\boxed{value}`; wrong with probability temperature / 4."""
    question = _question(sample.prompt)
    expr = question.removeprefix("What is").strip().rstrip("?")
    value = _evaluate(expr)
    # crc32, not hash(): str hashes change per process, rewards must not.
    rng = random.Random(zlib.crc32(repr((sample.group_index, sample.index, question)).encode()))
    temperature = float(sampling_params.get("temperature", 1.0))
    if value is not None and rng.random() < temperature / 4:
        value += rng.choice((-1, 1))
    text = f"The answer is \\boxed{{{value}}}." if value is not None else "I cannot tell."
    max_new = int(sampling_params.get("max_new_tokens", 64))
    response = encode(text)[:max_new]
    await asyncio.sleep(0)  # a real engine call yields here
    prompt_tokens = sample.tokens or encode(question)
    sample.tokens = [*prompt_tokens, *response]
    sample.response = decode(response)
    sample.response_length = len(response)
    sample.loss_mask = [1] * len(response)
    sample.rollout_log_probs = [-0.05 - 0.01 * (i % 7) for i in range(len(response))]
    sample.apply_finish_reason("length" if len(response) < len(text) else "stop")
    return sample


@dataclass
class ListDataSource:
    """Prompts with labels, handed out in order as groups of `n_samples_per_prompt` samples."""

    items: list[tuple[str, str]]
    n_samples_per_prompt: int
    cursor: int = 0
    _next_index: int = field(default=0, repr=False)

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """The next `num_groups` prompts (wrapping around), each repeated per sample."""
        groups = []
        for _ in range(num_groups):
            prompt, label = self.items[self.cursor % len(self.items)]
            group = []
            for _ in range(self.n_samples_per_prompt):
                group.append(
                    Sample(group_index=self.cursor, index=self._next_index, prompt=prompt,
                           tokens=encode(prompt), label=label)
                )
                self._next_index += 1
            groups.append(group)
            self.cursor += 1
        return groups


def _generate_fn(args: argparse.Namespace) -> Callable[..., Any]:
    path = getattr(args, "custom_generate_function_path", None)
    if path:
        from slime.utils.misc import load_function

        return load_function(path)
    return generate


async def _run_group(args: argparse.Namespace, group: list[Sample], params: SamplingParams) -> list[Sample]:
    from slime.rollout.rm_hub import grade

    fn = _generate_fn(args)
    done = await asyncio.gather(*(fn(args, s, dict(params)) for s in group))
    rm_type = getattr(args, "rm_type", None) or "math"
    for sample in done:
        if sample.status in (Status.COMPLETED, Status.TRUNCATED):
            sample.reward = grade(rm_type, sample.response, sample.label)
        else:
            sample.reward = 0.0
    return list(done)


def generate_rollout(
    args: argparse.Namespace, rollout_id: int, data_source: Any, evaluation: bool = False
) -> list[list[Sample]] | dict[str, dict[str, list[Any]]]:
    """One rollout: `args.rollout_batch_size` groups, generated, graded.

    With `evaluation`, returns `{"eval": {"rewards": [...], "truncated": [...]}}` instead.
    """
    params: SamplingParams = {
        "temperature": 0.0 if evaluation else args.rollout_temperature,
        "max_new_tokens": getattr(args, "rollout_max_response_len", 64),
    }
    groups = data_source.get_samples(args.rollout_batch_size)

    async def run_all() -> list[list[Sample]]:
        return list(await asyncio.gather(*(_run_group(args, g, params) for g in groups)))

    done = asyncio.run(run_all())
    if evaluation:
        flat = [s for g in done for s in g]
        return {
            "eval": {
                "rewards": [s.reward for s in flat],
                "truncated": [s.status == Status.TRUNCATED for s in flat],
            }
        }
    return done


def reward_stats_hook(
    args: argparse.Namespace, rollout_id: int, groups: list[list[Sample]]
) -> dict[str, float]:
    """Runtime hook run after each rollout: reward metrics, without touching the samples."""
    rewards = [float(s.reward) for g in groups for s in g if isinstance(s.reward, (int, float))]
    solved = sum(1 for g in groups if any(s.reward == 1.0 for s in g))
    return {
        "rollout/reward_mean": sum(rewards) / len(rewards) if rewards else 0.0,
        "rollout/groups_solved_frac": solved / len(groups) if groups else 0.0,
        "rollout/id": float(rollout_id),
    }
