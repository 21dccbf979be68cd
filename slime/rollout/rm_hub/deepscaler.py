"""DeepScaler reward: the response must close its reasoning (`</think>`) and box a correct answer."""

from __future__ import annotations

from collections.abc import Sequence

from slime.rollout.rm_hub.math_utils import answers_match, last_boxed

THINK_END = "</think>"


def grade_deepscaler(
    response: str, label: str | Sequence[str], *, timeout: float = 5.0
) -> float:
    """1.0 for a well-formed, correct response; 0.0 for bad format or a wrong answer."""
    if THINK_END not in response:
        return 0.0
    # Only what follows the reasoning counts: a box inside <think> is a draft.
    answer = last_boxed(response.rsplit(THINK_END, 1)[1])
    if answer is None:
        return 0.0
    labels = [label] if isinstance(label, str) else list(label)
    for ref in labels:
        boxed = last_boxed(ref)
        if answers_match(answer, boxed if boxed is not None else ref, timeout=timeout):
            return 1.0
    return 0.0
