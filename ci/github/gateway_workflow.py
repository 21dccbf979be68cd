"""The comment gateway and the one-file workflow, rendered from the registry.

Gateway (`ci-comment.yml`, on `issue_comment`): checks out the default branch only -- its
handler and its access policy, never the PR's code -- asks `plan --event issue_comment`
what to do with read-only permissions (and, only when the policy's teams could change the
verdict, the optional SLIME_CI_TEAMS_TOKEN of the `ci-comment` environment). Three jobs
then act on that decision without checking anything out, each with the one write
permission it needs: `label` (pull-requests), `run` (actions: dispatch, re-run) and
`answer` (issues: react, reply). A label added with the workflow token starts no workflow
(GitHub's rule against loops), so `/run-ci` also dispatches the suite itself.

One-file workflow (`run-ci-file.yml`, `workflow_dispatch` on the default branch): resolves
suite and file through the registry and checks that the PR's head is still the SHA it was
given and not a fork, all before any PR code is checked out; then runs the suite's session
on that SHA, on the suite's runner. That job runs PR code, so it holds no secret: a GPU run
exports its runs as an artifact for the ingest workflow (ci/github/ingest_workflow.py), which
reads the PR's number back from the run's name (`run-name`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ci.github import job_builder as build
from ci.github.comment_commands import COMMAND_PREFIX, POLICY_PATH
from ci.github.gateway import BISECT_WORKFLOW, RUN_FILE_WORKFLOW
from ci.github.ingest_workflow import restore_snapshot, upload_history
from ci.github.job_plan import WORKFLOW_NAME, Job
from ci.github.teams import TEAMS_SECRET
from ci.github.yaml_writer import Flow, Folded, Node, Note, Script, _expr
from ci.history.ingest import ARTIFACT_PREFIX, EXPORT_DIR
from ci.history.store import HISTORY_SESSION
from ci.registry.job_timeouts import LINT_MINUTES, LOCK_TIMEOUT_ENV, LOCK_WAIT_MINUTES
from ci.registry.model import CPU_TIER, GPU_TIER
from ci.registry.workflow_style import Style

GATEWAY_PATH = ".github/workflows/ci-comment.yml"
RUN_FILE_PATH = f".github/workflows/{RUN_FILE_WORKFLOW}"
DECISION = "$RUNNER_TEMP/decision.json"
ACT_MINUTES = 5  # a gh call or two


def _setup(style: Style, ref: str) -> list[Node]:
    checked_out = build.checkout("Check out the default branch (handler and policy, never PR code)", ref=ref)
    return build.prepare(style, checked_out, "Install the toolkit")


TEAMS_ENVIRONMENT = "ci-comment"
OUTPUT = "decision"
_DECISION = f"needs.decide.outputs.{OUTPUT}"


def _field(name: str) -> str:
    return f"fromJSON({_DECISION}).{name}"


def _no_checkout(style: Style, job_id: str, name: str, needs: Node, condition: Node,
                 permissions: dict[str, Node], steps: list[Node]) -> dict[str, Node]:
    # These jobs check out nothing and run no repository code: gh and jq on the decision.
    return build.job(
        name, needs=needs, condition=condition, runs_on=build.hosted(style), permissions=permissions,
        concurrency=build.concurrency(f"ci-comment-{_expr('github.event.comment.id')}-{job_id}", False),
        minutes=ACT_MINUTES, steps=steps)


def gateway(style: Style) -> dict[str, Node]:
    """The `issue_comment` workflow: decide (read-only), then label, run and answer apart."""
    decide = Script((
        'pr_json=$(gh api "repos/$REPO/pulls/$PR")',
        "sha=$(jq -r .head.sha <<<\"$pr_json\")",
        "head=$(jq -r .head.repo.full_name <<<\"$pr_json\")",
        'fork=--no-fork; [ "$head" = "$REPO" ] || fork=--fork',
        'python -m ci plan --event issue_comment --comment "$BODY" --actor "$ACTOR" \\',
        '  --association "$ASSOCIATION" "$fork" --pr "$PR" --sha "$sha" --team-org "$ORG" \\',
        '  --json > "' + DECISION + '"',
        'jq -r \'.verdict + ": " + .why\' "' + DECISION + '"',
        # One line (jq -c escapes newlines), so the output file cannot gain another key.
        f'echo "{OUTPUT}=$(jq -c . "{DECISION}")" >> "$GITHUB_OUTPUT"',
    ))
    label = Script(('gh api "repos/$REPO/issues/$PR/labels" \\',
                    '  -f "labels[]=$(jq -r .add_label <<<"$DECISION")"'))
    run = Script((
        "field() { jq -r \"$1 // empty\" <<<\"$DECISION\"; }",
        'if [ "$(field .rerun_failed)" = true ]; then',
        f'  run=$(gh run list --repo "$REPO" --workflow {WORKFLOW_NAME}.yml --commit "$(field .sha)" \\',
        "    --limit 1 --json databaseId --jq '.[0].databaseId')",
        '  gh run rerun "$run" --failed --repo "$REPO"',
        "fi",
        f'if [ "$(field .dispatch.workflow)" = {BISECT_WORKFLOW} ]; then',
        f'  gh workflow run {BISECT_WORKFLOW} --repo "$REPO" --ref "$DEFAULT_BRANCH" \\',
        '    -f suite="$(field .dispatch.inputs.suite)" -f tier="$(field .dispatch.inputs.tier)" \\',
        '    -f entry="$(field .dispatch.inputs.entry)" -f trigger=comment',
        'elif [ -n "$(field .dispatch.workflow)" ]; then',
        f'  gh workflow run {RUN_FILE_WORKFLOW} --repo "$REPO" --ref "$DEFAULT_BRANCH" \\',
        '    -f pr="$(field .dispatch.inputs.pr)" -f sha="$(field .dispatch.inputs.sha)" \\',
        '    -f suite="$(field .dispatch.inputs.suite)" -f only="$(field .dispatch.inputs.only)"',
        "fi",
    ))
    answer = Script((
        "field() { jq -r \"$1 // empty\" <<<\"$DECISION\"; }",
        'gh api "repos/$REPO/issues/comments/$COMMENT_ID/reactions" -f content="$(field .reaction)"',
        'reply=$(field .reply)',
        'if [ "$LABELLED" = failure ] || [ "$RAN" = failure ]; then',
        '  reply="$reply (but a gateway job failed: $RUN_URL)"',
        "fi",
        'if [ -n "$reply" ]; then gh api "repos/$REPO/issues/$PR/comments" -f body="$reply"; fi',
    ))
    env = {"GH_TOKEN": _expr("github.token"), "REPO": _expr("github.repository"),
           "PR": _expr("github.event.issue.number")}
    acting = {**env, "DECISION": _expr(_DECISION)}
    decide_job = build.job(
        "decide (read only)",
        condition=Folded(("github.event.issue.pull_request",
                          # The parser's own rule (ci.github.comment_commands.parse_comment).
                          f"&& startsWith(github.event.comment.body, '{COMMAND_PREFIX}')")),
        runs_on=build.hosted(style),
        permissions=build.grant(contents=("read", f"the default branch's handler and {POLICY_PATH}"),
                          pull_requests=("read", "the PR's head SHA and origin")),
        environment=build.secret_environment(TEAMS_ENVIRONMENT,
                                             f"its secret {TEAMS_SECRET}, without a deployment"),
        # One comment, one answer; comments never cancel each other.
        concurrency=build.concurrency(f"ci-comment-{_expr('github.event.comment.id')}", False),
        minutes=LINT_MINUTES,
        outputs={OUTPUT: _expr(f"steps.decide.outputs.{OUTPUT}")},
        steps=[
            *_setup(style, _expr("github.event.repository.default_branch")),
            {"name": "Authorise against the access policy (looks up teams only if it must)", "id": "decide",
             "env": {**env, "BODY": _expr("github.event.comment.body"),
                     "ACTOR": _expr("github.event.comment.user.login"),
                     "ASSOCIATION": _expr("github.event.comment.author_association"),
                     "ORG": _expr("github.repository_owner"),
                     # Optional; GITHUB_TOKEN cannot read team membership (ci/github/teams.py).
                     TEAMS_SECRET: _expr(f"secrets.{TEAMS_SECRET}")},
             "run": decide},
        ])
    jobs: dict[str, Node] = {
        "decide": decide_job,
        "label": _no_checkout(
            style, "label", "add the /run-ci label", "decide", _field("add_label"),
            build.grant(pull_requests=("write", "add the label: the only job that may")),
            [{"name": "Add the label", "env": acting, "run": label}]),
        "run": _no_checkout(
            style, "run", "dispatch or re-run", "decide",
            Folded((_field("dispatch"), f"|| {_field('rerun_failed')}")),
            build.grant(actions=("write", f"dispatch {RUN_FILE_WORKFLOW}, re-run failed jobs")),
            [{"name": "Dispatch the suite or file; re-run failed jobs",
              "env": {**acting, "DEFAULT_BRANCH": _expr("github.event.repository.default_branch")},
              "run": run}]),
        "answer": _no_checkout(
            style, "answer", "react and reply", Flow(("decide", "label", "run")),
            Folded(("always()", "&& needs.decide.result == 'success'", f"&& {_field('reaction')}")),
            build.grant(issues=("write", "react to the comment and reply on the PR")),
            [{"name": "React and reply", "env": {
                **acting, "COMMENT_ID": _expr("github.event.comment.id"),
                "LABELLED": _expr("needs.label.result"), "RAN": _expr("needs.run.result"),
                "RUN_URL": f"{_expr('github.server_url')}/{_expr('github.repository')}/actions/runs/"
                           f"{_expr('github.run_id')}"},
              "run": answer}]),
    }
    return build.workflow_file(f"{style.title} comment commands", {"issue_comment": Note(
        {"types": Flow(("created",))},
        "zizmor: ignore[dangerous-triggers] runs only the default branch's code; "
        "PR code runs in run-ci-file.yml after resolving")}, jobs)


def run_file(jobs: Sequence[Job], style: Style) -> dict[str, Node]:
    """The `workflow_dispatch` workflow that runs one suite (or one file of it) on a PR's SHA."""
    inputs = {"pr": ("pull request number", True), "sha": ("its exact head commit", True),
              "suite": ("registry suite", True), "only": ("one registered file of it (empty: all)", False)}
    resolve = Script((
        'pr_json=$(gh api "repos/$REPO/pulls/$PR")',
        '[ "$(jq -r .head.sha <<<"$pr_json")" = "$SHA" ] || '
        '{ echo "::error::PR $PR head is no longer $SHA"; exit 2; }',
        '[ "$(jq -r .head.repo.full_name <<<"$pr_json")" = "$REPO" ] || '
        '{ echo "::error::PR $PR comes from a fork"; exit 2; }',
        'python -m ci plan --event workflow_dispatch --suite "$SUITE" --only "$ONLY" --sha "$SHA" \\',
        '  --json > "$RUNNER_TEMP/resolved.json"',
        'echo "tier=$(jq -r .tier "$RUNNER_TEMP/resolved.json")" >> "$GITHUB_OUTPUT"',
    ))
    resolve_job = build.job(
        "resolve through the registry",
        runs_on=build.hosted(style),
        permissions=build.grant(contents=("read", "the default branch's registry"),
                          pull_requests=("read", "the PR's head SHA and origin")),
        concurrency=build.concurrency(f"run-ci-file-resolve-{_expr('github.run_id')}", False),
        minutes=LINT_MINUTES,
        outputs={"tier": _expr("steps.resolve.outputs.tier")},
        steps=[*_setup(style, _expr("github.event.repository.default_branch")),
               {"name": "Resolve suite and file; check the SHA is the PR's head", "id": "resolve",
                "env": {"GH_TOKEN": _expr("github.token"), "REPO": _expr("github.repository"),
                        "PR": _expr("inputs.pr"), "SHA": _expr("inputs.sha"),
                        "SUITE": _expr("inputs.suite"), "ONLY": _expr("inputs.only")},
                "run": resolve}])
    gpu = max((j.minutes for j in jobs if j.self_hosted and not j.scheduled_only), default=LINT_MINUTES)
    cpu = max((j.minutes for j in jobs if not j.self_hosted and j.kind == "suite"), default=LINT_MINUTES)
    out: dict[str, Node] = {"resolve": resolve_job}
    for tier, runner, minutes in ((CPU_TIER, style.hosted_runner, cpu), (GPU_TIER, style.gpu_runner, gpu)):
        # As in pr-test.yml, a GPU job records its run (also when it failed) in its own store and
        # exports it for the ingest workflow: no job that checks out a PR's commit holds a secret.
        gpu_job = tier == GPU_TIER
        env: dict[str, Node] = {"SUITE": _expr("inputs.suite"), "ONLY": _expr("inputs.only")}
        if gpu_job:
            env[LOCK_TIMEOUT_ENV] = str(LOCK_WAIT_MINUTES * 60)
            env.update(style.gpu_env)
        steps: list[Node] = [
            *build.prepare(style, build.checkout("Check out the PR's exact head commit",
                                                 ref=_expr("inputs.sha"))),
            *([restore_snapshot()] if gpu_job else []),
            {"name": "nox -s <suite> -- --only <file>", "env": env, "run": Script((
                'if [ -n "$ONLY" ]; then nox -s "$SUITE" -- --only "$ONLY"; else nox -s "$SUITE"; fi',))},
        ]
        if gpu_job:
            steps.append({"name": "Record the run in the history", "if": "always()",
                          "env": {"STATUS": _expr("job.status"), "SUITE": _expr("inputs.suite")},
                          "run": f'nox -s {HISTORY_SESSION} -- record --suite "$SUITE" --status "$STATUS"'
                                 f" --export {EXPORT_DIR}"})
            steps.append(upload_history(f"{ARTIFACT_PREFIX}run-ci-file-{tier}"))
        out[f"run_{tier}"] = build.job(
            f"{_expr('inputs.suite')} {_expr('inputs.only')} ({tier})",
            needs="resolve",
            condition=f"needs.resolve.outputs.tier == '{tier}'",
            runs_on=build.runs_on(runner, "resolve refused forks and any SHA but the PR's head"),
            permissions=build.reads_repository("actions/checkout reads the PR's commit"),
            concurrency=build.concurrency(f"run-ci-file-{_expr('inputs.pr')}-{_expr('inputs.suite')}-"
                                    f"{_expr('inputs.only')}", True),
            minutes=Note(minutes, "the longest job of this tier (ci/registry/job_timeouts.py)"),
            steps=steps)
    return build.workflow_file(
        run_file_name(style),
        {"workflow_dispatch": {"inputs": {
            name: {"description": text, "required": required, "type": "string"}
            for name, (text, required) in inputs.items()}}},
        out,
        # The ingest workflow reads the PR's number back from here (ci/history/ingest.py).
        run_name=f"{style.title} run {_expr('inputs.suite')} {_expr('inputs.only')} "
                 f"for PR #{_expr('inputs.pr')}")


def run_file_name(style: Style) -> str:
    """The one-file workflow's `name:` (the ingest workflow watches it by name)."""
    return f"{style.title} run one suite or file"


def comment_files(jobs: Sequence[Job], style: Style) -> dict[str, str]:
    """The two workflows, or nothing when the registry turns comment commands off."""
    if not style.comment_commands:
        return {}
    return {GATEWAY_PATH: build.render_file(gateway(style), style),
            RUN_FILE_PATH: build.render_file(run_file(jobs, style), style)}
