"""What the comment gateway does for one PR comment: react, reply, label, dispatch. Pure.

`python -m ci plan --event issue_comment` prints `comment_plan(...)` as JSON; the gateway
workflow acts on exactly that and nothing else. A file named by `/rerun-test` is resolved
through the registry here (its suite, NUM_GPUS, test args, image) on the default branch's
code, before the dispatched workflow checks out any PR code.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ci.github.comment_commands import (
    USAGE,
    Allowed,
    Context,
    Ignored,
    Policy,
    Refused,
    allowed_commands,
    authorise,
)
from ci.registry.model import Suite
from ci.select.discover import TestFile
from ci.select.entries import suite_entries

RUN_FILE_WORKFLOW = "run-ci-file.yml"
BISECT_WORKFLOW = "bisect.yml"  # ci/github/bisect_workflow.py renders it
# Why `/run-ci` dispatches as well as labels: GitHub starts no workflow run for an event the
# workflow's own GITHUB_TOKEN caused (its guard against loops), so the label alone would run
# nothing now. The label stays for the record and for the PR's later pushes, which run the
# labelled job as usual. (An App token would make the label start the run itself, at the cost
# of a private key in the repository's secrets; docs/workflow.md, comment commands.)
LABEL_STARTS_NOTHING = ("a label added with the workflow's GITHUB_TOKEN starts no workflow run, "
                        "so the suite is dispatched now; the label runs it again on later pushes")


@dataclass(frozen=True, kw_only=True)
class Resolved:
    """A registered test file as the dispatched workflow will run it."""

    path: str
    suite: str
    tier: str
    num_gpus: int | None
    test_args: tuple[tuple[str, ...], ...]  # one per entry of the file in that suite
    image: str | None

    @property
    def command(self) -> str:
        return f"nox -s {self.suite} -- --only {self.path}"


def registered(suites: Sequence[Suite], files: Mapping[str, TestFile]) -> dict[str, Resolved]:
    """Every registered test file -> its first suite in registry order (diff-driven suites have none)."""
    out: dict[str, Resolved] = {}
    for suite in suites:
        entries = suite_entries(suite, files)
        for path in dict.fromkeys(e.path for e in entries):
            if path in out:
                continue
            tf = files.get(path)
            out[path] = Resolved(path=path, suite=suite.name, tier=suite.tier,
                                 num_gpus=tf.num_gpus if tf else None,
                                 test_args=tuple(e.test_args for e in entries if e.path == path),
                                 image=suite.image)
    return out


def _label_suite(suites: Sequence[Suite], label: str) -> Suite:
    return next(s for s in suites if s.label == label)


def _dispatch(pr: int | None, sha: str | None, suite: str, only: str) -> dict[str, Any]:
    # workflow_dispatch inputs are strings; the dispatched workflow checks each again.
    return {"workflow": RUN_FILE_WORKFLOW,
            "inputs": {"pr": None if pr is None else str(pr), "sha": sha, "suite": suite, "only": only}}


def comment_plan(body: str, ctx: Context, policy: Policy | None, *, suites: Sequence[Suite],
                 files: Mapping[str, TestFile], pr: int | None = None,
                 sha: str | None = None) -> dict[str, Any]:
    """The gateway's whole answer to one comment, as JSON-ready data, with what each job does."""
    plan = _verdict_plan(body, ctx, policy, suites=suites, files=files, pr=pr, sha=sha)
    return {**plan, "actions": actions(plan)}


