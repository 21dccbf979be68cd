"""The event plan: which CI job runs which nox session, on which runner, when (`python -m ci plan`).

Not to be confused with `ci.select.entries`, which plans the entries of one suite (selection, order,
shards) once a job runs.

The workflow generator (`ci.github.workflow`) renders each rule below as an Actions
`if:` expression; `python -m ci plan` applies the same rule in Python. A test
evaluates the rendered expressions for every label combination and checks
that both agree, so what `plan` prints is what Actions does.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

from ci.args import Parser, existing_dir
from ci.errors import StoreError, UsageError
from ci.log import Log
from ci.registry.cadences import (
    DEFAULT_SCHEDULES,
    MONITOR,
    WEEKLY,
    cadence_of,
    check_schedules,
    gpu_skip_reason,
    suite_cadences,
)
from ci.registry.job_timeouts import LINT_MINUTES, MAX_MINUTES, SETUP_MINUTES, suite_minutes
from ci.registry.loader import load_registry
from ci.registry.model import (
    GPU_RUNNER_LABELS,
    MONITOR_PURPOSE,
    MONITOR_REPORT,
    MONITOR_SESSION,
    VERDICT_SESSION,
    Check,
    ShardPolicy,
    Smoke,
    Suite,
    Tier,
)
from ci.registry.repo_suites import SESSIONS, SHARDING, SUITES
from ci.registry.workflow_style import Style
from ci.select.discover import is_test_file
from ci.select.shard_count import ShardCount, suite_counts

EventName = Literal["pull_request", "push", "workflow_dispatch", "schedule"]
# `plan --event issue_comment` answers a PR comment command (ci.github.gateway), not the job table.
COMMENT_EVENT = "issue_comment"
PullRequestAction = Literal["opened", "synchronize", "reopened", "labeled"]
JobKind = Literal["suite", "check", "smoke"]

BASE_BRANCH = "main"
WORKFLOW_NAME = "pr-test"
HOSTED_RUNNER: tuple[str, ...] = ("ubuntu-latest",)
GPU_RUNNER: tuple[str, ...] = GPU_RUNNER_LABELS
# The checkout whose committed durations size this repository's own sharded jobs.
TOOLKIT_ROOT = Path(__file__).resolve().parents[2]
# Labels whose prefix marks them as CI switches: an unknown one is a typo, not an unrelated label.
LABEL_PREFIX = "run-ci-"


@dataclass(frozen=True, kw_only=True)
class Job:
    """One CI job: a nox session on a runner, gated by a PR label or run on every event."""

    id: str
    session: str
    tier: Tier
    purpose: str
    runs_on: tuple[str, ...]
    label: str | None = None  # None: every pull request, push and dispatch
    shards: int = 1
    shards_why: str = ""  # how the count was reached (ci/select/shard_count.py); "": fixed
    full_history: bool = False  # checks out every commit: the session diffs against origin/main,
    # or replays commits (the monitor's leak audit)
    minutes: int = LINT_MINUTES  # timeout-minutes (ci/registry/job_timeouts.py)
    crons: tuple[str, ...] = ()  # the scheduled runs that run it (ci/registry/cadences.py)
    scheduled_only: bool = False  # only its crons, never a PR, push or dispatch
    infinite: bool = False  # runs its suite with SLIME_TEST_ENABLE_INFINITE_RUN=1
    kind: JobKind = "suite"  # a suite; a check (commands, ci.suites.Check); a smoke (ci.suites.Smoke)
    history_store: bool = False  # a check that reads the shared run history (its secret)
    writes_issues: bool = False  # the monitor: it keeps the issues of held entries (GITHUB_TOKEN)
    report: str | None = None  # a check's file, uploaded as an artifact
    # A GPU suite's job: on a PR without the all-entries label it runs only the entries the
    # PR's diff reaches (`run --by-executed`, docs/selection.md).
    narrows: bool = False

    @property
    def self_hosted(self) -> bool:
        return "self-hosted" in self.runs_on

    @property
    def planned_shards(self) -> bool:
        """Whether its shard count comes from a target: the plan job recomputes it when the
        run starts (the history's p90) and the job's matrix reads it from the plan's output."""
        return bool(self.shards_why)

    @property
    def matrix(self) -> bool:
        """Whether the job runs as a matrix of `--shard I/K` jobs (a target's, even of 1 shard,
        or a fixed count above 1)."""
        return self.shards > 1 or self.planned_shards

    def narrowed(self, event: Event, all_entries_label: str) -> bool:
        """Whether this event runs the job on the entries its diff reaches (`--by-executed`):
        a GPU suite's job on a PR without the all-entries label (ci/github/workflow.py)."""
        return (self.narrows and not self.matrix and not self.infinite and event.name == "pull_request"
                and not any(x.casefold() == all_entries_label.casefold() for x in event.labels))

    def command(self, shard: int | None = None) -> str:
        """The shell command the job runs (what a developer types locally)."""
        if self.matrix and shard is not None:
            return f"nox -s {self.session} -- --shard {shard}/{self.shards}"
        return f"nox -s {self.session}"


def session_job(session: Check | Smoke, style: Style, suites: Sequence[Suite],
                count: ShardCount | None = None) -> Job:
    """The CI job of a session that is not a suite (ci.suites.SESSIONS): a hosted CPU job;
    `count`: a smoke's computed shard count, for one with a target."""
    if isinstance(session, Smoke):
        known = {s.name for s in suites}
        unknown = [r.suite for r in session.runs if r.suite not in known]
        if unknown:
            raise UsageError(f"session {session.name} runs suite {unknown[0]!r}, which the registry "
                             f"lacks: name one of {', '.join(sorted(known))} in {style.registry}")
        if session.shards < 1:
            raise UsageError(f"session {session.name}: shards must be >= 1 in {style.registry}")
        return Job(id=session.name, session=session.name, tier="cpu", purpose=session.purpose,
                   runs_on=style.hosted_runner, minutes=session.minutes, kind="smoke",
                   shards=count.count if count else session.shards,
                   shards_why=count.why if count else "",
                   crons=_crons(style, session.cadences), scheduled_only=bool(session.cadences))
    if session.every_event == bool(session.cadences):
        raise UsageError(f"session {session.name}: set every_event=True or cadences=(...) in "
                         f"{style.registry}, not both (or neither, for a session no CI job runs)")
    return Job(id=session.name, session=session.name, tier="cpu", purpose=session.purpose,
               runs_on=style.hosted_runner, minutes=session.minutes, kind="check",
               crons=_crons(style, session.cadences), scheduled_only=bool(session.cadences))


def smokes_of(sessions: Iterable[Check | Smoke]) -> list[Smoke]:
    """The smokes among a registry's sessions (the ones a target may split)."""
    return [x for x in sessions if isinstance(x, Smoke)]


def runs_in_ci(session: Check | Smoke) -> bool:
    """Whether a CI job runs the session (a check no event and no cadence reaches runs on demand)."""
    return isinstance(session, Smoke) or session.every_event or bool(session.cadences)


def job_for(suite: Suite, style: Style | None = None, count: ShardCount | None = None) -> Job:
    """The CI job of one suite (its id and runners as the repository's Style says); `count`:
    its computed shard count, for a suite with a target."""
    style = style or Style()
    if suite.needs_gpus and suite.label is None:
        raise UsageError(f"suite {suite.name} is GPU tier but has no label: add "
                         f"label='{LABEL_PREFIX}…' to it in {style.registry}")
    if suite.shards < 1:
        raise UsageError(f"suite {suite.name}: shards must be >= 1 in {style.registry}")
    return Job(
        id=style.job_ids.get(suite.name, suite.name),
        session=suite.name,
        tier=suite.tier,
        purpose=suite.purpose,
        runs_on=style.gpu_runner if suite.needs_gpus else style.hosted_runner,
        label=suite.label,
        shards=count.count if count else suite.shards,
        shards_why=count.why if count else "",
        full_history=suite.dynamic,
        narrows=suite.needs_gpus and not suite.dynamic,
        minutes=suite_minutes(suite),
        crons=_crons(style, suite_cadences(suite)),
    )


def _crons(style: Style, cadences: Iterable[str]) -> tuple[str, ...]:
    wanted = set(cadences)
    return tuple(cron for cron, cadence in style.schedules.items() if cadence in wanted)


def stability_job(suites: Sequence[Suite], style: Style) -> Job | None:
    """The weekly job that runs one GPU suite in the infinite mode for a bounded time."""
    if style.stability_suite is None or not style.schedules:
        return None
    suite = next((s for s in suites if s.name == style.stability_suite), None)
    if suite is None and style.stability_suite == Style().stability_suite:
        return None  # the default names this repository's suite; an adopter may have none
    if suite is None or not suite.needs_gpus:
        raise UsageError(f"WORKFLOW['stability_suite'] = {style.stability_suite!r}: not a GPU suite of "
                         "the registry (name one, or set it to None)")
    if not 1 <= style.stability_minutes <= MAX_MINUTES - SETUP_MINUTES:
        raise UsageError(f"WORKFLOW['stability_minutes'] must be 1..{MAX_MINUTES - SETUP_MINUTES}")
    return Job(id=f"{suite.name}_stability", session=suite.name, tier=suite.tier,
               purpose=f"Weekly: {suite.name} repeated until a failure, for at most "
                       f"{style.stability_minutes} minutes",
               runs_on=style.gpu_runner, minutes=style.stability_minutes + SETUP_MINUTES,
               crons=_crons(style, [WEEKLY]), scheduled_only=True, infinite=True)


MONITOR_MINUTES = 10


def monitor_job(style: Style) -> Job | None:
    """The scheduled failure monitor over the shared run history, when a cron maps to it."""
    crons = _crons(style, [MONITOR])
    if not crons:
        return None
    return Job(id=MONITOR_SESSION, session=MONITOR_SESSION, tier="cpu", runs_on=style.hosted_runner,
               purpose=MONITOR_PURPOSE, minutes=MONITOR_MINUTES, kind="check", crons=crons,
               scheduled_only=True, history_store=True, report=MONITOR_REPORT, writes_issues=True,
               full_history=True)  # its leak audit replays the commits a bisect blamed


# A repository that adopted the toolkit checks its generated workflow in CI with this job
# (the `workflows` session of its noxfile) instead of this repository's lint and smoke jobs.
CHECK_SESSION = "workflows"


def check_job(job_id: str, style: Style) -> Job:
    """The `workflows --check` job of an adopting repository."""
    return Job(id=job_id, session=CHECK_SESSION, tier="cpu", runs_on=style.hosted_runner,
               minutes=LINT_MINUTES, kind="check",
               purpose="Generated workflow and U files are current with the registry")


def table(suites: Sequence[Suite] = SUITES, style: Style | None = None,
          sessions: Sequence[Check | Smoke] = SESSIONS, *, root: Path = TOOLKIT_ROOT,
          counts: Mapping[str, ShardCount] | None = None) -> tuple[Job, ...]:
    """Every CI job: one per suite, then this repository's sessions that are not suites (lint,
    the GPU smoke; scheduled checks after the stability job), or an adopting repository's
    check job. Suites with a target get the shard count `counts` gives, else the one the
    committed durations of `root` give. Without a style: this repository's own, which sizes
    its shards for the runner its SHARDING names."""
    style = style or Style(sharding=SHARDING)
    if counts is None:
        counts = suite_counts(root, suites, smokes=smokes_of(sessions), policy=style.sharding)
    own = ([session_job(x, style, suites, counts.get(x.name)) for x in sessions if runs_in_ci(x)]
           if style.own_jobs else [])
    extra: tuple[Job, ...] = tuple(j for j in own if not j.scheduled_only)
    stability = stability_job(suites, style)
    scheduled = [c for x in sessions if runs_in_ci(x) for c in x.cadences] \
        if style.own_jobs else []
    monitor = monitor_job(style)
    check_schedules(style.schedules, suites,
                    [*([WEEKLY] if stability else []), *scheduled, *([MONITOR] if monitor else [])])
    if stability is not None:
        extra = (*extra, stability)
    extra = (*extra, *(j for j in own if j.scheduled_only), *([monitor] if monitor else []))
    if style.check_job:
        extra = (*extra, check_job(style.check_job, style))
    jobs = (*(job_for(s, style, counts.get(s.name)) for s in suites), *extra)
    ids = [j.id for j in jobs] + [PLAN_JOB, VERDICT_JOB]  # the workflow's own jobs take these ids
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise UsageError(f"two CI jobs named {', '.join(dupes)}: rename the suite in {style.registry}")
    return jobs


def gating_labels(jobs: Iterable[Job]) -> list[str]:
    """The PR labels that switch jobs on, sorted."""
    return sorted({j.label for j in jobs if j.label is not None})


@dataclass(frozen=True, kw_only=True)
class Event:
    """What triggered a workflow run, reduced to what the rules read."""

    name: EventName
    action: PullRequestAction = "synchronize"  # pull_request only
    labels: frozenset[str] = frozenset()  # labels on the PR after the event
    added: str | None = None  # the label a `labeled` event added
    from_fork: bool = False
    cron: str | None = None  # schedule only: the cron that fired
    cadence: str | None = None  # schedule only: what that cron maps to
    # pull_request only, when the diff is known (`plan --paths`/`--diff`): why GPU jobs skip it,
    # and the changed test files when the diff is tests only.
    gpu_skip: str | None = None
    tests_only: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class Decision:
    """Whether one job runs for one event, and why."""

    job: Job
    runs: bool
    why: str


def _has(labels: Iterable[str], label: str) -> bool:
    # Actions compares strings case-insensitively; so must the plan.
    return any(x.casefold() == label.casefold() for x in labels)


def decide(job: Job, event: Event) -> Decision:
    """Apply the job's rule to one event."""
    def verdict(runs: bool, why: str) -> Decision:
        return Decision(job=job, runs=runs, why=why)

    if event.name == "schedule":
        if event.cron in job.crons:
            return verdict(True, f"the {event.cadence} schedule ({event.cron}) runs it")
        return verdict(False, f"the {event.cadence} schedule does not run it")
    if job.scheduled_only:
        return verdict(False, "only its schedule runs it ("
                              + ", ".join(job.crons) + ")")
    if event.name == "workflow_dispatch":
        return verdict(True, "manual dispatch runs every job")
    if event.name == "push":
        if job.label is None:
            return verdict(True, f"every push to {BASE_BRANCH} runs it")
        return verdict(False, f"pushes run no labelled job (it runs on label {job.label})")
    if job.self_hosted and event.from_fork:
        return verdict(False, "self-hosted runners never run pull requests from forks")
    if job.label is None:
        if event.action == "labeled":
            return verdict(False, "a new label adds no commit: this commit's run already has it")
        return verdict(True, f"every pull request to {BASE_BRANCH} runs it")
    if not _has(event.labels, job.label):
        return verdict(False, f"the PR lacks label {job.label}")
    if event.action == "labeled" and not (event.added and _has([event.added], job.label)):
        return verdict(False, f"adding {event.added} leaves this job alone "
                              f"(it runs on label {job.label})")
    if job.self_hosted and event.gpu_skip:
        return verdict(False, event.gpu_skip)
    if job.full_history and event.tests_only:
        return verdict(True, f"the PR has label {job.label} and changes only tests: runs only "
                             + ", ".join(event.tests_only))
    return verdict(True, f"the PR has label {job.label}")


def plan(event: Event, jobs: Sequence[Job]) -> list[Decision]:
    """Every job's decision for one event, in table order."""
    return [decide(j, event) for j in jobs]


# --- the same rules as Actions expressions (rendered into the workflow) -----------------------

def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


SAME_REPO = "github.event.pull_request.head.repo.full_name == github.repository"


# The workflow's `plan` job (ci/github/workflow.py) runs `python -m ci plan` on the PR's diff and
# publishes the ids of the jobs it runs; a job it gates asks that list. Only GPU jobs are
# gated: the diff decides nothing for a CPU job, and they need not wait for it.
PLAN_JOB = "plan"
VERDICT_JOB = VERDICT_SESSION  # the PR's merge gate (ci/github/workflow.py renders it)
PLAN_OUTPUT = "jobs"
SHARDS_OUTPUT = "shards"
# A narrowed job's base: a PR's checkout is the merge commit, its first parent the base tip.
NARROW_BASE = "HEAD^1"


def gated_by_plan(job: Job) -> bool:
    """Whether the job waits for the plan job and runs on a PR only when its verdict says so."""
    return job.self_hosted and job.label is not None and not job.scheduled_only


def needs_plan(job: Job) -> bool:
    """Whether the job waits for the plan job: its verdict gates it, or its matrix is the
    shard count the plan publishes (output `shards`)."""
    return gated_by_plan(job) or (job.planned_shards and not job.scheduled_only)


def shard_matrix(jobs: Iterable[Job]) -> dict[str, dict[str, list[int]]]:
    """Each matrix job's matrix, as the plan job publishes it (output `shards`) and the workflow
    renders it where no plan ran (a push, a schedule, a dispatch): `shard` 1..K and `of` [K].
    Each leg carries K itself (`matrix.of`): no runner need supply the matrix's width."""
    return {j.id: {"shard": list(range(1, j.shards + 1)), "of": [j.shards]}
            for j in jobs if j.matrix and not j.scheduled_only}


def plan_term(job: Job) -> str:
    """The plan job's verdict on this job (its published list names it)."""
    # `|| '[]'`: a plan that failed publishes nothing, and fromJSON('') is an error.
    return (f"contains(fromJSON(needs.{PLAN_JOB}.outputs.{PLAN_OUTPUT} || '[]'), "
            f"{_quote(job.id)})")


def pr_terms(job: Job) -> list[str]:
    """When the job runs for a pull_request event: AND-ed terms, false for other events."""
    terms = ["github.event_name == 'pull_request'"]
    if job.label is None:
        return [*terms, "github.event.action != 'labeled'"]
    label = _quote(job.label)
    if job.self_hosted:
        terms.append(SAME_REPO)
    return [
        *terms,
        f"contains(github.event.pull_request.labels.*.name, {label})",
        f"(github.event.action != 'labeled' || github.event.label.name == {label})",
        *([plan_term(job)] if gated_by_plan(job) else []),
    ]


def schedule_term(job: Job) -> str | None:
    """When a scheduled run runs the job: one of its crons fired."""
    if not job.crons:
        return None
    crons = " || ".join(f"github.event.schedule == {_quote(c)}" for c in job.crons)
    return f"(github.event_name == 'schedule' && ({crons}))"


def condition_lines(job: Job) -> list[str]:
    """The job's `if:` expression, one operator per line (joined by spaces, it is `condition`)."""
    scheduled = schedule_term(job)
    if job.scheduled_only:
        return [scheduled or "false"]
    tail = [f"|| {scheduled}"] if scheduled else []
    if job.label is None:
        lines = ["(github.event_name != 'pull_request' && github.event_name != 'schedule')",
                 "|| (github.event_name == 'pull_request' && github.event.action != 'labeled')", *tail]
        if not needs_plan(job):
            return lines
        return ["!cancelled()", f"&& ({lines[0]}", *lines[1:-1], lines[-1] + ")"]
    first, *rest = pr_terms(job)
    and_lines = [f"&& {t}" for t in rest]
    lines = ["github.event_name == 'workflow_dispatch'", f"|| ({first}",
             *and_lines[:-1], and_lines[-1] + ")", *tail]
    if not needs_plan(job):
        return lines
    # A job with `needs:` is skipped whenever what it needs was, unless its `if:` calls a
    # status function: the plan job runs on pull requests only, and a push, a schedule or a
    # dispatch must still run this one (a sharded one with its committed count).
    return ["!cancelled()", f"&& ({lines[0]}", *lines[1:-1], lines[-1] + ")"]


def condition(job: Job) -> str:
    """The job's `if:` expression, equivalent to `decide`."""
    return " ".join(condition_lines(job))


# --- `python -m ci plan` ----------------------------------------------------------------------

def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_event(args: argparse.Namespace, jobs: Sequence[Job],
                schedules: Mapping[str, str] = DEFAULT_SCHEDULES,
                irrelevant: Sequence[str] = Style().gpu_irrelevant) -> Event:
    """Validate the command line into an Event."""
    cron = getattr(args, "cron", None)
    if (cron is not None) != (args.event == "schedule"):
        raise UsageError("--event schedule needs --cron '<the cron that fired>', and only it takes --cron")
    stray = [f"--{n.replace('_', '-')}" for n in ("comment", "actor", "association", "pr", "sha", "only",
                                                  "team_org")
             if getattr(args, n, None) is not None]
    if stray or getattr(args, "not_pr", False):
        raise UsageError(f"{', '.join(stray) or '--not-pr'} only apply to --event {COMMENT_EVENT}")
    labels = _split(args.labels)
    known = [*gating_labels(jobs), *getattr(args, "more_labels", ())]
    for label in labels + ([args.added] if args.added else []):
        if label.startswith(LABEL_PREFIX) and not _has(known, label):
            raise UsageError(f"unknown CI label {label!r}; known: {', '.join(known)}")
    action = args.action
    if args.added:
        if args.event != "pull_request":
            raise UsageError("--added only applies to --event pull_request")
        if action not in (None, "labeled"):
            raise UsageError(f"--added means a `labeled` event, not --action {action}")
        action = "labeled"
        if not _has(labels, args.added):
            labels.append(args.added)
    elif action == "labeled":
        raise UsageError("--action labeled needs --added LABEL (the label just added)")
    if args.event != "pull_request" and (labels or args.fork or action):
        raise UsageError(f"--labels, --fork and --action only apply to pull_request, "
                         f"not {args.event}")
    if args.event == "schedule":
        return Event(name="schedule", cron=cron, cadence=cadence_of(str(cron), schedules))
    paths = getattr(args, "changed_paths", None)
    if paths is not None and args.event != "pull_request":
        raise UsageError("--paths and --diff only apply to --event pull_request")
    skip = gpu_skip_reason(paths, irrelevant) if paths is not None else None
    tests = tuple(p for p in paths or () if is_test_file(p))
    return Event(name=args.event, action=action or "synchronize",
                 labels=frozenset(labels), added=args.added, from_fork=args.fork, gpu_skip=skip,
                 tests_only=tests if paths and len(tests) == len(paths) else ())


def _describe(event: Event) -> str:
    if event.name == "schedule":
        return f"schedule {event.cron!r} ({event.cadence})"
    if event.name != "pull_request":
        return event.name
    origin = "from a fork" if event.from_fork else "from this repository"
    labels = ", ".join(sorted(event.labels)) or "none"
    added = f" (added {event.added})" if event.added else ""
    return f"pull_request {event.action}{added}, {origin}; labels: {labels}"


def render_plan(event: Event, decisions: Sequence[Decision],
                entries: Mapping[str, str] | None = None) -> str:
    """The table `plan` prints; `entries`: job id -> "3 of 10 entries" where selection applied."""
    rows = [("job", "runner", "runs", "command", "why")]
    for d in decisions:
        shards = range(1, d.job.shards + 1) if d.job.matrix else [None]
        command = "; ".join(d.job.command(i) for i in shards) if d.runs else "-"
        some = (entries or {}).get(d.job.id)
        rows.append((d.job.id, ",".join(d.job.runs_on), "yes" if d.runs else "no", command,
                     d.why + (f"; {some}" if some else "")))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [f"event: {_describe(event)}", ""]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4]
              for r in rows]
    running = sum(d.runs for d in decisions)
    lines += ["", f"{running} of {len(decisions)} jobs run"]
    sized = [d.job for d in decisions if d.job.shards_why]
    if sized:
        lines += ["", "shards (ci/select/shard_count.py):"]
        lines += [f"  {j.id}: {j.shards} shard{'s' * (j.shards > 1)}: {j.shards_why}" for j in sized]
    return "\n".join(lines)


