"""Render `.github/` from the job table (`ci.github.job_plan`), and check the committed files match.

The workflow holds no test lists and no logic beyond "which session, on which
runner, when": every job checks out, installs nox and runs `nox -s <session>`,
the command a developer runs locally. YAML is written here as text, not by a
library, so that the output is byte-stable and can carry comments (action
versions beside their pinned SHAs, the reason beside an inline zizmor ignore).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.args import Parser, existing_dir
from ci.durations import DURATIONS_FILE
from ci.errors import UsageError
from ci.github import job_builder as build
from ci.github.bisect_workflow import BISECT_PATH, bisect_name, bisect_workflow, dispatch_step, has_bisect
from ci.github.gateway import BISECT_WORKFLOW
from ci.github.ingest_workflow import (
    DOWNLOADED,
    fetch_exports,
    ingest_files,
    restore_snapshot,
    upload_history,
)
from ci.github.job_plan import (
    BASE_BRANCH,
    NARROW_BASE,
    PLAN_JOB,
    PLAN_OUTPUT,
    SHARDS_OUTPUT,
    VERDICT_JOB,
    WORKFLOW_NAME,
    Job,
    condition_lines,
    gated_by_plan,
    needs_plan,
    pr_terms,
    shard_matrix,
    table,
)
from ci.github.pages_workflow import pages_jobs, readme_rows
from ci.github.yaml_writer import (  # the writer lives apart so ci/github/gateway_workflow.py can share it
    CACHE_RESTORE,
    CACHE_SAVE,
    COMMAND,
    MARKER,
    UPLOAD_ARTIFACT,
    Flow,
    Folded,
    Node,
    Note,
    Script,
    _banner,
    _expr,
    _uses,
    to_yaml,
)
from ci.history.ingest import ARTIFACT_PREFIX, EXPORT_DIR
from ci.history.store import HISTORY_ENV, HISTORY_ENVIRONMENT, HISTORY_FILE, HISTORY_SECRET, HISTORY_SESSION
from ci.registry.job_timeouts import LOCK_TIMEOUT_ENV, LOCK_WAIT_MINUTES, SETUP_MINUTES
from ci.registry.loader import REGISTRY, REGISTRY_PATHS, Registry, load_registry, registry_path
from ci.registry.model import VERDICT_PURPOSE
from ci.registry.u_files import generated as u_generated
from ci.registry.workflow_style import NOX_VERSION, Style

WORKFLOW_PATH = f".github/workflows/{WORKFLOW_NAME}.yml"
ACTIONLINT_PATH = ".github/actionlint.yaml"

DURATIONS_KEY = "slime-ci-durations"
PYTHON_VERSION = Style().python
__all__ = ["NOX_VERSION", "PYTHON_VERSION"]  # the pins the workflow tests read from here
# Hosted runners resolve the pinned torch to its CPU wheel from this index (see pyproject).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


# --- the workflow -----------------------------------------------------------------------------

# Concurrency design.
#
# The original put one concurrency group per PR on the whole workflow with
# cancel-in-progress, and ran on `labeled`: adding any label, even an unrelated
# one, started a new run that cancelled the GPU jobs already running. Here:
#
# * No workflow-level group. Each job has its own group, `pr-test-<slot>-<job>`
#   (plus `-<shard>` in a matrix), with cancel-in-progress.
# * The slot is `pr<number>` only when the event is a pull_request AND the
#   job's own `if:` holds for it; otherwise it is `run<run_id>`, a group no
#   other run shares. So an event that skips a job can never cancel that job
#   in another run, whether or not Actions evaluates `if:` before concurrency.
# * A new commit (`synchronize`, also `opened`/`reopened`) runs every job whose
#   label is on the PR, in the PR's slots: the old commit's jobs are cancelled.
# * A `labeled` event runs only the job(s) of the label just added (the `if:`
#   checks `github.event.label.name`), so an unrelated label cancels nothing and
#   starts nothing, and CPU jobs are not re-run for a commit they already tested.
#   Re-adding a job's own label restarts that job: the way to re-run it. (A PR
#   opened with labels already set gets `opened` and then `labeled` events, so
#   its labelled jobs restart once, early; Actions gives no way to tell apart.)
# * push to main and workflow_dispatch always use `run<run_id>`: every commit on
#   main is tested in full (that is how two PRs that pass alone but break main
#   together are caught), and a manual run never cancels another.
def concurrency_group(job: Job) -> Folded:
    """The job's concurrency group expression (see the design above)."""
    if job.scheduled_only:  # never a PR's job: always a group of its own run
        return Folded((f"{WORKFLOW_NAME}-run{_expr('github.run_id')}-{job.id}",))
    first, *rest = pr_terms(job)
    tail = "-" + _expr("matrix.shard") if job.matrix else ""
    return Folded((
        f"{WORKFLOW_NAME}-${{{{ {first}",
        *(f"&& {t}" for t in rest),
        "&& format('pr{0}', github.event.pull_request.number)",
        f"|| format('run{{0}}', github.run_id) }}}}-{job.id}{tail}",
    ))


