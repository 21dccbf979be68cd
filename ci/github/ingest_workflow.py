"""The history ingest workflow: the one job that holds the shared store's secret for GPU runs.

GPU jobs, and every job that checks out a pull request's code, never hold SLIME_CI_HISTORY_URL:
they export their runs as an artifact (`history-*`, ci/github/workflow.py). This workflow runs
when one of the test workflows completes (`workflow_run`): GitHub runs it from the default
branch, whatever branch the finished run tested, so its code and its `ci-history` environment
(give it the deployment branches "the default branch only", docs/security.md) are out of a
pull request's reach. It checks out the default branch (`refs/heads/<branch>` in full, with
its whole commit graph) and fetches the artifacts' zip files as data (never unpacked, never
run); `history ingest` reads them in memory, validates each record strictly and records it
with the trust and PR number GitHub's event payload states (ci/history/ingest.py). A run is
trusted only when it ran our test workflow file and its head commit is on that checkout's
default branch: a pushed tag named like the branch reports the same `head_branch`.

After a trusted run (a push, schedule or manual run of the default branch) it writes the store's
trusted runs to a SQLite file and saves it in the Actions cache, in the default branch's scope:
GPU jobs restore it as their history file, so estimates, quarantine and metric gates keep a
trusted baseline without a credential. A pull request can save caches only in its own scope,
which no other branch reads.
"""

from __future__ import annotations

from ci.github import job_builder as build
from ci.github.job_plan import WORKFLOW_NAME
from ci.github.yaml_writer import (
    CACHE_RESTORE,
    CACHE_SAVE,
    UPLOAD_ARTIFACT,
    Flow,
    Node,
    Note,
    Script,
    _expr,
    _uses,
)
from ci.history.ingest import ARTIFACT_PREFIX, EXPORT_DIR, SNAPSHOT_ARTIFACT, SNAPSHOT_KEY
from ci.history.job_times import JQ
from ci.history.store import HISTORY_ENV, HISTORY_ENVIRONMENT, HISTORY_FILE, HISTORY_SECRET, HISTORY_SESSION
from ci.registry.job_timeouts import LINT_MINUTES
from ci.registry.workflow_style import Style

INGEST_PATH = ".github/workflows/history-ingest.yml"
# The workflow whose default-branch runs are trusted: the test workflow (ci/github/workflow.py
# WORKFLOW_PATH), never another file that takes its `name:`.
TRUSTED_PATH = f".github/workflows/{WORKFLOW_NAME}.yml"
DOWNLOADED = "$RUNNER_TEMP/history"
_FRESH = "steps.ingest.outputs.trusted != '0'"  # trusted runs were added
_FETCH = Script((
    f'mkdir -p "{DOWNLOADED}"',
    'gh api --paginate "repos/$REPO/actions/runs/$RUN/artifacts" \\',
    "  --jq '.artifacts[] | select(.name | startswith(\"" + ARTIFACT_PREFIX + "\"))"
    " | select(.expired | not) | .id' |",
    "while read -r id; do",
    f'  gh api "repos/$REPO/actions/artifacts/$id/zip" > "{DOWNLOADED}/$id.zip"',
    "done",
))


JOBS_FILE = "$RUNNER_TEMP/jobs.jsonl"
# The finished run's jobs as GitHub timed them; one the API does not give is a warning, and
# the runs are still recorded.
_JOBS = Script((
    'gh api --paginate "repos/$REPO/actions/runs/$RUN/attempts/$ATTEMPT/jobs" \\',
    f"  --jq '{JQ}' > \"{JOBS_FILE}\" \\",
    "  || { echo \"::warning::the run's jobs could not be read: their times are not recorded\"; "
    f'rm -f "{JOBS_FILE}"; }}',
))


def fetch_jobs() -> dict[str, Node]:
    """The step that writes the finished run's jobs (name, start, end, conclusion, labels) to
    JOBS_FILE, one JSON object a line, for `history ingest --jobs`."""
    return {"name": "Fetch the run's jobs and their times (what its author waited for)",
            "env": {"GH_TOKEN": _expr("github.token"), "REPO": _expr("github.repository"),
                    "RUN": _expr("github.event.workflow_run.id"),
                    "ATTEMPT": _expr("github.event.workflow_run.run_attempt")},
            "run": _JOBS}


def fetch_exports(run: str) -> dict[str, Node]:
    """The step that fetches the `history-*` artifacts of workflow run `run` (an expression)
    into DOWNLOADED, as zip files the API serves, never unpacked."""
    return {"name": "Fetch the run's exported runs (zip files, never unpacked or executed)",
            "env": {"GH_TOKEN": _expr("github.token"), "REPO": _expr("github.repository"), "RUN": run},
            "run": _FETCH}


