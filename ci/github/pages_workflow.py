"""The HUD on GitHub Pages: two jobs of the scheduled monitor's cadence in the main workflow.

`hud` builds the site (`nox -s hud -- --out site`) from the shared store and uploads it as
the Pages artifact: it runs on the monitor's crons only, so it checks out the default
branch's code, never a pull request's, and it is the only one of the two that reads the
store's secret (through the `ci-history` environment, as the monitor does). `pages` deploys
that artifact and holds nothing else: `pages: write` and `id-token: write` (deploy-pages
proves who it is with an OIDC token), no checkout, no secret.
"""

from __future__ import annotations

from collections.abc import Sequence

from ci.github import job_builder as build
from ci.github.job_plan import WORKFLOW_NAME, Job, condition_lines
from ci.github.yaml_writer import Folded, Node, Note, _expr, _uses
from ci.history.store import HISTORY_ENV, HISTORY_ENVIRONMENT, HISTORY_SECRET
from ci.registry.model import MONITOR_SESSION
from ci.registry.workflow_style import Style

HUD_JOB = "hud"
PAGES_JOB = "pages"
HUD_SESSION = "hud"
SITE_DIR = "site"
HUD_MINUTES = 15
HUD_PURPOSE = "The HUD: the run history as a static site, deployed to GitHub Pages (docs/history.md)"
# Pinned as every action here is (ci/github/yaml_writer.py): the full commit of the tag.
UPLOAD_PAGES = ("actions/upload-pages-artifact", "7b1f4a764d45c48632c6b24a0339c27f5614fb0b", "v4.0.0")
DEPLOY_PAGES = ("actions/deploy-pages", "d6db90164ac5ed86f2b6aed7e0febac5b3c0c03e", "v4.0.5")


def _build(monitor: Job, style: Style) -> dict[str, Node]:
    return build.job(
        HUD_JOB, condition=Folded(tuple(condition_lines(monitor))), runs_on=build.hosted(style),
        permissions=build.reads_repository(), environment=build.secret_environment(HISTORY_ENVIRONMENT),
        concurrency=build.concurrency(
            Folded((f"{WORKFLOW_NAME}-run{_expr('github.run_id')}-{HUD_JOB}",)), True),
        minutes=Note(HUD_MINUTES, "a build from 100,000 attempts takes seconds"),
        steps=[
            *build.prepare(style, build.checkout()),
            {"name": f"nox -s {HUD_SESSION}", "env": {HISTORY_ENV: _expr(f"secrets.{HISTORY_SECRET}")},
             "run": f"nox -s {HUD_SESSION} -- --out {SITE_DIR}"},
            {"name": "Upload the site as the Pages artifact", "uses": _uses(UPLOAD_PAGES),
             "with": {"path": SITE_DIR}},
        ])


def _deploy(monitor: Job, style: Style) -> dict[str, Node]:
    return build.job(
        PAGES_JOB, needs=Note(HUD_JOB, "the site it built"),
        condition=Folded(tuple(condition_lines(monitor))), runs_on=build.hosted(style),
        permissions=build.grant(pages=("write", "deploy the site"),
                          id_token=("write", "deploy-pages proves its identity with an OIDC token")),
        environment={"name": "github-pages", "url": _expr("steps.deployment.outputs.page_url")},
        concurrency=build.concurrency(f"{WORKFLOW_NAME}-{PAGES_JOB}",
                                Note(False, "a deployment is never cut off halfway")),
        minutes=10,
        steps=[{"name": "Deploy to GitHub Pages", "id": "deployment", "uses": _uses(DEPLOY_PAGES)}])


def pages_jobs(jobs: Sequence[Job], style: Style) -> dict[str, Node]:
    """The two jobs, on this repository's monitor cadence; none without a monitor job."""
    monitor = next((j for j in jobs if j.id == MONITOR_SESSION), None)
    if monitor is None or not style.own_jobs:
        return {}
    return {HUD_JOB: _build(monitor, style), PAGES_JOB: _deploy(monitor, style)}


def readme_rows(jobs: Sequence[Job], style: Style) -> list[tuple[str, str, str]]:
    """The README's session table row of the HUD's build, when the workflow has it."""
    return [(HUD_SESSION, "monitor schedule", HUD_PURPOSE)] if pages_jobs(jobs, style) else []