# Measured durations and the run history.
#
# `--shard I/K` and the longest-first order read .ci-cache/durations.json and the run history
# (.ci-cache/history.sqlite), but a hosted runner starts empty. Each job restores the files its
# own job last saved on main (the newest cache under the job's key prefix; the primary key never
# exists, so the prefix always decides), and a run on main saves them again under a key of its
# own (cache entries are immutable). Only a push to main saves: pull requests read main's cache
# and can never write one that main or another PR would read. Failed runs save too: what they
# measured is still true.
#
# A sharded job keeps one cache per shard (each shard runs other entries), and every shard
# restores all K of them and merges them (`history merge`) before it plans: all shards then
# plan from the same history, so they agree on the partition, and none keeps only its own.
#
# Every suite job's last step (`if: always()`) is `history record`: it writes runs the session
# spooled, and records the job even when its session never got to (an install failed, the job
# timed out or was cancelled).
#
# The shared store (SLIME_CI_HISTORY_URL, a secret of the `ci-history` environment) is held by
# no job that runs a pull request's code, and by no job on a self-hosted runner (a PR's job there
# is root on the host, docs/security.md). Suite and smoke jobs, GPU and CPU alike, record in
# their own SQLite file and export their runs (`record --export`) as an artifact,
# `history-<job>`; the ingest workflow
# (ci/github/ingest_workflow.py: `workflow_run`, the default branch's code only) validates it and
# records it in the shared store, trusted only for a push, schedule or manual run of the default
# branch. After such a run it saves the store's trusted runs in the Actions cache, and suite jobs
# restore that snapshot as their history file (their baselines, no credential). The only job in
# this file that names the environment is the scheduled monitor (a check with `history_store`,
# on a hosted runner, never on a PR), and only its session step gets the secret.
# `deployment: false`: the environment's secrets without a deployment record.
CACHED_FILES = f"{DURATIONS_FILE}\n{HISTORY_FILE}\n"
SHARDS_DIR = ".ci-cache/shards"


def durations_prefix(job: Job) -> str:
    """The cache-key prefix of a job's durations (the trailing '-' keeps cpu_unit off cpu_unit_x)."""
    return f"{DURATIONS_KEY}-{job.id}-"


def _shard_files(shard: str) -> str:
    folder = f"{SHARDS_DIR}/{shard}"
    return "".join(f"{folder}/{Path(f).name}\n" for f in (DURATIONS_FILE, HISTORY_FILE))


def _restore_durations(job: Job) -> list[Node]:
    # A planned count may differ from the committed one this renders (`shards_matrix`), but
    # caches are saved only by pushes to main, whose shards are the committed ones: every shard
    # of a PR restores all of main's, the same files, and so plans the same partition.
    if not job.matrix:
        return [{"name": "Restore measured durations and history (last run on main)",
                 "uses": _uses(CACHE_RESTORE),
                 "with": {"path": CACHED_FILES,
                          "key": durations_prefix(job) + _expr("github.run_id"),
                          "restore-keys": durations_prefix(job)}}]
    return [{"name": f"Restore shard {i}'s durations and history (last run on main)",
             "uses": _uses(CACHE_RESTORE),
             "with": {"path": _shard_files(str(i)),
                      "key": f"{durations_prefix(job)}{i}-" + _expr("github.run_id"),
                      "restore-keys": f"{durations_prefix(job)}{i}-"}}
            for i in range(1, job.shards + 1)]


