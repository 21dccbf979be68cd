"""Did training raise the reward? The policy before and after, on the same prompts and seeds.

A learning check that compares the reward of the first rollouts with that of the last ones
compares different prompts sampled with different random numbers: on the tiny task one
rollout's mean moves by ±0.08 from prompt mix and sampling alone, as much as thirty steps of
learning, and which way a run drifts depends on float rounding (the vector kernels torch
picks for the CPU). Here the policy before the first step and the policy after the last one
answer the *same* prompts with the *same* sampling seeds (common random numbers): wherever
the two policies agree, so do their samples, and the difference of the means measures the
change of the policy, not the luck of the draw. `stderr` is the standard error of the
per-prompt differences, so a check can tell a gain from noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from slime.rollout.generate import RolloutSpec, generate_groups
from slime.rollout.source import Prompt

# Sampling seeds of the paired evaluation come from this rollout id: none of a run's rollouts
# (ids >= 0) or evaluations (ids -1 - rollout id) use it, and both evaluations use it alike.
PAIRED_ROLLOUT_ID = -1_000_000


def prompt_rewards(clients: Sequence[Any], tokenizer: Any, prompts: Sequence[Prompt],
                   spec: RolloutSpec) -> list[float]:
    """Mean reward of each prompt's `spec.n_samples_per_prompt` samples, seeded by PAIRED_ROLLOUT_ID."""
    groups, _ = generate_groups(clients, tokenizer, prompts, spec, rollout_id=PAIRED_ROLLOUT_ID)
    return [sum(float(s.reward) for s in g) / len(g) for g in groups]  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class PairedGain:
    """Mean reward before and after, over the same prompts and seeds, and the change's error."""

    before: float
    after: float
    gain: float
    stderr: float  # of the mean per-prompt difference
    prompts: int
    samples_per_prompt: int

    @classmethod
    def of(cls, before: Sequence[float], after: Sequence[float], samples_per_prompt: int) -> PairedGain:
        """Summarise per-prompt mean rewards measured before and after training."""
        if len(before) != len(after) or len(before) < 2:
            raise ValueError("paired rewards need the same prompts, at least two: "
                             f"{len(before)} vs {len(after)}")
        diffs = [a - b for a, b in zip(after, before, strict=True)]
        n = len(diffs)
        mean = sum(diffs) / n
        var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
        return cls(before=sum(before) / n, after=sum(after) / n, gain=mean, stderr=math.sqrt(var / n),
                   prompts=n, samples_per_prompt=samples_per_prompt)

    def as_dict(self) -> dict[str, float]:
        """Flat metrics, `paired/*`."""
        return {"paired/before": self.before, "paired/after": self.after, "paired/gain": self.gain,
                "paired/stderr": self.stderr, "paired/prompts": float(self.prompts),
                "paired/samples_per_prompt": float(self.samples_per_prompt)}
