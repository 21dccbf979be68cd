"""What a generated workflow looks like in the repository it runs in: names, runners, installs.

This repository's own workflow uses the defaults. A repository that adopted the toolkit
(`slime-ci adopt`) declares `WORKFLOW = {...}` in its registry (.slime-ci/suites.py) to keep
what its old CI had: the workflow and job names its required status checks use, its runner
labels and Python version, the variables and secrets its GPU jobs set, and a
`workflows --check` job instead of this repository's `lint` and `gpu_smoke`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from ci.errors import UsageError
from ci.registry.cadences import DEFAULT_SCHEDULES
from ci.registry.model import ALL_ENTRIES_LABEL, GPU_RUNNER_LABELS, ShardPolicy

NOX_VERSION = "2026.10.20"


@dataclass(frozen=True, kw_only=True)
class Style:
    """How the workflow of one repository is rendered."""

    title: str = "pr-test"  # the workflow's `name:` (required checks are "<title> / <job>")
    python: str = "3.11"
    hosted_runner: tuple[str, ...] = ("ubuntu-latest",)
    gpu_runner: tuple[str, ...] = GPU_RUNNER_LABELS
    job_ids: Mapping[str, str] = field(default_factory=dict)  # suite -> job id (default: its name)
    own_jobs: bool = True  # this repository's `lint` and `gpu_smoke` jobs
    check_job: str | None = None  # id of a job running the `workflows` session (--check)
    install: str = f"python -m pip install nox=={NOX_VERSION}"
    suite_env: Mapping[str, str] = field(default_factory=dict)  # every suite job's step
    gpu_env: Mapping[str, str] = field(default_factory=dict)  # GPU jobs' step (secrets, caches)
    source: str = "ci/registry/repo_suites.py and ci/github/job_plan.py"
    # The registry file the repository edits, named in every "fix it there" message; set
    # from the loaded registry (ci.registry.loader.Registry.style).
    registry: str = "ci/registry/repo_suites.py"
    # cron -> cadence of the scheduled runs (ci/registry/cadences.py); {} turns schedules off.
    schedules: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_SCHEDULES))
    # The weekly stability job: this suite in the infinite mode for at most these minutes.
    stability_suite: str | None = "megatron"
    stability_minutes: int = 240
    # Paths no GPU job can be affected by (globs; a trailing / is a directory).
    gpu_irrelevant: tuple[str, ...] = ("docs/", "*.md", "*.png", "*.jpg", "*.jpeg", "*.svg", "*.gif")
    comment_commands: bool = True  # the comment gateway and the one-file workflow
    # Set from the registry's SHARDING and SELECTION (ci.registry.loader.Registry.style), never
    # from WORKFLOW: the runner the shard counts are sized for, and the label with which a PR's
    # GPU jobs run every entry instead of those its diff reaches.
    sharding: ShardPolicy = field(default_factory=ShardPolicy)
    all_entries_label: str = ALL_ENTRIES_LABEL


# Style fields a registry declares elsewhere than in WORKFLOW.
_NOT_WORKFLOW = {"sharding": "SHARDING = ShardPolicy(...)",
                 "all_entries_label": "SELECTION = SelectionPolicy(all_entries_label=...)"}


def style_from(settings: Mapping[str, Any] | None) -> Style:
    """The Style a registry's `WORKFLOW` mapping declares; the defaults without one."""
    if not settings:
        return Style()
    elsewhere = sorted(set(settings) & set(_NOT_WORKFLOW))
    if elsewhere:
        raise UsageError(f"WORKFLOW in the registry: {elsewhere[0]} is not a workflow key; declare "
                         f"{_NOT_WORKFLOW[elsewhere[0]]} in the registry instead")
    known = {f.name for f in fields(Style)} - set(_NOT_WORKFLOW)
    unknown = sorted(set(settings) - known)
    if unknown:
        raise UsageError(f"WORKFLOW in the registry: unknown key(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(known))}")
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in settings.items()}
    return Style(**values)