def _save_durations(job: Job) -> dict[str, Node]:
    sharded = job.matrix
    shard = _expr("matrix.shard") + "-" if sharded else ""
    # Inside `if:` a `${{ }}` would turn the whole condition into a string, always true:
    # the shard's folder is formatted by the expression itself.
    saved = (f"format('{SHARDS_DIR}/{{0}}/{Path(DURATIONS_FILE).name}', matrix.shard)" if sharded
             else f"'{DURATIONS_FILE}'")
    return {"name": "Save measured durations and history", "if": Folded((
                "!cancelled()",
                "&& github.event_name == 'push'",
                f"&& github.ref == 'refs/heads/{BASE_BRANCH}'",
                f"&& hashFiles({saved}) != ''")),
            "uses": _uses(CACHE_SAVE),
            "with": {"path": _shard_files(_expr("matrix.shard")) if sharded else CACHED_FILES,
                     "key": durations_prefix(job) + shard
                     + _expr("github.run_id") + "-" + _expr("github.run_attempt")}}


def records_durations(job: Job) -> bool:
    """Jobs that run suites (every job but the checks) keep durations."""
    return job.kind != "check" and not job.infinite


def records_history(job: Job, style: Style) -> bool:
    """Jobs whose last step records the run: every suite job (this repository's noxfile and an
    adopter's, through ci.adopt.sessions, both have the history session)."""
    return job.kind != "check"


def uses_shared_history(job: Job) -> bool:
    """Jobs that open the shared store: the scheduled monitor only (never on a PR's code)."""
    return job.history_store and job.scheduled_only and not job.self_hosted


def exports_history(job: Job) -> bool:
    """Jobs that hand their runs to the ingest job as an artifact: every suite and smoke job, on
    GPU runners and hosted ones alike, so a red CPU job gets a verdict per failed entry."""
    return job.kind != "check"


def history_artifact(job: Job) -> str:
    """The artifact a suite job exports its runs in (one per shard); the ingest job reads `history-*`."""
    return f"{ARTIFACT_PREFIX}{job.id}" + ("-" + _expr("matrix.shard") if job.matrix else "")


def _history_env(job: Job) -> dict[str, Node]:
    if not uses_shared_history(job):
        return {}
    return {HISTORY_ENV: _expr(f"secrets.{HISTORY_SECRET}")}


def _environment(job: Job | None = None) -> dict[str, Node]:
    return build.secret_environment(HISTORY_ENVIRONMENT)


def _upload_report(job: Job) -> dict[str, Node]:
    return {"name": f"Upload {job.report}", "if": "always()", "uses": _uses(UPLOAD_ARTIFACT),
            "with": {"name": f"{job.id}-report", "path": job.report,
                     "if-no-files-found": Note("ignore", "the session said in one line why it wrote none")}}


def _merge_shards(job: Job) -> dict[str, Node]:
    return {"name": "Merge the shards' histories and durations",
            "run": f"nox -s {HISTORY_SESSION} -- merge {SHARDS_DIR}"}


def _record(job: Job) -> dict[str, Node]:
    env: dict[str, Node] = {"STATUS": _expr("job.status"), **_history_env(job)}
    run = f'nox -s {HISTORY_SESSION} -- record --suite {job.session} --status "$STATUS"'
    if job.matrix:
        env["SHARD"] = _expr("matrix.shard")
        run += f' --keep-in "{SHARDS_DIR}/$SHARD"'
    if exports_history(job):
        run += f" --export {EXPORT_DIR}"
    return {"name": "Record the run in the history", "if": "always()", "env": env, "run": run}


# A PR's GPU job runs the entries its diff reaches: what each entry executed (the restored
# snapshot of main's runs) against `git diff HEAD^1 HEAD`, the checkout being the merge commit
# whose first parent is the base tip. The all-entries label, a push, the schedule and dispatch
# run every entry (the plan's `Job.narrowed`). The expression is the event's, never the PR's code.


def narrow_condition(style: Style) -> str:
    """True on a pull_request event whose labels lack the all-entries label."""
    return (f"github.event_name == 'pull_request' && !contains(github.event.pull_request.labels.*.name, "
            f"'{style.all_entries_label}')")


def narrowed_run(job: Job) -> str:
    """The job's command, with `--by-executed` when NARROW (the step's env) is true."""
    return (f'if [ "$NARROW" = true ]; then {job.command()} -- --by-executed {NARROW_BASE}; '
            f"else {job.command()}; fi")


