"""Multiple-choice reward (GPQA): find the choice letter a response commits to."""

from __future__ import annotations

import re

from slime.rollout.rm_hub.math_utils import last_boxed

DEFAULT_CHOICES = "ABCD"

# Phrasings, most explicit first; within one, the last occurrence wins (models restate).
_PATTERNS = (
    r"answer\s*(?:is|:)\s*(?:option|choice)?\s*[:\-]?\s*[\*\(\[]*\s*([A-Z])\b",
    r"(?:option|choice)\s*[\*\(\[]*\s*([A-Z])\b[\)\]\*]*\s*(?:is\s+(?:correct|right))",
    r"answer\s*[\*\(\[]*\s*([A-Z])\s*[\)\]\*]*\s*(?:is\s+(?:correct|right))",
)


def _letter(value: str, choices: str) -> str | None:
    value = re.sub(r"\\text\{([^{}]*)\}", r"\1", value).strip().strip("*().[] ")
    return value if len(value) == 1 and value in choices else None


def extract_choice(response: str, choices: str = DEFAULT_CHOICES) -> str | None:
    """The choice letter the response gives (`\\boxed{C}`, `Answer: C`, `The answer is (C)`, ...)."""
    boxed = last_boxed(response)
    if boxed is not None:
        letter = _letter(boxed, choices)
        if letter is not None:
            return letter
    for pattern in _PATTERNS:
        hits = [h for h in re.findall(pattern, response, flags=re.IGNORECASE) if h.upper() in choices]
        # The letter itself must be upper case: "answer is a" is prose, not a choice.
        hits = [h for h in hits if h in choices]
        if hits:
            return str(hits[-1])
    # A bare letter on the last line: "(C)", "C.", "**C**".
    lines = [line for line in response.strip().splitlines() if line.strip()]
    if lines:
        last = re.fullmatch(r"[\s\*\(\[]*([A-Z])[\s\*\)\]\.:]*", lines[-1])
        if last and last.group(1) in choices:
            return last.group(1)
    return None


def normalize_label(label: str | int, choices: str = DEFAULT_CHOICES) -> str:
    """A label as its letter: `2` → `C`, `"(c)"` → `C`, `"C) Paris"` → `C`."""
    if isinstance(label, int):
        if not 0 <= label < len(choices):
            raise ValueError(f"choice index {label} is outside 0..{len(choices) - 1}")
        return choices[label]
    match = re.match(r"\s*\(?([A-Za-z])\b", label)
    if not match or match.group(1).upper() not in choices:
        raise ValueError(f"label {label!r} names none of the choices {choices}")
    return match.group(1).upper()


def grade_gpqa(response: str, label: str | int, *, choices: str = DEFAULT_CHOICES) -> float:
    """1.0 when the response's choice letter is the label's, else 0.0."""
    return 1.0 if extract_choice(response, choices) == normalize_label(label, choices) else 0.0
