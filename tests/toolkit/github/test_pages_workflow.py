"""The HUD's two jobs in the committed workflow: `hud` builds the site on the monitor's crons
from main's code; `pages` deploys it holding only `pages: write` and `id-token: write`, with
no checkout and no secret. Each rule is also shown failing on a planted change."""

import copy
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from test_workflow_secrets import may_run_on_pull_request, pr_code_reason

from ci.github.pages_workflow import DEPLOY_PAGES, UPLOAD_PAGES, pages_jobs
from ci.registry.workflow_style import Style

NUM_GPUS = 0
WORKFLOW = REPO / ".github" / "workflows" / "pr-test.yml"
PINNED = re.compile(r"[\w./-]+@[0-9a-f]{40}")


def problems(wf: dict[str, Any]) -> list[str]:
    """What is wrong with the HUD's jobs of a parsed workflow."""
    jobs = wf["jobs"]
    out = []
    if "hud" not in jobs or "pages" not in jobs:
        return ["no hud or pages job"]
    deploy, build = jobs["pages"], jobs["hud"]
    if deploy.get("permissions") != {"pages": "write", "id-token": "write"}:
        out.append(f"pages holds {deploy.get('permissions')}")
    if any("checkout" in str(s.get("uses", "")) or "run" in s for s in deploy["steps"]):
        out.append("pages checks out or runs something")
    if "secrets." in str(deploy):
        out.append("pages reads a secret")
    if deploy.get("needs") != "hud":
        out.append("pages does not wait for hud")
    if build.get("permissions") != {"contents": "read"}:
        out.append(f"hud holds {build.get('permissions')}")
    if may_run_on_pull_request(build) or may_run_on_pull_request(deploy):
        out.append("a pull request can start them")
    checkout = build["steps"][0]
    if not checkout["uses"].startswith("actions/checkout@") or checkout["with"].get("persist-credentials") is not False:
        out.append("hud's checkout leaves a credential on disk")
    if pr_code_reason({"pull_request", "push", "schedule"}, build) is not None:
        out.append("hud checks out a pull request's code")
    for job in (build, deploy):
        for step in job["steps"]:
            if "uses" in step and not PINNED.fullmatch(step["uses"]):
                out.append(f"{step['uses']} is not pinned to a full commit")
    return out


def test_the_committed_pages_jobs_hold_only_what_they_need():
    wf = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    assert problems(wf) == []
    build = wf["jobs"]["hud"]
    assert build["environment"]["name"] == "ci-history"
    assert [s.get("uses", s.get("run", "")).split("@")[0] for s in build["steps"]][-2:] == [
        "nox -s hud -- --out site", UPLOAD_PAGES[0]]
    assert wf["jobs"]["pages"]["steps"][0]["uses"] == f"{DEPLOY_PAGES[0]}@{DEPLOY_PAGES[1]}"
    # On the monitor's cron, as the monitor is.
    assert build["if"] == wf["jobs"]["monitor"]["if"] == wf["jobs"]["pages"]["if"]


@pytest.mark.parametrize(("change", "found"), [
    (lambda wf: wf["jobs"]["pages"]["permissions"].update({"contents": "read"}), "pages holds"),
    (lambda wf: wf["jobs"]["pages"]["steps"].insert(0, {"uses": "actions/checkout@v5"}),
     "pages checks out or runs something"),
    (lambda wf: wf["jobs"]["hud"].update({"if": "always()"}), "a pull request can start them"),
    (lambda wf: wf["jobs"]["hud"]["steps"][0]["with"].update({"persist-credentials": True}),
     "leaves a credential on disk"),
    (lambda wf: wf["jobs"]["hud"]["steps"][0]["with"].update({"ref": "${{ github.head_ref }}"}),
     "hud checks out a pull request's code"),
    (lambda wf: wf["jobs"]["hud"]["steps"][-1].update({"uses": "actions/upload-pages-artifact@v4"}),
     "is not pinned to a full commit"),
])
def test_a_planted_change_to_the_pages_jobs_is_found(change, found):
    wf = copy.deepcopy(yaml.safe_load(WORKFLOW.read_text(encoding="utf-8")))
    change(wf)
    assert any(found in p for p in problems(wf)), problems(wf)


def test_no_monitor_no_pages_and_an_adopter_gets_none():
    assert pages_jobs([], Style()) == {}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
