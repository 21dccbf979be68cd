"""The bisect workflow (`bisect.yml`, `workflow_dispatch`), and the monitor's step that starts it.

The hourly monitor job, when it finds entries failing run after run on main, writes the
streaks with no answer in the history yet (`history monitor --bisect-plan`); its next step,
which never sees the store's secret, dispatches one bisect run for each (`actions: write`). A maintainer's
`/bisect <file>` comment dispatches the same workflow (ci/github/gateway.py).

The run checks out the default branch with its whole history, installs the suite's own
session (`nox -s <suite> --install-only`) and runs the bisect with that environment's
Python, so every step runs the entry as the suite's session does: GPU suites on a GPU
runner under the host's GPU lock, CPU suites on a hosted runner. The answer goes to the
step summary and an artifact holding the body for the streak's issue, and to the history
(the `bisects` table): the hosted job records it; a GPU job holds no secret, reads the
streak from the trusted snapshot the ingest job keeps, and exports its answer as the
artifact `history-bisect`, which the ingest job (it watches this workflow) checks and records.
"""

from __future__ import annotations

from collections.abc import Mapping

from ci.github import job_builder as build
from ci.github.gateway import BISECT_WORKFLOW
from ci.github.ingest_workflow import restore_snapshot, upload_history
from ci.github.job_plan import Job
from ci.github.yaml_writer import UPLOAD_ARTIFACT, Node, Note, Script, _expr, _uses
from ci.history.ingest import ARTIFACT_PREFIX, EXPORT_DIR
from ci.history.store import HISTORY_ENV, HISTORY_ENVIRONMENT, HISTORY_SECRET
from ci.registry.job_timeouts import LOCK_TIMEOUT_ENV, LOCK_WAIT_MINUTES
from ci.registry.model import CPU_TIER, GPU_TIER, MONITOR_BISECT_PLAN, MONITOR_SESSION
from ci.registry.workflow_style import Style

BISECT_PATH = f".github/workflows/{BISECT_WORKFLOW}"
ANSWER_DIR = ".ci-cache/bisect"
# A GPU job's answer, for the ingest job (`history-*`, like every exported run).
BISECT_ARTIFACT = f"{ARTIFACT_PREFIX}bisect"
# A bisect runs the entry up to ~⌈log2 n⌉ + 2 times per attempt per commit: a day's worth of a
# GPU job's timeout is its bound, as for the stability job.
BISECT_MINUTES = 720
CPU_MINUTES = 120

INPUTS: dict[str, tuple[str, bool]] = {
    "suite": ("registry suite of the entry", True),
    "tier": ("cpu or gpu: which runner (the suite's tier)", True),
    "entry": ("the entry id (a registered test file)", True),
    "good": ("a good commit (empty: the monitor's streak gives the range)", False),
    "bad": ("the bad commit (empty: HEAD, or the streak's)", False),
    "trigger": ("who asked: monitor, comment or cli", False),
}

# The worktrees go under RUNNER_TEMP: inside the runner's work dir, which a GPU runner maps
# to the same path on its host, so the steps' `docker run -v` can mount them.
def _run(gpu: bool) -> tuple[str, ...]:
    """The bisect step's script; a GPU job also exports its answer for the history ingest."""
    export = f" --export {EXPORT_DIR}" if gpu else ""
    return (f'set -- --suite "$SUITE" --entry "$ENTRY" --trigger "${{TRIGGER:-monitor}}" '
            f'--answer-dir {ANSWER_DIR} --work-dir "$RUNNER_TEMP"{export}', *_RUN)


_RUN = (
    # Either way only commits of the default branch run here (--from-monitor checks its own).
    'if [ -n "$GOOD" ]; then set -- "$@" --good "$GOOD" --bad "${BAD:-HEAD}" --branch-only; '
    'else set -- "$@" --from-monitor; fi',
    'venv=".nox/$SUITE"',
    '"$venv/bin/python" -m pip install --quiet -e ".[history]"  # the store, in the session\'s env',
    '"$venv/bin/python" -m ci bisect "$@"',
)