def _steps(job: Job, style: Style) -> list[Node]:
    narrows = job.narrows and not job.infinite and not job.matrix
    whole = ("the leak audit replays the commits a bisect blamed" if job.writes_issues
             else "the session diffs against origin/main")
    depth: dict[str, Node] = ({"fetch_depth": Note(0, whole)} if job.full_history else
                              {"fetch_depth": Note(2, "a PR's merge commit and the base tip: its diff")}
                              if narrows else {})
    steps: list[Node] = build.prepare(style, build.checkout(**depth))
    if records_durations(job):
        steps += _restore_durations(job)
    if exports_history(job):  # the trusted baseline, over whatever the job's own cache held
        steps.append(restore_snapshot())
    if records_durations(job) and job.matrix and records_history(job, style):
        steps.append(_merge_shards(job))
    env: dict[str, Node] = {}
    if records_durations(job):
        env.update(style.suite_env)
    if job.history_store:
        env.update(_history_env(job))
    if job.writes_issues:
        env["GITHUB_TOKEN"] = _expr("github.token")
    if job.self_hosted:
        # The dispatch input reaches the tests only through this variable; on a PR it is "0".
        env["SLIME_TEST_ENABLE_INFINITE_RUN"] = ("1" if job.infinite else
                                                 _expr("inputs.infinite_run && '1' || '0'"))
        # The lock wait stays well inside the job's timeout-minutes (ci/registry/job_timeouts.py).
        env[LOCK_TIMEOUT_ENV] = str(LOCK_WAIT_MINUTES * 60)
        # No secrets here: a GPU host that reports to W&B sets WANDB_API_KEY in its
        # runners' environment (runners/README.md), so the workflow grants none. An adopting
        # repository whose old CI passed a secret keeps it (Style.gpu_env).
        env.update(style.gpu_env)
    if job.matrix:
        # Values reach the shell through the environment, never through ${{ }} in `run:`. K is
        # the leg's own `of`, the count the plan job may have set (`shards_matrix`).
        env["SHARD"] = _expr("matrix.shard")
        env["SHARDS"] = _expr("matrix.of")
        run = f'nox -s {job.session} -- --shard "$SHARD/$SHARDS"'
    elif job.infinite:
        # Repeat until a failure, for a bounded time: reaching the bound (timeout's 124) means
        # no failure in that time, a pass; SIGINT lets the session stop its entries cleanly.
        bound = job.minutes - SETUP_MINUTES
        run = (f"timeout --signal=INT --kill-after=5m {bound}m {job.command()} || {{ rc=$?; "
               f'if [ "$rc" -eq 124 ]; then echo "no failure in {bound} minutes"; '
               'else exit "$rc"; fi; }')
    elif narrows:
        env["NARROW"] = _expr(narrow_condition(style))
        run = narrowed_run(job)
    else:
        run = job.command()
    step: dict[str, Node] = {"name": job.command() if not job.matrix else
                             f"nox -s {job.session} (shard {_expr('matrix.shard')}/"
                             f"{_expr('matrix.of')})"}
    if env:
        step["env"] = env
    step["run"] = run
    steps.append(step)
    if records_history(job, style):
        steps.append(_record(job))
        if exports_history(job):
            steps.append(upload_history(history_artifact(job)))
    if records_durations(job):
        steps.append(_save_durations(job))
    if job.report:
        steps.append(_upload_report(job))
    if starts_bisects(job, style):
        steps.append(dispatch_step())
    return steps


def starts_bisects(job: Job, style: Style) -> bool:
    """The monitor job of this repository dispatches bisect.yml (ci/github/bisect_workflow.py)."""
    return style.own_jobs and has_bisect(job)


# The diff gate.
#
# A labelled PR whose diff touches only GPU-irrelevant paths (Style.gpu_irrelevant) runs its
# CPU jobs and skips its GPU jobs. `python -m ci plan` decides that, as it decides everything
# else: the `plan` job runs it on the PR's event and diff, publishes the ids of the jobs that
# run (output `jobs`) and writes every job's verdict and reason to its step summary; each GPU
# job `needs:` it and runs on a PR only when the list names it. The label terms stay in the
# GPU jobs' `if:` too (rendered from the same rules), so plan output from a fork's code can
# never reach a self-hosted runner. The plan job has a group of its own run: it cancels
# nothing, and a label added later starts only the job that label gates.
PLAN_MINUTES = 10
# The checkout of a pull_request is the merge commit; its first parent is the base branch's tip,
# so `git diff HEAD^1 HEAD` is the PR's change as it would merge. --no-renames lists both sides
# of a rename: moving code into docs/ still changes the code.
_PLAN_SCRIPT = (
    'git diff --no-renames --name-only -z HEAD^1 HEAD > "$RUNNER_TEMP/changed-paths"',
    'set -- --event pull_request --labels "$LABELS" --paths-from "$RUNNER_TEMP/changed-paths" --github',
    'if [ "$ACTION" = labeled ]; then set -- "$@" --added "$ADDED"; else set -- "$@" --action "$ACTION"; fi',
    'if [ "$FORK" = true ]; then set -- "$@" --fork; fi',
    # The shard counts by main's p90 where the snapshot was restored, else the committed durations.
    f'if [ -f {HISTORY_FILE} ]; then set -- "$@" --history "sqlite:///$PWD/{HISTORY_FILE}"; fi',
    'python -m ci plan "$@"',
)
# What `plan --history` reads the snapshot with, held to the lock file of the workflow's Python.
_PLAN_HISTORY_INSTALL = "python -m pip install -c constraints/py{python}.txt sqlalchemy"


