"""The job table's rules one branch at a time: what each event decides and says, how
`python -m ci plan` reads its flags and prints its table, and the registry mistakes it refuses."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.errors import UsageError
from ci.github.job_plan import (
    Event,
    Job,
    check_job,
    condition_lines,
    decide,
    job_for,
    main,
    parse_event,
    plan,
    render_plan,
    stability_job,
    table,
)
from ci.registry import Check, Smoke, SmokeRun, Suite
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style

NUM_GPUS = 0

NIGHTLY, WEEKLY = "0 2 * * *", "0 3 * * 0"
SCHEDULES = {NIGHTLY: "nightly", WEEKLY: "weekly"}
GPU = Suite(name="gpu_a", tier="gpu", purpose="p", profile="e2e", label="run-ci-a", shards=2)
GPU_B = Suite(name="gpu_b", tier="gpu", purpose="p", profile="e2e", label="run-ci-b")
CPU = Suite(name="cpu_a", tier="cpu", purpose="p", profile="cpu")
STYLE = Style(schedules=SCHEDULES, stability_suite="gpu_a", stability_minutes=30,
              job_ids={"cpu_a": "unit"})


# This table's own sessions (the registry's SESSIONS run this repository's suites).
SESSIONS = (Check(name="lint", every_event=True, purpose="p", profiles=("lint",), commands=(("ruff",),)),
            Smoke(name="gpu_smoke", purpose="p", profiles=("e2e",), runs=(SmokeRun(suite="gpu_a"),)))


def _jobs() -> tuple[Job, ...]:
    return table((CPU, GPU, GPU_B), STYLE, SESSIONS)


def _job(job_id: str) -> Job:
    return next(j for j in _jobs() if j.id == job_id)


def _why(job_id: str, event: Event) -> tuple[bool, str]:
    d = decide(_job(job_id), event)
    return d.runs, d.why


# --- the table --------------------------------------------------------------------------------


def test_the_table_follows_the_style() -> None:
    jobs = _jobs()
    assert [j.id for j in jobs] == ["unit", "gpu_a", "gpu_b", "lint", "gpu_smoke", "gpu_a_stability"]
    unit = _job("unit")
    assert (unit.session, unit.runs_on, unit.label, unit.shards) == ("cpu_a", ("ubuntu-latest",), None, 1)
    assert _job("gpu_a").runs_on == STYLE.gpu_runner and _job("gpu_a").self_hosted
    assert not unit.self_hosted


def test_an_adopting_repository_gets_its_check_job_instead_of_lint_and_smoke() -> None:
    style = Style(own_jobs=False, check_job="workflow_check", schedules={}, stability_suite=None)
    jobs = table((CPU,), style)
    assert [j.id for j in jobs] == ["cpu_a", "workflow_check"]
    check = jobs[1]
    assert check == check_job("workflow_check", style)
    assert (check.session, check.tier, check.runs_on, check.label) == ("workflows", "cpu",
                                                                       ("ubuntu-latest",), None)
    assert table((CPU,), Style(own_jobs=False, schedules={}, stability_suite=None)) == (job_for(CPU),)


def test_jobs_take_the_crons_of_their_cadences() -> None:
    # GPU suites run nightly and weekly by default; CPU suites on no schedule.
    assert _job("gpu_a").crons == (NIGHTLY, WEEKLY)
    assert _job("unit").crons == ()
    stability = _job("gpu_a_stability")
    assert stability.crons == (WEEKLY,) and stability.scheduled_only and stability.infinite
    assert stability.minutes > 30 and stability.session == "gpu_a" and stability.runs_on == STYLE.gpu_runner
    assert "at most 30 minutes" in stability.purpose


def test_the_stability_job_is_optional_and_checked() -> None:
    assert stability_job((CPU, GPU), Style(stability_suite=None)) is None
    assert stability_job((CPU, GPU), Style(stability_suite="gpu_a", schedules={})) is None
    # The default names this repository's suite; a registry without it has no such job.
    assert stability_job((CPU,), Style()) is None
    for name in ("cpu_a", "nope"):
        with pytest.raises(UsageError, match=re.escape(f"stability_suite'] = '{name}': not a GPU suite")):
            stability_job((CPU, GPU), Style(stability_suite=name))
    for minutes in (0, 10_000):
        with pytest.raises(UsageError, match=re.escape("stability_minutes'] must be 1..")):
            stability_job((GPU,), Style(stability_suite="gpu_a", stability_minutes=minutes))
    assert stability_job((GPU,), Style(stability_suite="gpu_a", stability_minutes=1)) is not None


def test_every_suite_of_the_registry_is_planned() -> None:
    assert [j.session for j in table()][:len(SUITES)] == [s.name for s in SUITES]


# --- decisions --------------------------------------------------------------------------------


def test_schedules_run_the_jobs_of_their_cron_only() -> None:
    nightly = Event(name="schedule", cron=NIGHTLY, cadence="nightly")
    assert _why("gpu_a", nightly) == (True, f"the nightly schedule ({NIGHTLY}) runs it")
    assert _why("unit", nightly) == (False, "the nightly schedule does not run it")
    assert _why("gpu_a_stability", nightly) == (False, "the nightly schedule does not run it")
    weekly = Event(name="schedule", cron=WEEKLY, cadence="weekly")
    assert _why("gpu_a_stability", weekly) == (True, f"the weekly schedule ({WEEKLY}) runs it")


def test_the_scheduled_only_job_never_runs_otherwise() -> None:
    for event in (Event(name="workflow_dispatch"), Event(name="push"),
                  Event(name="pull_request", labels=frozenset({"run-ci-a"}))):
        assert _why("gpu_a_stability", event) == (False, f"only its schedule runs it ({WEEKLY})")


def test_dispatch_push_and_plain_pull_requests() -> None:
    assert _why("gpu_b", Event(name="workflow_dispatch")) == (True, "manual dispatch runs every job")
    assert _why("unit", Event(name="push")) == (True, "every push to main runs it")
    assert _why("gpu_b", Event(name="push")) == (False, "pushes run no labelled job (it runs on label "
                                                        "run-ci-b)")
    assert _why("unit", Event(name="pull_request")) == (True, "every pull request to main runs it")
    assert _why("unit", Event(name="pull_request", action="labeled", added="x")) == (
        False, "a new label adds no commit: this commit's run already has it")
    assert _why("gpu_b", Event(name="pull_request")) == (False, "the PR lacks label run-ci-b")
    # A CPU job runs for a fork's pull request; a self-hosted one never does.
    assert _why("unit", Event(name="pull_request", from_fork=True))[0]
    assert _why("gpu_b", Event(name="pull_request", labels=frozenset({"run-ci-b"}), from_fork=True)) == (
        False, "self-hosted runners never run pull requests from forks")


def test_a_label_event_runs_only_the_job_of_the_added_label() -> None:
    both = frozenset({"run-ci-a", "run-ci-b"})
    assert _why("gpu_b", Event(name="pull_request", action="labeled", labels=both, added="run-ci-a")) == (
        False, "adding run-ci-a leaves this job alone (it runs on label run-ci-b)")
    assert _why("gpu_b", Event(name="pull_request", action="labeled", labels=both, added=None)) == (
        False, "adding None leaves this job alone (it runs on label run-ci-b)")
    assert _why("gpu_b", Event(name="pull_request", action="labeled", labels=both, added="RUN-CI-B")) == (
        True, "the PR has label run-ci-b")
    assert _why("gpu_b", Event(name="pull_request", action="opened", labels=both)) == (
        True, "the PR has label run-ci-b")


def test_a_gpu_irrelevant_diff_skips_gpu_jobs_and_a_tests_only_diff_is_named() -> None:
    skip = Event(name="pull_request", labels=frozenset({"run-ci-b"}), gpu_skip="docs only")
    assert _why("gpu_b", skip) == (False, "docs only")
    assert _why("unit", skip) == (True, "every pull request to main runs it")
    changed = Job(id="changed", session="changed", tier="gpu", purpose="p", runs_on=("ubuntu-latest",),
                  label="run-ci-changed", full_history=True)
    tests = Event(name="pull_request", labels=frozenset({"run-ci-changed"}),
                  tests_only=("tests/test_a.py", "tests/test_b.py"))
    assert decide(changed, tests).why == ("the PR has label run-ci-changed and changes only tests: runs "
                                          "only tests/test_a.py, tests/test_b.py")
    assert decide(_job("gpu_b"), Event(name="pull_request", labels=frozenset({"run-ci-b"}),
                                       tests_only=("tests/test_a.py",))).why == "the PR has label run-ci-b"
    # The GPU-irrelevant skip is for self-hosted jobs only.
    assert decide(changed, Event(name="pull_request", labels=frozenset({"run-ci-changed"}),
                                 gpu_skip="docs only")).runs


# --- `python -m ci plan`'s flags --------------------------------------------------------------


def _args(**given: object) -> argparse.Namespace:
    base: dict[str, object] = {"event": "pull_request", "labels": "", "added": None, "action": None,
                               "fork": False, "cron": None}
    return argparse.Namespace(**(base | given))


def _event(**given: object) -> Event:
    return parse_event(_args(**given), _jobs(), SCHEDULES)


def test_labels_are_split_on_commas_and_stripped() -> None:
    event = _event(labels=" run-ci-a , ,wip,")
    assert event.labels == frozenset({"run-ci-a", "wip"})
    assert (event.name, event.action, event.added, event.from_fork) == ("pull_request", "synchronize",
                                                                         None, False)


def test_an_added_label_is_a_labeled_event_and_is_on_the_pr() -> None:
    event = _event(labels="run-ci-a", added="run-ci-b")
    assert (event.action, event.added, event.labels) == ("labeled", "run-ci-b",
                                                          frozenset({"run-ci-a", "run-ci-b"}))
    # Already among the labels (in another case): not added twice.
    assert _event(labels="RUN-CI-B", added="run-ci-b").labels == frozenset({"RUN-CI-B"})
    assert _event(added="run-ci-b", action="labeled").action == "labeled"


def test_a_schedule_event_is_its_cron_and_cadence() -> None:
    assert _event(event="schedule", cron=WEEKLY) == Event(name="schedule", cron=WEEKLY, cadence="weekly")


@pytest.mark.parametrize(("given", "message"), [
    ({"event": "schedule"}, "--event schedule needs --cron"),
    ({"cron": NIGHTLY}, "only it takes --cron"),
    ({"comment": "/help"}, "--comment only apply to --event issue_comment"),
    ({"actor": "a", "sha": "b"}, "--actor, --sha only apply to --event issue_comment"),
    ({"association": "x"}, "--association only apply"),
    ({"pr": 3}, "--pr only apply"),
    ({"only": "tests/a.py"}, "--only only apply"),
    ({"not_pr": True}, "--not-pr only apply to --event issue_comment"),
    ({"labels": "run-ci-c"}, "unknown CI label 'run-ci-c'; known: run-ci-a, run-ci-b"),
    ({"added": "run-ci-zz"}, "unknown CI label 'run-ci-zz'"),
    ({"event": "push", "added": "wip"}, "--added only applies to --event pull_request"),
    ({"added": "wip", "action": "opened"}, "--added means a `labeled` event, not --action opened"),
    ({"action": "labeled"}, "--action labeled needs --added LABEL"),
    ({"event": "push", "labels": "wip"}, "--labels, --fork and --action only apply to pull_request, not push"),
    ({"event": "push", "fork": True}, "only apply to pull_request, not push"),
    ({"event": "workflow_dispatch", "action": "opened"}, "not workflow_dispatch"),
    ({"event": "push", "changed_paths": ["a.md"]}, "--paths and --diff only apply to --event pull_request"),
])
def test_flags_that_do_not_fit_the_event_are_refused(given: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError) as info:
        _event(**given)
    assert message in str(info.value)


def test_a_label_without_the_ci_prefix_is_any_label() -> None:
    assert _event(labels="documentation,Run-CI-A").labels == frozenset({"documentation", "Run-CI-A"})


def test_the_changed_paths_decide_the_gpu_skip_and_tests_only() -> None:
    docs = _event(labels="run-ci-a", changed_paths=["docs/a.md", "README.md"])
    assert docs.gpu_skip is not None and "2 file(s)" in docs.gpu_skip and docs.tests_only == ()
    tests = _event(changed_paths=["tests/test_a.py", "tests/utils/test_b.py"])
    assert tests.gpu_skip is None and tests.tests_only == ("tests/test_a.py", "tests/utils/test_b.py")
    mixed = _event(changed_paths=["tests/test_a.py", "slime/x.py"])
    assert mixed.gpu_skip is None and mixed.tests_only == ()
    none = _event(changed_paths=[])
    assert none.gpu_skip is None and none.tests_only == ()
    assert _event().tests_only == () and _event().gpu_skip is None


# --- the printed plan -------------------------------------------------------------------------


def test_the_table_lines_up_and_lists_every_shard() -> None:
    event = Event(name="pull_request", labels=frozenset({"run-ci-a"}))
    text = render_plan(event, plan(event, _jobs()))
    lines = text.splitlines()
    assert lines[0] == "event: pull_request synchronize, from this repository; labels: run-ci-a"
    assert lines[1] == ""
    header = lines[2]
    assert header.split() == ["job", "runner", "runs", "command", "why"]
    gpu_a = next(line for line in lines if line.startswith("gpu_a "))
    assert "nox -s gpu_a -- --shard 1/2; nox -s gpu_a -- --shard 2/2" in gpu_a
    gpu_b = next(line for line in lines if line.startswith("gpu_b "))
    # Columns line up: each starts where its header does.
    for column in ("runner", "runs", "command"):
        at = header.index(column)
        assert gpu_a[at - 2:at] == "  " and gpu_a[at] != " ", column
        assert gpu_b[at - 2:at] == "  " and gpu_b[at] != " ", column
    assert gpu_b[header.index("runs"):].startswith("no ")
    assert gpu_b[header.index("command"):].split("  ")[0] == "-"
    assert gpu_b.endswith("  the PR lacks label run-ci-b")
    assert lines[-2:] == ["", "4 of 6 jobs run"]


@pytest.mark.parametrize(("event", "described"), [
    (Event(name="push"), "push"),
    (Event(name="workflow_dispatch"), "workflow_dispatch"),
    (Event(name="schedule", cron=NIGHTLY, cadence="nightly"), f"schedule '{NIGHTLY}' (nightly)"),
    (Event(name="pull_request", action="labeled", added="run-ci-b", from_fork=True,
           labels=frozenset({"run-ci-b", "a"})),
     "pull_request labeled (added run-ci-b), from a fork; labels: a, run-ci-b"),
    (Event(name="pull_request", action="opened"), "pull_request opened, from this repository; labels: none"),
])
def test_the_event_line_says_what_happened(event: Event, described: str) -> None:
    assert render_plan(event, []).splitlines() == [f"event: {described}", "", "job  runner  runs  command  why",
                                                   "", "0 of 0 jobs run"]


def _repo(tmp_path: Path) -> Path:
    """A git repository with one commit on main and a branch that changes two files."""
    def git(*argv: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=tmp_path,
                       check=True, capture_output=True, timeout=60)

    git("init", "-q", "-b", "main")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-q", "-m", "base")
    git("checkout", "-q", "-b", "work")
    (tmp_path / "docs").mkdir()
    git("mv", "a.py", "docs/a.md")
    (tmp_path / "README.md").write_text("hi\n")
    git("add", "-A")
    git("commit", "-q", "-m", "work")
    return tmp_path


def test_plan_reads_the_diff_with_renames_from_both_sides(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    root = _repo(tmp_path)
    # The rename moves code into docs/: a.py still counts, so the GPU job is not skipped.
    assert main(["--root", str(root), "--diff", "main", "--labels", "run-ci-megatron", "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["megatron"]["runs"] is True
    assert main(["--root", str(root), "--paths", "docs/a.md,README.md", "--labels", "run-ci-megatron",
                 "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["megatron"]["runs"] is False
    assert rows["megatron"]["why"].startswith("the diff touches only GPU-irrelevant paths (2 file(s)")
    with pytest.raises(UsageError, match="not --paths and --diff"):
        main(["--root", str(root), "--paths", "a", "--diff", "main"])


def test_plan_json_lists_each_job_with_its_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--event", "push", "--json", "--root", str(REPO)]) == 0
    rows = json.loads(capsys.readouterr().out)
    first = rows[0]
    assert list(first) == ["job", "session", "runs_on", "runs", "why", "shards", "commands"]
    assert first["shards"] == 1
    assert first["job"] == SUITES[0].name and first["session"] == SUITES[0].name
    assert first["commands"] == [f"nox -s {SUITES[0].name}"]
    assert isinstance(first["runs_on"], list)


def test_condition_lines_join_into_one_operator_per_line() -> None:
    lines = condition_lines(_job("gpu_b"))
    # A GPU job needs the plan job, so its `if:` opens with a status function (ci.github.job_plan).
    assert lines[0] == "!cancelled()"
    assert lines[1] == "&& (github.event_name == 'workflow_dispatch'"
    assert lines[2] == "|| (github.event_name == 'pull_request'"
    assert all(line.startswith("&& ") for line in lines[3:-1])
    assert lines[-1].startswith("|| (github.event_name == 'schedule' && (github.event.schedule == ")
    assert lines[-1].endswith(")")
    assert condition_lines(_job("gpu_a_stability")) == [
        f"(github.event_name == 'schedule' && (github.event.schedule == '{WEEKLY}'))"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
