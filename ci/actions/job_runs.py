"""One job of one workflow run, as act ran or skipped it: the row every answer is made of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

JobStatus = Literal["ran", "skipped"]


@dataclass(frozen=True, kw_only=True)
class JobRun:
    """One job of one workflow, as act ran (or skipped) it."""

    workflow: str
    job: str
    status: JobStatus
    result: str  # success, failure, skipped (its `if:` was false), not started (GitHub's filters)
    why: str = ""  # the `if:` that skipped it, or what the harness did
    commands: tuple[str, ...] = ()
    env: tuple[Mapping[str, str], ...] = ()  # the environment each recorded command saw
    seconds: float = 0.0
    real: bool = False  # its nox sessions ran for real (--real, --real-jobs), not the recording nox