def shards_matrix(job: Job) -> dict[str, Node]:
    """A matrix job's `shard` (1..K) and `of` ([K]) values: the plan job's count for a job sized
    by a target (its output `shards`), with the committed count where no plan ran; else the
    fixed count. Every leg reads K from its own `of`, never from `strategy.job-total`, which
    not every runner sets (act leaves it empty)."""
    rows = shard_matrix([job])[job.id]
    if not (job.planned_shards and needs_plan(job)):
        return {key: Flow(tuple(values)) for key, values in rows.items()}
    committed = json.dumps({job.id: rows}, separators=(",", ":"))
    # Only a plan that succeeded published the output. GitHub gives a skipped job's output as
    # '', act as the unrendered `${{ steps... }}` text, which fromJSON rejects and which would
    # stop the whole run: the result decides, not the output's emptiness.
    published = (f"needs.{PLAN_JOB}.result == 'success' && needs.{PLAN_JOB}.outputs.{SHARDS_OUTPUT}"
                 f" || '{committed}'")
    return {key: _expr(f"fromJSON({published}).{job.id}.{key}") for key in rows}


def plan_job(style: Style) -> dict[str, Node]:
    """The job that asks `python -m ci plan` which jobs this PR event runs."""
    return build.job(
        PLAN_JOB,
        condition="github.event_name == 'pull_request'",
        runs_on=build.hosted(style),
        permissions=build.reads_repository(),
        concurrency=build.concurrency(f"{WORKFLOW_NAME}-run{_expr('github.run_id')}-{PLAN_JOB}", True),
        minutes=PLAN_MINUTES,
        outputs={PLAN_OUTPUT: _expr(f"steps.plan.outputs.{PLAN_OUTPUT}"),
                 SHARDS_OUTPUT: _expr(f"steps.plan.outputs.{SHARDS_OUTPUT}")},
        steps=[
            build.checkout(fetch_depth=Note(2, "the merge commit and the base tip: the PR's diff")),
            build.setup_python(style),
            # This repository's checkout is the toolkit (stdlib only for `plan`); an adopting
            # repository installs it (its `install` names the toolkit's package).
            *([] if style.own_jobs else [{"name": "Install the toolkit", "run": style.install}]),
            # Main's runs (no credential), for the shard counts by their p90.
            restore_snapshot(),
            *([{"name": "Install SQLAlchemy (the snapshot's reader)",
                "run": _PLAN_HISTORY_INSTALL.format(python=style.python)}] if style.own_jobs else []),
            {"name": "python -m ci plan (this event, this diff)", "id": "plan",
             # Values reach the shell through the environment, never through ${{ }} in `run:`.
             "env": {"LABELS": _expr("join(github.event.pull_request.labels.*.name, ',')"),
                     "ACTION": _expr("github.event.action"),
                     "ADDED": _expr("github.event.label.name"),
                     "FORK": _expr("github.event.pull_request.head.repo.full_name != github.repository")},
             "run": Script(_PLAN_SCRIPT)},
        ])


# The verdict job.
#
# After every job of a PR's run (`always()`: it runs when they fail, that is its point), it
# asks `python -m ci why` for the verdict of each entry that did not pass (ci/history/verdicts.py),
# creates one check run per suite (`slime-ci / SUITE`, annotated at the failed tests, on the
# PR's head commit), edits the PR's one verdict comment that links them, and fails only when
# a verdict its suite blocks on is
# there (new and unknown, by default). Branch protection requires this check rather than the
# suite jobs (docs/verdicts.md). It holds no secret, as no job of a PR's workflow does: its
# baseline is the trusted snapshot the ingest job keeps (main's runs), and the PR's runs are
# the ones this workflow run's jobs exported, recorded into that local file as untrusted runs
# of this PR. It checks out the base commit; its token may read this run's artifacts, write
# PR comments and create check runs.
VERDICT_MINUTES = 15
_VERDICT_INGEST = f'nox -s {HISTORY_SESSION} -- ingest "{DOWNLOADED}" --pr "$PR"'
_VERDICT_RUN = ('nox -s verdict -- --pr "$PR" --base "$BASE" --needs "$NEEDS" --comment '
                '--checks --head "$HEAD" --gate')


