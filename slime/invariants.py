"""`--ci-test`: what must hold at every step of a training run, checked while it runs.

Each check raises `InvariantViolation` with one line naming the invariant and the numbers;
the entry point prints that line and exits with `EXIT_INVARIANT`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

# Distinct from every exit code of the CI toolkit (0-4, 124, 130) and from pytest's 5 ("no
# tests collected"), so a run's exit code alone tells a broken invariant from a CI refusal.
EXIT_INVARIANT = 6
# At step 0 the policy is the reference and the rollout's weights: any KL is a bug, not noise.
STEP0_KL_LIMIT = 1e-8


class InvariantViolation(RuntimeError):
    """A `--ci-test` invariant failed; the message is the one line to print."""


def _fail(name: str, detail: str) -> None:
    raise InvariantViolation(f"ci-test invariant '{name}' failed: {detail}")


def check_step0(m: Mapping[str, float]) -> None:
    """Before any update, the policy equals the old policy and the reference."""
    for key in ("train/ppo_kl_abs_max", "train/kl_loss_abs_max"):
        if not m[key] < STEP0_KL_LIMIT:
            _fail("step0-kl", f"{key} = {m[key]:.3e} at step 0, must be < {STEP0_KL_LIMIT:g}")


def check_sane(m: Mapping[str, float], step: int) -> None:
    """Log-probs finite and ≤ 0, entropy > 0."""
    if m["check/logprob_nonfinite"] > 0:
        _fail("finite-logprobs", f"{m['check/logprob_nonfinite']:.0f} non-finite log-probs at step {step}")
    if not m["check/logprob_max"] <= 0:
        _fail("logprob-le-0", f"largest log-prob {m['check/logprob_max']:.3e} > 0 at step {step}")
    if not m["train/entropy_min"] > 0:
        _fail("entropy-positive", f"smallest entropy {m['train/entropy_min']:.3e} at step {step}")
    for key in ("train/loss", "train/grad_norm"):
        if not math.isfinite(m[key]):
            _fail("finite-loss", f"{key} = {m[key]} at step {step}")


def check_on_policy(m: Mapping[str, float], step: int, *, logprob_tol: float, ratio_band: float) -> None:
    """The engine's log-probs are the trainer's (same weights), so importance ratios are 1."""
    diff = m["check/logprob_abs_diff_max"]
    if not diff <= logprob_tol:
        _fail("rollout-logprobs-match",
              f"max |rollout - trainer| log-prob {diff:.3e} > tolerance {logprob_tol:g} at step {step}")
    low, high = m["check/is_ratio_min"], m["check/is_ratio_max"]
    if not (1 - ratio_band <= low and high <= 1 + ratio_band):
        _fail("importance-ratio-band",
              f"importance ratio in [{low:.6f}, {high:.6f}], outside 1 ± {ratio_band:g} at step {step}")


def check_engine_versions(versions: Mapping[str, str], expected: int, step: int) -> None:
    """After a refit every engine serves the trainer's weight version."""
    wrong = {url: v for url, v in versions.items() if v != str(expected)}
    if wrong or not versions:
        _fail("engine-weight-version",
              f"after refit at step {step} the trainer is at version {expected}, "
              f"engines report {wrong or versions}")


def check_frozen_engines(states: Sequence[Mapping[str, Any]], digests: Mapping[str, Any], step: int) -> None:
    """A frozen engine (reference, teacher) serves the weights it started with, at version 0."""
    for state in states:
        if state.get("update_weights", True):
            continue
        name = state.get("name")
        start = digests.get(str(name))
        if str(state.get("weight_version")) != "0":
            _fail("frozen-engine", f"step {step}: frozen engine {name} reports weight version "
                  f"{state.get('weight_version')}; it must never be refit")
        if start is not None and state.get("weights_digest") not in (None, start):
            _fail("frozen-engine", f"step {step}: frozen engine {name}'s weights changed "
                  f"(digest {str(state.get('weights_digest'))[:12]}, started as {str(start)[:12]})")


def check_lag(lag: int, expected: int, step: int) -> None:
    """Off-policy distance of a step's rollout, in weight versions."""
    if lag != expected:
        _fail("off-policy-lag", f"step {step} trained on a rollout {lag} versions old, expected {expected}")
