"""The one builder of the generated workflows' files, jobs and common steps.

pr-test.yml (ci/github/workflow.py, pages_workflow.py), ci-comment.yml and run-ci-file.yml
(gateway_workflow.py), bisect.yml and history-ingest.yml are all made of these pieces: the
file's header (no permission at the workflow's level: each job names its own), a job's keys
in one order, its runner, permissions with their reasons, the environment that holds a secret,
and the steps every job starts with (a checkout that keeps no token, the pinned Python, the
install). A pinned action, a permission's reason or the header changes here, in one place.
"""

from __future__ import annotations

from collections.abc import Sequence

from ci.github.yaml_writer import (
    CHECKOUT,
    SETUP_PYTHON,
    Flow,
    Node,
    Note,
    _banner,
    _uses,
    to_yaml,
)
from ci.registry.workflow_style import Style

READS_REPOSITORY = "actions/checkout reads the repository"
NO_DEPLOYMENT = "its secret, without a deployment record"
SELF_HOSTED_IGNORE = "zizmor: ignore[self-hosted-runner]"


def workflow_file(
    name: str, on: Node, jobs: dict[str, Node], *, run_name: str | None = None
) -> dict[str, Node]:
    """A workflow's tree: no permission at its level (every job grants its own), then its jobs."""
    return {
        "name": name,
        **({"run-name": run_name} if run_name is not None else {}),
        "on": on,
        "permissions": {},
        "jobs": jobs,
    }


def render_file(flow: dict[str, Node], style: Style) -> str:
    """The workflow's text: the generated-file banner, a blank line between jobs and steps."""
    return to_yaml(flow, spaced=2, header=_banner(style.source))


def job(
    name: str,
    *,
    runs_on: Node,
    permissions: dict[str, Node],
    concurrency: dict[str, Node],
    minutes: Node,
    steps: Sequence[Node],
    needs: Node | None = None,
    condition: Node | None = None,
    environment: dict[str, Node] | None = None,
    outputs: dict[str, Node] | None = None,
    env: dict[str, Node] | None = None,
) -> dict[str, Node]:
    """A job's keys in the order every generated job lists them; the optional ones only when set."""
    out: dict[str, Node] = {"name": name}
    if needs is not None:
        out["needs"] = needs
    if condition is not None:
        out["if"] = condition
    out["runs-on"] = runs_on
    out["permissions"] = permissions
    if environment is not None:
        out["environment"] = environment
    out["concurrency"] = concurrency
    out["timeout-minutes"] = minutes
    if outputs is not None:
        out["outputs"] = outputs
    if env is not None:
        out["env"] = env
    out["steps"] = list(steps)
    return out


def concurrency(group: Node, cancel: Node) -> dict[str, Node]:
    """A job's concurrency group, and whether a newer run cancels it."""
    return {"group": group, "cancel-in-progress": cancel}


def runs_on(labels: Sequence[str], why: str = "") -> Node:
    """The runner labels: one hosted label as a plain value, several as a list; a self-hosted
    runner with the reason zizmor's self-hosted-runner finding does not apply (`why`)."""
    if "self-hosted" in labels:
        return Note(Flow(tuple(labels)), f"{SELF_HOSTED_IGNORE} {why}")
    return labels[0] if len(labels) == 1 else Flow(tuple(labels))


def hosted(style: Style) -> Node:
    """The hosted runner of the style, for jobs that run no suite on a GPU."""
    return runs_on(style.hosted_runner)


def grant(**scopes: tuple[str, str]) -> dict[str, Node]:
    """A job's permissions, each with its reason: `grant(pull_requests=("write", "why"))`."""
    return {scope.replace("_", "-"): Note(level, why) for scope, (level, why) in scopes.items()}


def reads_repository(why: str = READS_REPOSITORY) -> dict[str, Node]:
    """`contents: read`, the permission of every job that checks out."""
    return grant(contents=("read", why))


def secret_environment(name: str, why: str = NO_DEPLOYMENT) -> dict[str, Node]:
    """The environment holding a secret the job reads, without a deployment record."""
    return {"name": name, "deployment": Note(False, why)}


def checkout(name: str = "Check out", /, *, ref: Node | None = None, **options: Node) -> dict[str, Node]:
    """The checkout step, never keeping the job's token in .git/config; `options` are the
    action's other inputs (`fetch_depth=` for `fetch-depth`)."""
    given: dict[str, Node] = {} if ref is None else {"ref": ref}
    given["persist-credentials"] = False
    given.update({key.replace("_", "-"): value for key, value in options.items()})
    return {"name": name, "uses": _uses(CHECKOUT), "with": given}


def setup_python(style: Style) -> dict[str, Node]:
    """The style's pinned Python."""
    return {"name": "Set up Python", "uses": _uses(SETUP_PYTHON), "with": {"python-version": style.python}}


def install(style: Style, name: str = "Install nox") -> dict[str, Node]:
    """The style's install command (nox for this repository; an adopter's names the toolkit)."""
    return {"name": name, "run": style.install}


def prepare(style: Style, checked_out: dict[str, Node], installs: str = "Install nox") -> list[Node]:
    """The steps a job starts with: its checkout, Python, the install."""
    return [checked_out, setup_python(style), install(style, installs)]