def verdict_job(jobs: Sequence[Job], style: Style) -> dict[str, Node]:
    """The PR's `verdict` check: a verdict per failed entry, the sticky comment, the merge gate."""
    needs = [*([PLAN_JOB] if any(needs_plan(j) for j in jobs) else []),
             *(j.id for j in jobs if not j.scheduled_only)]
    return build.job(
        VERDICT_JOB,
        needs=Flow(tuple(needs)),
        condition="always() && github.event_name == 'pull_request'",
        runs_on=build.hosted(style),
        permissions=build.grant(contents=("read", "actions/checkout reads the repository"),
                          actions=("read", "this run's exported runs (artifacts)"),
                          pull_requests=("write", "the PR's one verdict comment, edited in place"),
                          checks=("write", "one check run per suite, `slime-ci / SUITE`")),
        concurrency=build.concurrency(f"{WORKFLOW_NAME}-pr{_expr('github.event.pull_request.number')}"
                                f"-{VERDICT_JOB}", True),
        minutes=VERDICT_MINUTES,
        steps=[
            build.checkout("Check out the base commit (the verdict's code, never the PR's)",
                     ref=_expr("github.event.pull_request.base.sha")),
            restore_snapshot(),
            build.setup_python(style),
            {"name": "Install nox", "run": style.install},
            fetch_exports(_expr("github.run_id")),
            {"name": "Record them beside the snapshot, untrusted, as this PR's runs",
             "env": {"PR": _expr("github.event.pull_request.number")}, "run": _VERDICT_INGEST},
            {"name": "python -m ci why (a verdict per failed entry; fails on new ones)",
             # Values reach the shell through the environment, never through ${{ }} in `run:`.
             "env": {"GITHUB_TOKEN": _expr("github.token"),
                     "PR": _expr("github.event.pull_request.number"),
                     "BASE": _expr("github.event.pull_request.base.sha"),
                     "HEAD": _expr("github.event.pull_request.head.sha"), "NEEDS": _expr("toJSON(needs)")},
             "run": _VERDICT_RUN},
            # `always()` runs this job after a cancel too; whether its steps then run or are
            # skipped, this one fails it: a cancelled run tested nothing, so it never passes.
            {"name": "Fail when the run was cancelled", "if": "cancelled()",
             "run": "echo '::error::the run was cancelled: its jobs judged nothing'; exit 1"},
        ])


def _job(job: Job, style: Style) -> dict[str, Node]:
    out: dict[str, Node] = {
        "name": job.id if not job.matrix else f"{job.id} (shard {_expr('matrix.shard')})",
    }
    if gated_by_plan(job):
        out["needs"] = Note(PLAN_JOB, "runs on a PR only if the plan of its diff says so")
    elif needs_plan(job):
        out["needs"] = Note(PLAN_JOB, "its matrix: the shard count the plan computes")
    out["if"] = Folded(tuple(condition_lines(job)))
    out["runs-on"] = build.runs_on(job.runs_on, "GPU jobs need GPU machines; PRs from forks never "
                                                "reach them (see if:)")
    permissions: dict[str, Node] = build.reads_repository()
    if starts_bisects(job, style):
        permissions["actions"] = Note("write", f"dispatch {BISECT_WORKFLOW} for each streak")
    if job.writes_issues:
        permissions["issues"] = Note("write", "one issue per held or main-breaking entry")
    out["permissions"] = permissions
    if uses_shared_history(job):
        out["environment"] = _environment(job)
    out["concurrency"] = {"group": concurrency_group(job), "cancel-in-progress": True}
    out["timeout-minutes"] = Note(job.minutes, "bound derived in ci/registry/job_timeouts.py")
    if job.tier == "cpu" and (records_durations(job) or job.scheduled_only):  # they install torch
        out["env"] = {"SLIME_CI_TORCH_INDEX": TORCH_CPU_INDEX}
    if job.matrix:
        out["strategy"] = {"fail-fast": False, "matrix": shards_matrix(job)}
    out["steps"] = _steps(job, style)
    return out