def read_paths(path: Path) -> list[str]:
    """Changed paths from a file: NUL-separated (`git diff -z`) or one a line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--paths-from {path}: cannot read it ({exc.__class__.__name__}); "
                         "pass a file of changed paths") from None
    return sorted({p for p in text.replace("\0", "\n").splitlines() if p.strip()})


def summary_markdown(event: Event, decisions: Sequence[Decision]) -> str:
    """The plan as the step summary shows it: every job, whether it runs, and why."""
    lines = [f"### CI plan: {_describe(event)}", "", "| job | runs | why |", "|---|---|---|"]
    lines += [f"| `{d.job.id}` | {'yes' if d.runs else '**skipped**'} | "
              f"{d.why.replace('|', chr(92) + '|')} |" for d in decisions]
    return "\n".join(lines)


def publish(event: Event, decisions: Sequence[Decision], log: Log) -> None:
    """The jobs that run, as the step output the gated jobs read; the reasons in the summary."""
    log.output(PLAN_OUTPUT, json.dumps([d.job.id for d in decisions if d.runs]))
    # The matrix of every sharded job, whether or not it runs (one that does not is skipped
    # by its `if:`; a matrix read as null would fail the run): the count this plan computed.
    log.output(SHARDS_OUTPUT, json.dumps(shard_matrix(d.job for d in decisions)))
    log.summary(summary_markdown(event, decisions))


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m ci plan",
        description="Show which CI jobs (nox sessions) an event would run, and why. "
                    "Reads the same table the workflow generator renders.",
        epilog="examples:\n"
               "  python -m ci plan --event pull_request --labels run-ci-megatron,run-ci-ckpt\n"
               "  python -m ci plan --event pull_request --labels run-ci-megatron "
               "--added documentation\n"
               "  python -m ci plan --event push",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--event", choices=[*get_args(EventName), COMMENT_EVENT],
                        default="pull_request", help="what triggered the run (default: pull_request)")
    comment = parser.add_argument_group("issue_comment (a PR comment command, see docs/workflow.md)")
    comment.add_argument("--comment", metavar="BODY", default=None, help="the comment's text")
    comment.add_argument("--actor", default=None, help="the commenter's login")
    comment.add_argument("--association", default=None,
                         help="the commenter's author_association (OWNER, MEMBER, NONE, ...)")
    comment.add_argument("--teams", default="", metavar="A,B",
                         help="team slugs the commenter belongs to, comma separated")
    comment.add_argument("--team-org", default=None, metavar="ORG",
                         help="look up the commenter's membership of the policy's teams in ORG "
                              "through GitHub's API (token: $SLIME_CI_TEAMS_TOKEN, org members:read; "
                              "API: $GITHUB_API_URL)")
    comment.add_argument("--no-fork", dest="fork", action="store_false", default=False,
                         help="the pull request comes from this repository (default)")
    comment.add_argument("--not-pr", action="store_true",
                         help="the comment is on an issue, not a pull request")
    comment.add_argument("--pr", type=int, default=None, help="pull request number")
    comment.add_argument("--sha", default=None, help="the pull request's exact head commit")
    one = parser.add_argument_group("workflow_dispatch of run-ci-file.yml (resolve before PR code runs)")
    one.add_argument("--suite", default=None, help="the suite to run on the PR's head")
    one.add_argument("--only", default=None, metavar="FILE", help="one registered file of that suite")
    parser.add_argument("--labels", default="", metavar="A,B",
                        help="labels on the pull request, comma separated")
    parser.add_argument("--action", choices=get_args(PullRequestAction), default=None,
                        help="pull_request activity (default: synchronize, a new commit)")
    parser.add_argument("--added", metavar="LABEL", default=None,
                        help="the label a `labeled` event just added (implies --action labeled)")
    parser.add_argument("--fork", action="store_true",
                        help="the pull request comes from a fork")
    parser.add_argument("--cron", default=None,
                        help="schedule only: the cron that fired (each maps to a cadence)")
    parser.add_argument("--paths", default=None, metavar="A,B",
                        help="pull_request: the files the PR changes (GPU jobs skip a diff of "
                             "GPU-irrelevant paths only)")
    parser.add_argument("--diff", default=None, metavar="BASE",
                        help="pull_request: read the changed files from `git diff BASE...HEAD`")
    parser.add_argument("--paths-from", type=Path, default=None, metavar="FILE",
                        help="pull_request: read the changed files from FILE, one a line or "
                             "NUL-separated (`git diff --name-only -z`)")
    parser.add_argument("--github", action="store_true",
                        help="in GitHub Actions: publish the running job ids as the step output "
                             f"`{PLAN_OUTPUT}` and the table (with each reason) in the step summary")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--history", metavar="URL", default=None,
                        help="size the suites with a target by this run-history store's p90 "
                             "durations (default: the committed tests/durations.json), and read "
                             "what each entry executed from it (default: SLIME_CI_HISTORY_URL, "
                             "else the checkout's store; entries it lacks: the records file)")
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="repository root whose registry is planned (default: .)")
    return parser


def _history_counts(root: Path, suites: Sequence[Suite], sessions: Sequence[Check | Smoke],
                    url: str | None, policy: ShardPolicy) -> dict[str, ShardCount] | None:
    """Shard counts from the history's p90 per entry (None: the committed durations decide).

    A smoke is sized by the committed durations alone: the history keeps its entries under
    their GPU suites, where runs on real GPUs and emulated ones, which take other times, mix."""
    if url is None:
        return None
    from ci.history.stats import estimates
    from ci.history.store import open_store

    try:
        with open_store(url, create=False) as store:
            p90 = {k: v for s in suites if s.target_minutes is not None
                   for k, v in estimates(store.attempts(suite=s.name)).items()}
    except StoreError as exc:
        # The plan job must still publish a matrix: the committed durations size it instead.
        print(f"warning: history: unavailable ({exc}); shard counts from the committed durations",
              file=sys.stderr)
        return None
    smokes = smokes_of(sessions)
    return {**suite_counts(root, suites, smokes=smokes, policy=policy),
            **suite_counts(root, suites, measured=p90, source="history p90", policy=policy)}


def main(argv: list[str]) -> int:
    """`python -m ci plan`: print the jobs an event would run."""
    args = _parser().parse_args(argv)
    root = existing_dir("--root", args.root)
    registry = load_registry(root)
    if args.event == COMMENT_EVENT:
        from ci.github.comment_reply import comment_main

        return comment_main(args, root, registry.suites)
    if args.suite is not None:
        from ci.github.comment_reply import resolve_main

        return resolve_main(args, root, registry.suites)
    jobs = table(registry.suites, registry.style, registry.sessions, root=root,
                 counts=_history_counts(root, registry.suites, registry.sessions, args.history,
                                        registry.sharding))
    given = [f for f, v in (("--paths", args.paths), ("--diff", args.diff),
                            ("--paths-from", args.paths_from)) if v is not None]
    if len(given) > 1:
        raise UsageError(f"pass one of --paths, --diff and --paths-from, not {' and '.join(given)}")
    args.changed_paths = _split(args.paths) if args.paths is not None else None
    if args.paths_from is not None:
        args.changed_paths = read_paths(args.paths_from)
    if args.diff is not None:
        from ci.select.changed import diff_vs_base

        merge_base, _, changes = diff_vs_base(root, args.diff)
        # A rename counts from both sides: moving code into docs/ still changes the code.
        args.changed_paths = sorted({p for c in changes for p in (c.path, c.old_path) if p})
    args.more_labels = (registry.selection.all_entries_label,)
    event = parse_event(args, jobs, registry.style.schedules, registry.style.gpu_irrelevant)
    decisions = plan(event, jobs)
    from ci.select.by_execution import whole_files
    from ci.select.job_entries import branch_changes, entries_by_job, json_fields

    diff = (branch_changes(root, merge_base) if args.diff is not None
            else whole_files(args.changed_paths) if args.changed_paths is not None else None)
    gpu_jobs = [(d.job.id, d.job.session) for d in decisions
                if d.runs and d.job.kind == "suite" and d.job.self_hosted]
    records = None
    if diff is not None and gpu_jobs:
        from ci.history.record import executed_records
        from ci.history.store import resolve_url

        records = executed_records(resolve_url(args.history, os.environ, root), root,
                                   warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    chosen = entries_by_job(root, registry, gpu_jobs, event.name, event.labels, diff, records=records)
    if args.github:
        publish(event, decisions, Log.from_env())
    if args.json:
        print(json.dumps([
            {"job": d.job.id, "session": d.job.session, "runs_on": list(d.job.runs_on),
             "runs": d.runs, "why": d.why, "shards": d.job.shards,
             **({"shards_why": d.job.shards_why} if d.job.shards_why else {}),
             "commands": [d.job.command(i) for i in range(1, d.job.shards + 1)]
             if d.job.matrix else
             [f"{d.job.command()} -- --by-executed {shlex.quote(NARROW_BASE)}"]
             if d.job.narrowed(event, registry.selection.all_entries_label) else [d.job.command()],
             **json_fields(chosen.get(d.job.id))}
            for d in decisions
        ], indent=2))
    else:
        print(render_plan(event, decisions, {j: c.summary() for j, c in chosen.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