# The monitor job's step: one bisect run per streak the history has no answer for.
DISPATCH = (
    f'[ -s {MONITOR_BISECT_PLAN} ] || {{ echo "no streak to bisect"; exit 0; }}',
    'while IFS= read -r row; do',
    f'  gh workflow run {BISECT_WORKFLOW} --repo "$REPO" --ref "$DEFAULT_BRANCH" \\',
    '    -f suite="$(jq -r .suite <<<"$row")" -f tier="$(jq -r .tier <<<"$row")" \\',
    '    -f entry="$(jq -r .entry <<<"$row")" -f trigger=monitor',
    '  echo "dispatched a bisect of $(jq -r .entry <<<"$row")"',
    f'done < {MONITOR_BISECT_PLAN}',
)


def bisect_name(style: Style) -> str:
    """The workflow's `name:`, which the ingest workflow watches (`workflow_run`)."""
    return f"{style.title} bisect"


def has_bisect(job: Job) -> bool:
    """The job whose streaks start bisects: the scheduled failure monitor."""
    return job.session == MONITOR_SESSION and job.history_store


def dispatch_step() -> dict[str, Node]:
    """After `nox -s monitor` failed (exit 1: entries failing), dispatch their bisects."""
    return {"name": f"Dispatch {BISECT_WORKFLOW} for each streak not bisected yet",
            "if": Note("failure()", "the monitor exits 1 when it finds entries failing"),
            "env": {"GH_TOKEN": _expr("github.token"), "REPO": _expr("github.repository"),
                    "DEFAULT_BRANCH": _expr("github.event.repository.default_branch")},
            "run": Script(DISPATCH)}


def bisect_workflow(style: Style, *, cpu_env: Mapping[str, str]) -> dict[str, Node]:
    """One job per tier; the dispatched run takes the one its `tier` input names. `cpu_env`:
    the hosted runners' job variables (the CPU torch index), as in pr-test.yml."""
    out: dict[str, Node] = {}
    for tier, runner in ((CPU_TIER, style.hosted_runner), (GPU_TIER, style.gpu_runner)):
        gpu = tier == GPU_TIER
        env: dict[str, Node] = {name.upper(): _expr(f"inputs.{name}")
                                for name in ("suite", "entry", "good", "bad", "trigger")}
        if gpu:
            # No secret on a GPU host (a PR's job there is root on it, docs/security.md): the
            # streak comes from the trusted snapshot the ingest job keeps; the answer goes to
            # the step summary and the artifact, not to the shared store.
            env[LOCK_TIMEOUT_ENV] = str(LOCK_WAIT_MINUTES * 60)
            env.update(style.gpu_env)
        else:
            env[HISTORY_ENV] = _expr(f"secrets.{HISTORY_SECRET}")
        out[f"bisect_{tier}"] = build.job(
            f"bisect {_expr('inputs.entry')} ({tier})",
            condition=f"inputs.tier == '{tier}'",
            runs_on=build.runs_on(runner, "dispatched on the default branch only; it runs main's commits, "
                                    "never a PR's"),
            permissions=build.reads_repository("actions/checkout reads the history"),
            environment=None if gpu else build.secret_environment(HISTORY_ENVIRONMENT,
                                                            "its secrets, without a deployment"),
            concurrency=build.concurrency(f"bisect-{_expr('inputs.suite')}-{_expr('inputs.entry')}", False),
            minutes=Note(BISECT_MINUTES if gpu else CPU_MINUTES, "a bisect runs the entry several times"),
            env=None if gpu else dict(cpu_env),
            steps=[
                build.checkout("Check out the default branch with its history",
                         fetch_depth=Note(0, "every commit of the range")),
                *([restore_snapshot()] if gpu else []),
                build.setup_python(style),
                build.install(style),
                {"name": "Install the suite's session", "env": {"SUITE": _expr("inputs.suite")},
                 "run": 'nox -s "$SUITE" --install-only'},
                {"name": "python -m ci bisect", "env": env, "run": Script(_run(gpu))},
                # The ingest job (it watches this workflow) records the answer in the store.
                *([upload_history(BISECT_ARTIFACT)] if gpu else []),
                {"name": f"Upload {ANSWER_DIR}", "if": "always()", "uses": _uses(UPLOAD_ARTIFACT),
                 "with": {"name": "bisect-answer", "path": ANSWER_DIR,
                          "if-no-files-found": Note("ignore", "a refused range writes none")}},
            ])
    return build.workflow_file(bisect_name(style), {"workflow_dispatch": {"inputs": {
        name: {"description": text, "required": required, "type": "string"}
        for name, (text, required) in INPUTS.items()}}}, out)