def _verdict_plan(body: str, ctx: Context, policy: Policy | None, *, suites: Sequence[Suite],
                  files: Mapping[str, TestFile], pr: int | None, sha: str | None) -> dict[str, Any]:
    files_map = registered(suites, files)
    labels = [s.label for s in suites if s.label]
    verdict = authorise(body, ctx, policy, registered={p: r.suite for p, r in files_map.items()},
                        labels=labels)
    out: dict[str, Any] = {"event": "issue_comment", "actor": ctx.actor,
                           "association": ctx.association, "fork": ctx.from_fork,
                           "pr": pr, "sha": sha, "add_label": None, "dispatch": None,
                           "rerun_failed": False}
    if isinstance(verdict, Ignored):
        return {**out, "verdict": "ignored", "why": verdict.why, "reaction": None, "reply": None}
    if isinstance(verdict, Refused):
        return {**out, "verdict": "refused", "why": verdict.why, "reaction": "confused",
                "reply": f"Not run: {verdict.why}."}
    assert isinstance(verdict, Allowed)
    command = verdict.command
    out.update(verdict="allowed", command=f"/{command.name}", why=verdict.why, reaction="rocket")
    if command.name == "help":
        mine = allowed_commands(ctx, policy)
        lines = [USAGE[c] for c in mine] or ["(none)"]
        return {**out, "reaction": "eyes",
                "reply": "Commands you may use here:\n" + "\n".join(f"- `{x}`" for x in lines)}
    if command.name == "rerun-failed":
        return {**out, "rerun_failed": True,
                "reply": f"Re-running the failed jobs of the latest run on {sha or 'the head commit'}."}
    if command.name == "run-ci":
        suite = _label_suite(suites, command.arg or "")
        dispatch = _dispatch(pr, sha, suite.name, "")
        return {**out, "add_label": suite.label, "dispatch": dispatch, "suite": suite.name,
                "command_line": f"nox -s {suite.name}", "why_dispatch": LABEL_STARTS_NOTHING,
                "reply": f"Label {suite.label} added; running `nox -s {suite.name}` on "
                         f"{sha or 'the head commit'} now (later pushes run it through the label)."}
    resolved = files_map[command.arg or ""]
    if command.name == "bisect":
        # main's code and history, never the PR's: the range is the monitor's streak of the file.
        inputs = {"suite": resolved.suite, "tier": resolved.tier, "entry": resolved.path,
                  "trigger": "comment"}
        return {**out, "dispatch": {"workflow": BISECT_WORKFLOW, "inputs": inputs}, "suite": resolved.suite,
                "tier": resolved.tier, "command_line": f"python -m ci bisect --suite {resolved.suite} "
                                                        f"--entry {resolved.path} --from-monitor",
                "reply": f"Bisecting `{resolved.path}` on the default branch over the range of its "
                         "failure streak; the answer goes to the history and the run's summary."}
    dispatch = _dispatch(pr, sha, resolved.suite, resolved.path)
    return {**out, "dispatch": dispatch, "suite": resolved.suite, "tier": resolved.tier,
            "num_gpus": resolved.num_gpus, "image": resolved.image,
            "test_args": [list(a) for a in resolved.test_args], "command_line": resolved.command,
            "reply": f"Running `{resolved.command}` on {sha or 'the head commit'} "
                     f"({resolved.num_gpus} GPU(s), {len(resolved.test_args)} entr"
                     f"{'y' if len(resolved.test_args) == 1 else 'ies'})."}


def actions(plan: Mapping[str, Any]) -> list[dict[str, str]]:
    """What each job of the gateway workflow does for this plan, in order (ci.github.gateway_workflow)."""
    out = []
    if plan.get("add_label"):
        out.append({"job": "label", "does": f"add label {plan['add_label']} (pull-requests: write)"})
    if plan.get("rerun_failed"):
        out.append({"job": "run", "does": "re-run the failed jobs of the PR's latest run (actions: write)"})
    if plan.get("dispatch"):
        out.append({"job": "run", "does": f"dispatch {plan['dispatch']['workflow']}: "
                                          f"{plan.get('command_line')} on {plan.get('sha') or 'the PR head'} "
                                          "(actions: write)"})
    if plan.get("reaction"):
        out.append({"job": "answer", "does": f"react {plan['reaction']}"
                                             f"{' and reply' if plan.get('reply') else ''} (issues: write)"})
    return out


def render_comment_plan(plan: Mapping[str, Any]) -> str:
    """The one-screen text `plan --event issue_comment` prints without --json."""
    who = f"{plan['actor']} ({plan['association']}{', fork PR' if plan['fork'] else ''})"
    lines = [f"event: issue_comment by {who}", f"verdict: {plan['verdict']}: {plan['why']}"]
    if plan.get("command_line"):
        lines.append(f"runs: {plan['command_line']} on {plan['sha'] or 'the PR head'}")
    if plan.get("add_label"):
        lines.append(f"adds label: {plan['add_label']} ({plan.get('why_dispatch')})")
    if plan.get("rerun_failed"):
        lines.append("re-runs: the failed jobs of the PR's latest run")
    if plan.get("reply"):
        lines.append("reply: " + plan["reply"].replace("\n", "\n  "))
    lines += [f"job {a['job']}: {a['does']}" for a in plan.get("actions", [])]
    return "\n".join(lines)
