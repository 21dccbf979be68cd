"""Rule-based reward models, behind one dispatcher: `grade(rm_type, response, label)`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

RM_TYPES = ("math", "dapo", "dapo_strict", "deepscaler", "gpqa", "f1", "arith")


def _grader(rm_type: str) -> Callable[[str, Any], float]:
    # Imported on demand: the math graders pull in sympy, which F1 users do not need.
    if rm_type == "math":
        from slime.rollout.rm_hub.math_utils import grade_math

        return grade_math
    if rm_type in ("dapo", "dapo_strict"):
        from slime.rollout.rm_hub.math_dapo import grade_dapo

        strict = rm_type == "dapo_strict"
        return lambda response, label: grade_dapo(response, label, strict=strict)
    if rm_type == "deepscaler":
        from slime.rollout.rm_hub.deepscaler import grade_deepscaler

        return grade_deepscaler
    if rm_type == "gpqa":
        from slime.rollout.rm_hub.gpqa import grade_gpqa

        return grade_gpqa
    if rm_type == "f1":
        from slime.rollout.rm_hub.f1 import grade_f1

        return grade_f1
    if rm_type == "arith":
        from slime.rollout.rm_hub.arith import grade_arith

        return grade_arith
    raise ValueError(f"unknown rm_type {rm_type!r}; pick one of {', '.join(RM_TYPES)}")


def grade(rm_type: str, response: str, label: Any) -> float:
    """The reward of `response` against `label` under the named rule."""
    if not isinstance(response, str):
        raise TypeError(f"response must be a string, got {type(response).__name__}")
    return float(_grader(rm_type)(response, label))