def workflow(jobs: Sequence[Job], style: Style | None = None) -> dict[str, Node]:
    """The workflow as a tree of nodes."""
    style = style or Style()
    return build.workflow_file(
        style.title,
        {
            "pull_request": {
                "branches": Flow((BASE_BRANCH,)),
                "types": Flow(("opened", "synchronize", "reopened", "labeled")),
            },
            "push": {"branches": Flow((BASE_BRANCH,))},
            **({"schedule": [{"cron": Note(cron, cadence)} for cron, cadence in style.schedules.items()]}
               if style.schedules else {}),
            "workflow_dispatch": {"inputs": {"infinite_run": {
                "description": "Run GPU tests with SLIME_TEST_ENABLE_INFINITE_RUN=1",
                "type": "boolean",
                "default": False,
            }}},
        },
        {**({PLAN_JOB: plan_job(style)} if any(needs_plan(j) for j in jobs) else {}),
         **{j.id: _job(j, style) for j in jobs},
         **pages_jobs(jobs, style),
         VERDICT_JOB: verdict_job(jobs, style)},
    )


def actionlint_config(jobs: Sequence[Job]) -> dict[str, Node]:
    """actionlint's config: the custom labels of our self-hosted runners."""
    labels = sorted({x for j in jobs if j.self_hosted for x in j.runs_on if x != "self-hosted"})
    return {"self-hosted-runner": {"labels": labels}}


def render(jobs: Sequence[Job], style: Style | None = None) -> dict[str, str]:
    """Every file the generator owns: repository-relative path -> text."""
    style = style or Style()
    from ci.github.gateway_workflow import (
        comment_files,  # it renders with this module's writer
        run_file_name,
    )

    watched = ((style.title, *((run_file_name(style),) if style.comment_commands else ()))
               if any(exports_history(j) for j in jobs) else ())
    bisect = {}
    if any(starts_bisects(j, style) for j in jobs):
        flow = bisect_workflow(style, cpu_env={"SLIME_CI_TORCH_INDEX": TORCH_CPU_INDEX})
        bisect[BISECT_PATH] = build.render_file(flow, style)
        watched = (*watched, bisect_name(style))  # its GPU job exports the answer
    return {
        **comment_files(jobs, style),
        **ingest_files(style, watched),
        **bisect,
        WORKFLOW_PATH: build.render_file(workflow(jobs, style), style),
        ACTIONLINT_PATH: to_yaml(actionlint_config(jobs),
                                 header=_banner("the runner labels in ci/github/job_plan.py")),
    }


# --- the README's session table ---------------------------------------------------------------

README_PATH = "README.md"
TABLE_BEGIN = f"<!-- sessions: {MARKER} from {REGISTRY}; edit the registry, not this table -->"
TABLE_END = "<!-- end of sessions -->"


def _where(job: Job) -> str:
    if job.scheduled_only:
        cadences = sorted({c for cron, c in Style().schedules.items() if cron in job.crons})
        return " and ".join(cadences) + " schedule" if cadences else "its schedule"
    return f"label `{job.label}`" if job.label else "every PR, push to `main`, dispatch"


def session_table(jobs: Sequence[Job], extra: Sequence[tuple[str, str, str]] = ()) -> str:
    """The README's table of sessions: CPU jobs first, then GPU ones, each in table order."""
    rows = ["| session | tier | in GitHub Actions | what it runs |", "|---|---|---|---|"]
    # The stability job runs a session listed already (docs/workflow.md, "Schedules").
    for job in sorted((j for j in jobs if not j.infinite), key=lambda j: j.self_hosted):
        rows.append(f"| `{job.session}` | {'GPU' if job.self_hosted else 'CPU'} | {_where(job)} | "
                    f"{job.purpose} |")
    rows += [f"| `{name}` | CPU | {when} | {what} |" for name, when, what in extra]
    return "\n".join(rows)


def readme(root: Path, jobs: Sequence[Job], style: Style | None = None) -> dict[str, str]:
    """The README with its session table regenerated; nothing when it has no table markers."""
    path = root / README_PATH
    if not path.is_file():
        return {}
    text = path.read_text(encoding="utf-8")
    begin, end = text.find(TABLE_BEGIN), text.find(TABLE_END)
    if begin < 0 or end < begin:
        return {}
    verdict = (VERDICT_JOB, "every PR, after its other jobs", f"{VERDICT_PURPOSE} (docs/verdicts.md)")
    hud = readme_rows(jobs, style or Style())
    table_text = f"{TABLE_BEGIN}\n{session_table(jobs, extra=[*hud, verdict])}\n"
    return {README_PATH: text[:begin] + table_text + text[end:]}


