"""The plan and the runner agree: the jobs act ran are the jobs `python -m ci plan` says run.

One source (the job table), checked two ways: `python -m ci plan` applies the rules in Python,
act evaluates the `if:` expressions the generator rendered from them. For every event the plan
answers, the pr-test jobs that ran under act must be exactly those the plan runs, each with the
plan's `nox -s <session>` commands.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ci.actions.events import EventSpec
from ci.actions.job_runs import JobRun
from ci.errors import UsageError
from ci.github.job_plan import WORKFLOW_NAME
from ci.github.pages_workflow import HUD_JOB, HUD_SESSION, PAGES_JOB, SITE_DIR
from ci.registry.model import MONITOR_SESSION

WORKFLOW_FILE = f"{WORKFLOW_NAME}.yml"
# Jobs of pr-test.yml that are not rows of the job table: the plan itself and the verdict.
NOT_PLANNED = ("plan", "verdict")
_WIRING = ("history", "verdict")  # sessions every job also calls: not the job's own session
# Jobs the generator derives from a row of the table: the HUD's build and its deployment run
# on the monitor's cadence, exactly when the monitor's job does (ci/github/pages_workflow.py).
DERIVED = {HUD_JOB: (MONITOR_SESSION, [f"nox -s {HUD_SESSION} -- --out {SITE_DIR}"]),
           PAGES_JOB: (MONITOR_SESSION, [])}


def plan_argv(python: str, spec: EventSpec, clone: Path, changed: Path | None) -> list[str] | None:
    """`python -m ci plan` for the same event, or None where the plan does not answer it (pure)."""
    argv = [python, "-m", "ci", "plan", "--json", "--root", str(clone), "--event"]
    if spec.name == "pull_request":
        argv += ["pull_request", "--labels", ",".join(spec.labels)]
        argv += ["--added", spec.added] if spec.added else ["--action", spec.action or "synchronize"]
        argv += ["--fork"] if spec.fork else []
        argv += ["--paths-from", str(changed)] if changed is not None else []
        return argv
    if spec.name == "schedule":
        return [*argv, "schedule", "--cron", str(spec.cron)]
    if spec.name in ("push", "workflow_dispatch"):
        return [*argv, spec.name]
    return None


def planned(argv: Sequence[str], cwd: Path) -> dict[str, list[str]]:
    """{job: commands} of the jobs the plan runs."""
    done = subprocess.run(list(argv), capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        raise UsageError(f"python -m ci plan refused the event: {done.stderr.strip()[:300]}")
    return with_derived({row["job"]: row["commands"] for row in json.loads(done.stdout) if row["runs"]})


def with_derived(plan: dict[str, list[str]]) -> dict[str, list[str]]:
    """The plan's jobs and the jobs derived from them (pure)."""
    return {**plan, **{job: list(cmds) for job, (source, cmds) in DERIVED.items() if source in plan}}


def disagreements(jobs: Sequence[JobRun], plan: dict[str, list[str]]) -> list[str]:
    """Where act and the plan differ, one line each; empty when they agree (pure)."""
    ran = {j.job: j for j in jobs if j.workflow == WORKFLOW_FILE and j.status == "ran"
           and j.job not in NOT_PLANNED}
    out = [f"{job}: act ran it, the plan does not" for job in sorted(set(ran) - set(plan))]
    out += [f"{job}: the plan runs it, act did not" for job in sorted(set(plan) - set(ran))]
    for job in sorted(set(ran) & set(plan)):
        own = [c for c in ran[job].commands if c.startswith("nox -s ")
               and c.split()[2] not in _WIRING]
        # A matrix's legs (a sharded suite) finish in any order: compare what ran, not when.
        if sorted(own) != sorted(plan[job]):
            out.append(f"{job}: act ran {own}, the plan says {plan[job]}")
    return out
