"""The trigger table and `python -m ci plan`: which session runs, on which runner, when."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO as ROOT

from ci.errors import UsageError
from ci.github.job_plan import (
    GPU_RUNNER,
    HOSTED_RUNNER,
    Event,
    decide,
    gating_labels,
    job_for,
    main,
    plan,
    table,
)
from ci.registry import Suite
from ci.registry.repo_suites import SUITES

NUM_GPUS = 0



def _running(event: Event) -> set[str]:
    return {d.job.id for d in plan(event, table()) if d.runs}


CPU_JOBS = {"cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke"}


def test_one_job_per_suite_plus_lint_on_the_right_runner() -> None:
    jobs = table()
    assert [j.id for j in jobs] == [s.name for s in SUITES] + [
        "lint", "gpu_smoke", "megatron_stability", "gpu_smoke_nightly", "actions_real", "mutation", "plants",
        "lock_check",
        "monitor"]
    nightly = next(j for j in jobs if j.id == "gpu_smoke_nightly")
    assert nightly.scheduled_only and nightly.crons and nightly.kind == "smoke"
    for job, suite in zip(jobs, SUITES, strict=False):
        assert job.session == suite.name
        assert job.runs_on == (GPU_RUNNER if suite.tier == "gpu" else HOSTED_RUNNER)
        assert job.label == suite.label
    assert {j.id for j in jobs if not j.self_hosted and not j.scheduled_only} == CPU_JOBS
    jobs = tuple(j for j in jobs if not j.scheduled_only)
    assert gating_labels(jobs) == sorted(
        ["run-ci-sglang-config", "run-ci-megatron", "run-ci-precision", "run-ci-ckpt",
         "run-ci-image", "run-ci-changed"])
    # Only the diff-driven session needs the whole history.
    assert [j.id for j in jobs if j.full_history] == ["changed"]


def test_push_runs_cpu_jobs_only_and_dispatch_runs_everything() -> None:
    assert _running(Event(name="push")) == CPU_JOBS
    assert _running(Event(name="workflow_dispatch")) == {j.id for j in table() if not j.scheduled_only}


def test_pull_request_runs_cpu_jobs_and_the_labelled_gpu_jobs() -> None:
    event = Event(name="pull_request", labels=frozenset({"run-ci-megatron", "run-ci-ckpt", "wip"}))
    assert _running(event) == CPU_JOBS | {"megatron", "ckpt"}
    assert _running(Event(name="pull_request", action="opened")) == CPU_JOBS


def test_fork_pull_requests_never_reach_self_hosted_runners() -> None:
    labels = frozenset(gating_labels(table()))
    assert _running(Event(name="pull_request", labels=labels, from_fork=True)) == CPU_JOBS
    added = Event(name="pull_request", action="labeled", labels=labels, added="run-ci-megatron",
                  from_fork=True)
    assert _running(added) == set()
    why = {d.job.id: d.why for d in plan(added, table())}
    assert "fork" in why["megatron"]


def test_labeled_event_starts_only_the_job_of_the_added_label() -> None:
    labels = frozenset({"run-ci-megatron", "run-ci-ckpt"})
    added = Event(name="pull_request", action="labeled", labels=labels, added="run-ci-ckpt")
    assert _running(added) == {"ckpt"}
    unrelated = Event(name="pull_request", action="labeled", labels=labels | {"documentation"},
                      added="documentation")
    assert _running(unrelated) == set()
    megatron = next(j for j in table() if j.id == "megatron")
    assert "documentation" in decide(megatron, unrelated).why


def test_labels_compare_case_insensitively_as_actions_does() -> None:
    event = Event(name="pull_request", action="labeled", labels=frozenset({"Run-CI-Megatron"}),
                  added="RUN-CI-MEGATRON")
    assert _running(event) == {"megatron"}


def test_registry_mistakes_are_reported_as_fixable_errors() -> None:
    unlabelled = Suite(name="gpu_x", tier="gpu", purpose="p", profile="e2e")
    with pytest.raises(UsageError, match=r"no label.*ci/registry/repo_suites\.py"):
        job_for(unlabelled)
    with pytest.raises(UsageError, match="shards"):
        job_for(Suite(name="s", tier="gpu", purpose="p", profile="e2e", label="run-ci-s",
                      shards=0))
    lint_twin = Suite(name="lint", tier="cpu", purpose="p", profile="cpu")
    with pytest.raises(UsageError, match="two CI jobs named lint"):
        table((*SUITES, lint_twin))


def test_sharded_job_commands() -> None:
    suite = Suite(name="big", tier="gpu", purpose="p", profile="e2e", label="run-ci-big",
                  shards=4)
    job = job_for(suite)
    assert job.command() == "nox -s big"
    assert job.command(2) == "nox -s big -- --shard 2/4"


def test_plan_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--event", "pull_request", "--labels", "run-ci-megatron,run-ci-ckpt"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.splitlines()[3:] if line.strip()}
    assert rows["megatron"][1:4] == ["self-hosted,gpu", "yes", "nox"]
    assert rows["precision"][2] == "no"
    assert rows["cpu_unit"][1:3] == ["ubuntu-latest", "yes"]
    assert "7 of 18 jobs run" in out


def test_plan_command_json_and_added_label(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--labels", "run-ci-megatron", "--added", "run-ci-ckpt", "--json"]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert [j for j, r in rows.items() if r["runs"]] == ["ckpt"]
    # A PR runs the entries its diff reaches; the all-entries label runs every one.
    assert rows["ckpt"]["commands"] == ["nox -s ckpt -- --by-executed 'HEAD^1'"]
    assert rows["megatron"]["runs"] is False
    assert main(["--labels", "run-ci-ckpt,run-ci-all-entries", "--json"]) == 0
    every = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert every["ckpt"]["commands"] == ["nox -s ckpt"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--labels", "run-ci-megatorn"], "unknown CI label 'run-ci-megatorn'; known: "),
    (["--event", "push", "--labels", "run-ci-megatron"], "only apply to pull_request"),
    (["--action", "labeled"], "--action labeled needs --added"),
    (["--action", "opened", "--added", "run-ci-ckpt"], "not --action opened"),
    (["--event", "workflow_dispatch", "--added", "run-ci-ckpt"], "--added only applies"),
])
def test_plan_command_rejects_bad_input(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        main(argv)


def test_plan_through_python_m_ci_exits_2_with_one_line_on_a_typo() -> None:
    ok = subprocess.run([sys.executable, "-m", "ci", "plan", "--event", "push"], cwd=ROOT,
                        capture_output=True, text=True, timeout=60, check=False)
    assert ok.returncode == 0, ok.stderr
    assert "event: push" in ok.stdout
    assert "5 of 18 jobs run" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "ci", "plan", "--labels", "run-ci-nope"],
                         cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert bad.returncode == 2
    assert bad.stderr.count("\n") == 1
    assert bad.stderr.startswith("error: unknown CI label 'run-ci-nope'")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
