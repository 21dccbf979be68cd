"""DAPO-style math reward: the answer sits on an `Answer:` line; +1 when right, -1 otherwise.

Strict mode reads only the last non-empty line, and it must be the `Answer:`
line (the format the prompt asks for); lenient mode takes the last `Answer:`
anywhere, then falls back to the last `\\boxed{}`.
"""

from __future__ import annotations

import re

from slime.rollout.rm_hub.math_utils import answers_match, last_boxed

_ANSWER_LINE = re.compile(r"(?i)^\W*answer\W*:\s*(.+?)\s*$")
_ANSWER_ANYWHERE = re.compile(r"(?i)answer\s*\**\s*:\s*([^\n]+)")
# Only the tail of a long response is read: the answer comes last.
TAIL_CHARS = 300


def extract_answer(response: str, *, strict: bool) -> str | None:
    """The answer a DAPO-format response gives, or None."""
    tail = response[-TAIL_CHARS:]
    if strict:
        lines = [line for line in tail.splitlines() if line.strip()]
        if not lines:
            return None
        match = _ANSWER_LINE.match(lines[-1])
        return _clean(match.group(1)) if match else None
    found = _ANSWER_ANYWHERE.findall(tail)
    if found:
        return _clean(found[-1])
    return last_boxed(tail)


def _clean(answer: str) -> str:
    answer = answer.strip().strip("*").strip()
    boxed = last_boxed(answer)
    return boxed if boxed is not None else answer


def grade_dapo(response: str, label: str, *, strict: bool = False, timeout: float = 5.0) -> float:
    """1.0 when the extracted answer matches `label`, else -1.0 (DAPO's reward scale)."""
    answer = extract_answer(response, strict=strict)
    return 1.0 if answers_match(answer, label, timeout=timeout) else -1.0
