"""Exact-answer reward of the tiny arithmetic task (`slime.model.arith_data`)."""

from __future__ import annotations

from typing import Any


def grade_arith(response: str, label: Any) -> float:
    """1.0 when the response text is exactly the label (e.g. "7" for "3+4="), else 0.0."""
    return 1.0 if response == str(label) else 0.0