def adopted_u(root: Path, registry: Registry) -> dict[str, str]:
    """In an adopting repository, U's files as this toolkit ships them (`adopt` wrote them)."""
    if registry.source is None or not registry.workflow:
        return {}
    from ci.registry.u_files import U_DIR, packaged

    return {f"{U_DIR}/{name}": text for name, text in packaged().items()}


# --- write and check --------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Drift:
    """One owned file whose committed text differs from what the generator writes."""

    path: str
    expected: str | None  # None: a stale generated file that should be deleted
    actual: str | None  # None: missing

    def diff(self) -> str:
        """A unified diff from the committed file to the generated one."""
        old = (self.actual or "").splitlines(keepends=True)
        new = (self.expected or "").splitlines(keepends=True)
        return "".join(difflib.unified_diff(
            old, new,
            fromfile=f"a/{self.path}" if self.actual is not None else "/dev/null",
            tofile=f"b/{self.path}" if self.expected is not None else "/dev/null"))


def _stale(root: Path, owned: Mapping[str, str]) -> list[str]:
    folder = root / ".github" / "workflows"
    if not folder.is_dir():
        return []
    found = []
    for path in sorted([*folder.glob("*.yml"), *folder.glob("*.yaml")]):
        rel = path.relative_to(root).as_posix()
        if rel not in owned and MARKER in path.read_text(encoding="utf-8", errors="replace"):
            found.append(rel)
    return found


def drift(root: Path, files: Mapping[str, str]) -> list[Drift]:
    """Owned files that differ from `files`, plus stale generated ones."""
    out = []
    for rel, text in files.items():
        path = root / rel
        actual = path.read_text(encoding="utf-8") if path.is_file() else None
        if actual != text:
            out.append(Drift(path=rel, expected=text, actual=actual))
    for rel in _stale(root, files):
        out.append(Drift(path=rel, expected=None, actual=(root / rel).read_text(encoding="utf-8")))
    return out


def write(root: Path, changes: Sequence[Drift]) -> None:
    """Bring the owned files in line: write the changed ones, delete stale ones."""
    for d in changes:
        path = root / d.path
        if d.expected is None:
            path.unlink()
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(d.expected, encoding="utf-8")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog=COMMAND,
        description=f"Write {WORKFLOW_PATH} and {ACTIONLINT_PATH} from the registry "
                    f"({' or '.join(REGISTRY_PATHS)}) and the trigger table (ci/github/job_plan.py).",
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="write nothing; print a diff and exit 1 if a committed file is stale")
    mode.add_argument("--dry-run", action="store_true",
                      help="write nothing; print the diff that a write would apply")
    parser.add_argument("--root", type=Path, default=None,
                        help="repository root (default: the checkout around the current directory)")
    return parser


def find_root(start: Path) -> Path:
    """The nearest directory at or above `start` that holds a registry."""
    for folder in (start, *start.parents):
        if registry_path(folder) is not None:
            return folder
    raise UsageError(f"no {' or '.join(REGISTRY_PATHS)} in {start} or above: run from the "
                     "repository or pass --root")


def main(argv: list[str]) -> int:
    """`python -m ci workflows [--check | --dry-run]`."""
    args = _parser().parse_args(argv)
    # Generated files are written under --root: one that does not exist must not gain a
    # .github/ tree (a checkout without a registry of its own gets the toolkit's).
    root: Path = (find_root(Path.cwd().resolve()) if args.root is None
                  else existing_dir("--root", args.root))
    registry = load_registry(root)
    jobs = table(registry.suites, registry.style, registry.sessions, root=root)
    changes = drift(root, {**render(jobs, registry.style), **readme(root, jobs, registry.style),
                           **u_generated(root), **adopted_u(root, registry)})
    if args.check or args.dry_run:
        for d in changes:
            sys.stdout.write(d.diff())
        if not changes:
            print(f"{COMMAND}: generated files are up to date")
            return 0
        names = ", ".join(d.path for d in changes)
        if args.check:
            print(f"error: stale generated files: {names}; run `{COMMAND}` and commit the "
                  "result", file=sys.stderr)
            return 1
        print(f"{COMMAND} would change: {names}")
        return 0
    write(root, changes)
    for d in changes:
        print(f"{'deleted' if d.expected is None else 'wrote'} {d.path}")
    if not changes:
        print(f"{COMMAND}: generated files are up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