def upload_history(name: str) -> dict[str, Node]:
    """The step of a job that runs PR code or runs on a GPU host: hand its exported runs
    (`history record --export`) to this workflow, also after a failure."""
    return {"name": "Upload this job's runs for the history ingest", "if": "always()",
            "uses": _uses(UPLOAD_ARTIFACT),
            "with": {"name": name, "path": EXPORT_DIR,
                     "if-no-files-found": Note("ignore", "history off, or nothing recorded"),
                     "retention-days": Note(7, "the ingest job reads it within minutes")}}


def restore_snapshot() -> dict[str, Node]:
    """The step of a GPU job that restores the ingest job's trusted snapshot as its history file."""
    return {"name": "Restore the trusted history (the ingest job's snapshot)",
            "uses": _uses(CACHE_RESTORE),
            "with": {"path": HISTORY_FILE,
                     "key": SNAPSHOT_KEY + _expr("github.run_id"),
                     "restore-keys": SNAPSHOT_KEY}}


def ingest(style: Style, watched: tuple[str, ...]) -> dict[str, Node]:
    """The `workflow_run` workflow that records the watched workflows' exported runs."""
    steps: list[Node] = [
        *build.prepare(style, build.checkout(
            "Check out the default branch (the ingest's code, never the run's)",
            ref=Note("refs/heads/" + _expr("github.event.repository.default_branch"),
                     "the branch in full: a tag of the same name is not it"),
            # A trusted run's head must be on this branch (ci/history/on_branch.py): its
            # whole commit graph, without the files of old commits.
            fetch_depth=Note(0, "every commit of the branch: is the run's head one?"),
            filter="blob:none")),
        # The artifacts' zip files as the API serves them, never unpacked: `history ingest`
        # reads their members in memory. Most finished runs (a PR's CPU jobs) export none.
        fetch_exports(_expr("github.event.workflow_run.id")),
        fetch_jobs(),
        {"name": "Validate and record them, trust and PR from the event", "id": "ingest",
         "env": {HISTORY_ENV: _expr(f"secrets.{HISTORY_SECRET}")},
         "run": f'nox -s {HISTORY_SESSION} -- ingest "{DOWNLOADED}" --event-file "$GITHUB_EVENT_PATH" '
                f'--trusted-workflow {TRUSTED_PATH} --jobs "{JOBS_FILE}"'},
        {"name": "Snapshot the trusted runs for the GPU jobs (after a trusted run only)",
         "if": f"{_FRESH}",
         "env": {HISTORY_ENV: _expr(f"secrets.{HISTORY_SECRET}")},
         "run": f"nox -s {HISTORY_SESSION} -- snapshot {HISTORY_FILE}"},
        {"name": "Save it where GPU jobs restore it", "if": f"{_FRESH}", "uses": _uses(CACHE_SAVE),
         "with": {"path": HISTORY_FILE,
                  "key": SNAPSHOT_KEY + _expr("github.run_id") + "-" + _expr("github.run_attempt")}},
        # The same file for a laptop's `python -m ci why --last` (`python -m ci history pull`,
        # which takes only an artifact of a run of the default branch's own code).
        {"name": "Publish it for `python -m ci history pull`", "if": f"{_FRESH}",
         "uses": _uses(UPLOAD_ARTIFACT),
         "with": {"name": SNAPSHOT_ARTIFACT, "path": HISTORY_FILE, "retention-days": 30,
                  "if-no-files-found": "error"}},
    ]
    recorder = build.job(
        "record the finished run's history (default branch's code only)",
        runs_on=build.hosted(style),
        permissions=build.grant(actions=("read", "download the finished run's artifacts")),
        environment=build.secret_environment(HISTORY_ENVIRONMENT,
                                             f"its secret {HISTORY_SECRET}, without a deployment"),
        concurrency=build.concurrency(f"history-ingest-{_expr('github.event.workflow_run.id')}", False),
        minutes=LINT_MINUTES, steps=steps)
    on = {"workflow_run": Note(
        {"workflows": Flow(watched), "types": Flow(("completed",))},
        "zizmor: ignore[dangerous-triggers] checks out only the default branch; the "
        "artifacts are data, validated before anything is recorded")}
    return build.workflow_file(f"{style.title} history ingest", on, {"ingest": recorder})


def ingest_files(style: Style, watched: tuple[str, ...]) -> dict[str, str]:
    """The ingest workflow, or nothing when no job exports its runs."""
    if not watched:
        return {}
    return {INGEST_PATH: build.render_file(ingest(style, watched), style)}
