"""What act does not do, done or checked here: `on:` filters, empty matrices, ignored keys.

act runs every workflow whose `on:` names the event, whatever its `types`, `branches`, `paths`
or the cron of a schedule; it never chains `workflow_run`; it runs one job for an empty matrix
where GitHub runs none; and it ignores `concurrency`, `permissions`, `environment` and a job's
`timeout-minutes`. The functions below are pure over the parsed workflows: which workflows an
event starts on GitHub, and what the ignored keys say, so the table can show both.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci.errors import UsageError

IGNORED_KEYS = ("concurrency", "permissions", "environment", "timeout-minutes")
_SECRET = re.compile(r"secrets\.([A-Za-z_][A-Za-z0-9_]*)")


@dataclass(frozen=True, kw_only=True)
class Workflow:
    """One workflow file, parsed."""

    file: str  # the file name under .github/workflows
    name: str
    doc: Mapping[Any, Any]  # YAML keys: an unquoted `on` parses as True

    @property
    def on(self) -> Mapping[str, Any]:
        raw = self.doc.get("on", self.doc.get(True, {}))  # an unquoted `on` parses as True
        if isinstance(raw, str):
            return {raw: None}
        if isinstance(raw, list):
            return {x: None for x in raw}
        return raw if isinstance(raw, dict) else {}

    @property
    def jobs(self) -> Mapping[str, Mapping[str, Any]]:
        jobs = self.doc.get("jobs")
        return jobs if isinstance(jobs, dict) else {}


@dataclass(frozen=True, kw_only=True)
class Trigger:
    """An event as GitHub's `on:` filters read it."""

    event: str
    action: str | None = None  # types:
    branch: str | None = None  # branches: (a PR's base, a push's branch)
    cron: str | None = None
    workflow: str | None = None  # workflow_run: the finished run's workflow name


def load(root: Path) -> list[Workflow]:
    """Every workflow under .github/workflows, in file order."""
    import yaml

    folder = root / ".github" / "workflows"
    files = sorted(folder.glob("*.yml")) if folder.is_dir() else []
    if not files:
        raise UsageError(f"{folder}: no workflows; run `python -m ci workflows` first")
    out = []
    for path in files:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        out.append(Workflow(file=path.name, name=str(doc.get("name", path.stem)), doc=doc))
    return out


def _listed(spec: Any, key: str) -> list[str] | None:
    if not isinstance(spec, dict) or key not in spec:
        return None
    value = spec[key]
    return [str(x) for x in (value if isinstance(value, list) else [value])]


def starts(workflow: Workflow, trigger: Trigger) -> tuple[bool, str]:
    """Whether GitHub starts `workflow` for `trigger`, and the filter that decided (pure)."""
    on = workflow.on
    if trigger.event not in on:
        return False, f"`on:` has no {trigger.event}"
    spec = on[trigger.event]
    if trigger.event == "schedule":
        crons = [str(x.get("cron")) for x in spec or [] if isinstance(x, dict)]
        if trigger.cron not in crons:
            return False, f"no `schedule: cron: {trigger.cron}`"
        return True, f"cron {trigger.cron} listed"
    types = _listed(spec, "types")
    if types is not None and trigger.action is not None and trigger.action not in types:
        return False, f"types {types} lack {trigger.action}"
    branches = _listed(spec, "branches")
    if branches is not None and trigger.branch is not None and trigger.branch not in branches:
        return False, f"branches {branches} lack {trigger.branch}"
    names = _listed(spec, "workflows")
    if names is not None and trigger.workflow not in names:
        return False, f"workflows {names} lack {trigger.workflow!r}"
    shown = [f"types {types}" if types else "", f"branches {branches}" if branches else "",
             f"workflows {names}" if names else ""]
    return True, "; ".join(x for x in shown if x) or "no filter"


def declares_matrix(job: Mapping[str, Any]) -> bool:
    strategy = job.get("strategy")
    return isinstance(strategy, dict) and "matrix" in strategy


def static_findings(workflow: Workflow) -> list[str]:
    """What is wrong in the keys act ignores (empty: nothing); GitHub would act on each (pure).

    A job must bound its time and name its permissions (the workflow grants none by default);
    a job that reads a secret must declare the environment holding it, since act hands every
    secret to every job while GitHub gives an environment's secrets only to jobs that name it.
    """
    out: list[str] = []
    top = workflow.doc.get("permissions")
    for job_id, job in workflow.jobs.items():
        where = f"{workflow.file} job {job_id}"
        minutes = job.get("timeout-minutes")
        if not isinstance(minutes, int) or minutes <= 0:
            out.append(f"{where}: no timeout-minutes (GitHub's default is 360)")
        if "permissions" not in job and top is None:
            out.append(f"{where}: no permissions (the token gets the repository's defaults)")
        if job.get("permissions") in ("write-all", "read-all"):
            out.append(f"{where}: permissions {job['permissions']}; name each scope it needs")
        used = sorted(set(_SECRET.findall(str(job))) - {"GITHUB_TOKEN"})
        environment = job.get("environment")
        if used and not environment:
            out.append(f"{where}: reads secrets {', '.join(used)} without an environment")
        concurrency = job.get("concurrency")
        if concurrency is not None and not (isinstance(concurrency, dict) and concurrency.get("group")):
            out.append(f"{where}: concurrency without a group")
    return out


def for_act(workflow: Workflow) -> dict[str, Any]:
    """The workflow as act is given it: `environment` dropped (act ignores it, and its schema
    rejects `deployment: false`, which GitHub accepts); everything else as written (pure)."""
    doc: dict[Any, Any] = dict(workflow.doc)
    doc["jobs"] = {k: {x: y for x, y in v.items() if x != "environment"} for k, v in workflow.jobs.items()}
    if True in doc:  # write `on` back under its name, not as the boolean
        doc["on"] = doc.pop(True)
    return doc
