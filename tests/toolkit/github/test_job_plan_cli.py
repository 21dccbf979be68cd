"""`python -m ci plan` flag by flag, run in this process: what each flag changes in the plan,
the step output and summary `--github` writes, and the registry of an adopting repository
(its job ids, shards, sessions, schedules and GPU-irrelevant paths) reaching the plan."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.errors import UsageError
from ci.github.job_plan import (
    Event,
    Job,
    condition_lines,
    decide,
    gated_by_plan,
    job_for,
    main,
    monitor_job,
    parse_event,
    pr_terms,
    read_paths,
    render_plan,
    session_job,
    stability_job,
    summary_markdown,
    table,
)
from ci.registry import Check, Smoke, SmokeRun, Suite
from ci.registry.cadences import DEFAULT_SCHEDULES
from ci.registry.job_timeouts import LINT_MINUTES, MAX_MINUTES, SETUP_MINUTES, suite_minutes
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style

NUM_GPUS = 0

NIGHTLY = "0 5 * * *"
TOOLKIT_NIGHTLY = next(c for c, n in DEFAULT_SCHEDULES.items() if n == "nightly")
SHA = "0123456789abcdef0123456789abcdef01234567"

# An adopting repository's registry: its own job ids, a sharded GPU suite, its own lint-like
# session, its own crons and its own GPU-irrelevant folder (none of them the toolkit's).
ADOPTED = '''\
from ci.registry import Check, Suite

SUITES = (
    Suite(name="unit", tier="cpu", purpose="p", profile="cpu"),
    Suite(name="big", tier="gpu", purpose="p", profile="e2e", label="run-ci-big", shards=2),
)
SESSIONS = (Check(name="style", every_event=True, purpose="p", profiles=("lint",), commands=(("ruff",),)),)
WORKFLOW = {"schedules": {"0 5 * * *": "nightly", "0 6 * * 1": "weekly"}, "job_ids": {"unit": "unit_tests"},
            "stability_suite": None, "gpu_irrelevant": ("notes/",)}
'''


@pytest.fixture
def adopted(tmp_path: Path) -> Path:
    (tmp_path / ".slime-ci").mkdir()
    (tmp_path / ".slime-ci" / "suites.py").write_text(ADOPTED, encoding="utf-8")
    return tmp_path


def _json(capsys: pytest.CaptureFixture[str], *argv: str, root: Path = REPO) -> dict[str, Any]:
    assert main([*argv, "--root", str(root), "--json"]) == 0
    return {r["job"]: r for r in json.loads(capsys.readouterr().out)}


def _runs(capsys: pytest.CaptureFixture[str], *argv: str, root: Path = REPO) -> set[str]:
    return {job for job, row in _json(capsys, *argv, root=root).items() if row["runs"]}


# --- an adopting repository's registry ------------------------------------------------------


def test_the_plan_uses_the_adopters_jobs_sessions_and_shards(adopted: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    rows = _json(capsys, "--labels", "run-ci-big", root=adopted)
    assert list(rows) == ["unit_tests", "big", "style"]
    assert rows["unit_tests"]["session"] == "unit"
    assert rows["big"]["commands"] == ["nox -s big -- --shard 1/2", "nox -s big -- --shard 2/2"]
    assert rows["style"]["commands"] == ["nox -s style"]
    assert all(r["runs"] for r in rows.values())


def test_the_adopters_crons_and_irrelevant_paths_decide(adopted: Path, tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert _runs(capsys, "--event", "schedule", "--cron", NIGHTLY, root=adopted) == {"big"}
    # The toolkit's nightly cron is not one of theirs.
    with pytest.raises(UsageError, match="maps to no cadence"):
        main(["--event", "schedule", "--cron", TOOLKIT_NIGHTLY, "--root", str(adopted)])
    why = _json(capsys, "--labels", "run-ci-big", "--paths", "notes/a.txt", root=adopted)["big"]["why"]
    assert why == ("the diff touches only GPU-irrelevant paths (1 file(s) under notes/): "
                   "GPU job skipped")
    # docs/ is GPU-irrelevant by the toolkit's default, not by theirs.
    assert "big" in _runs(capsys, "--labels", "run-ci-big", "--paths", "docs/a.md", root=adopted)


def test_the_json_is_indented_for_a_reader(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--event", "push", "--json", "--root", str(REPO)]) == 0
    out = capsys.readouterr().out
    assert out.startswith('[\n  {\n    "job": ')


# --- the flags, each changing the plan ------------------------------------------------------


def test_fork_and_no_fork(capsys: pytest.CaptureFixture[str]) -> None:
    labelled = ("--labels", "run-ci-megatron")
    assert "megatron" in _runs(capsys, *labelled)
    fork = _json(capsys, *labelled, "--fork")["megatron"]
    assert (fork["runs"], fork["why"]) == (False, "self-hosted runners never run pull requests from forks")
    # The last of the two wins, as for any pair of on/off flags.
    assert "megatron" in _runs(capsys, *labelled, "--fork", "--no-fork")
    assert "megatron" not in _runs(capsys, *labelled, "--no-fork", "--fork")


def test_cron_and_action_flags(capsys: pytest.CaptureFixture[str]) -> None:
    nightly = _json(capsys, "--event", "schedule", "--cron", TOOLKIT_NIGHTLY)
    assert nightly["megatron"]["runs"] and not nightly["image"]["runs"]
    opened = _json(capsys, "--labels", "run-ci-ckpt", "--action", "opened")
    assert opened["ckpt"]["runs"] and opened["cpu_unit"]["runs"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--event", "release"], "argument --event: invalid choice: 'release' (choose from 'pull_request', "
                             "'push', 'workflow_dispatch', 'schedule', 'issue_comment')"),
    (["--action", "closed"], "argument --action: invalid choice: 'closed' (choose from 'opened', "
                             "'synchronize', 'reopened', 'labeled')"),
    # On/off flags take no value.
    (["--not-pr", "x"], "unrecognized arguments: x"),
    (["--github", "yes"], "unrecognized arguments: yes"),
    (["--fork", "yes"], "unrecognized arguments: yes"),
    (["--no-fork", "yes"], "unrecognized arguments: yes"),
])
def test_values_the_parser_refuses(argv: list[str], message: str) -> None:
    with pytest.raises(UsageError) as info:
        main([*argv, "--root", str(REPO)])
    assert str(info.value) == f"{message} (see `python -m ci plan --help`)"


def test_help_names_every_value_and_group(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m ci plan ")
    for shown in ("--labels A,B", "--teams A,B", "--added LABEL", "--paths A,B", "--diff BASE",
                  "--paths-from FILE", "--comment BODY", "--only FILE", "--team-org ORG",
                  "--event {pull_request,push,workflow_dispatch,schedule,issue_comment}",
                  "--action {opened,synchronize,reopened,labeled}",
                  "\nissue_comment (a PR comment command, see docs/workflow.md):\n",
                  "\nworkflow_dispatch of run-ci-file.yml (resolve before PR code runs):\n",
                  # The examples keep their lines (a raw description formatter).
                  "\nexamples:\n  python -m ci plan --event pull_request --labels run-ci-megatron,run-ci-ckpt\n"):
        assert shown in out, shown


def test_a_missing_root_is_named_by_its_flag(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        main(["--root", str(tmp_path / "nope")])
    assert str(info.value) == f"--root {tmp_path / 'nope'}: does not exist; pass the repository root"


def test_two_sources_of_paths_are_refused(tmp_path: Path) -> None:
    listed = tmp_path / "paths"
    listed.write_text("a\n", encoding="utf-8")
    with pytest.raises(UsageError) as info:
        main(["--paths", "a", "--paths-from", str(listed), "--diff", "main", "--root", str(REPO)])
    assert str(info.value) == "pass one of --paths, --diff and --paths-from, not --paths and --diff and --paths-from"


# --- --paths-from and --diff ----------------------------------------------------------------


def test_read_paths_takes_nul_or_newline_separated_names(tmp_path: Path) -> None:
    listed = tmp_path / "paths"
    listed.write_bytes(b"docs/b.md\0README.md\0docs/b.md\0\0")
    assert read_paths(listed) == ["README.md", "docs/b.md"]
    listed.write_text("slime/x.py\n\n  \ndocs/é.md\n", encoding="utf-8")
    assert read_paths(listed) == ["docs/é.md", "slime/x.py"]


def test_read_paths_reads_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """`git diff` names are UTF-8 bytes; a runner whose locale is C must not refuse them."""
    import locale

    if sys.flags.utf8_mode:
        pytest.skip("Python's UTF-8 mode is on here: every locale reads files as UTF-8")
    listed = tmp_path / "paths"
    listed.write_text("docs/é.md\n", encoding="utf-8")
    saved = locale.setlocale(locale.LC_CTYPE)
    try:
        locale.setlocale(locale.LC_CTYPE, "C")
        if locale.getencoding().lower().replace("-", "") == "utf8":
            pytest.skip("this C library's C locale is UTF-8")
        assert read_paths(listed) == ["docs/é.md"]
    finally:
        locale.setlocale(locale.LC_CTYPE, saved)


def test_read_paths_says_what_is_wrong_with_the_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as info:
        read_paths(tmp_path / "none")
    assert str(info.value) == (f"--paths-from {tmp_path / 'none'}: cannot read it (FileNotFoundError); "
                               "pass a file of changed paths")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe docs")
    with pytest.raises(UsageError, match=r"cannot read it \(UnicodeDecodeError\)"):
        read_paths(binary)


def test_paths_from_a_file_decide_the_gpu_jobs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = tmp_path / "paths"
    listed.write_bytes(b"docs/a.md\0README.md\0")
    row = _json(capsys, "--labels", "run-ci-megatron", "--paths-from", str(listed))["megatron"]
    assert not row["runs"] and "(2 file(s) under" in row["why"]
    listed.write_text("docs/a.md\nslime/x.py\n", encoding="utf-8")
    assert "megatron" in _runs(capsys, "--labels", "run-ci-megatron", "--paths-from", str(listed))


def _git(root: Path, *argv: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *argv], cwd=root, check=True,
                   capture_output=True, timeout=60)


def test_a_docs_only_diff_skips_the_gpu_job(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _git(tmp_path, "init", "-q", "-b", "main")
    (tmp_path / "a.py").write_text("x = 1\n", encoding="utf-8")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "base")
    _git(tmp_path, "checkout", "-q", "-b", "work")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("how to\n", encoding="utf-8")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "docs")
    row = _json(capsys, "--diff", "main", "--labels", "run-ci-megatron", root=tmp_path)["megatron"]
    assert not row["runs"] and row["why"].startswith("the diff touches only GPU-irrelevant paths (1 file(s)")


# --- --github: the step output the gated jobs read, and the summary -------------------------


def test_github_publishes_the_running_jobs_and_the_reasons(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    output, summary = tmp_path / "output", tmp_path / "summary"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert main(["--labels", "run-ci-megatron", "--paths", "docs/a.md", "--github", "--root", str(REPO)]) == 0
    capsys.readouterr()
    line, shards = output.read_text(encoding="utf-8").splitlines()
    assert line == 'jobs=["cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke"]'
    # Every matrix job's shards, gpu_smoke's target met by one: the matrices the jobs read.
    assert shards == ('shards={"toolkit": {"shard": [1, 2, 3], "of": [3]}, '
                      '"gpu_smoke": {"shard": [1], "of": [1]}}')
    lines = summary.read_text(encoding="utf-8").splitlines()
    assert lines[:4] == ["### CI plan: pull_request synchronize, from this repository; labels: run-ci-megatron",
                         "", "| job | runs | why |", "|---|---|---|"]
    assert lines[4] == "| `cpu_unit` | yes | every pull request to main runs it |"
    megatron = next(x for x in lines if x.startswith("| `megatron` |"))
    assert megatron.startswith("| `megatron` | **skipped** | the diff touches only GPU-irrelevant paths")


def test_the_summary_escapes_a_pipe_in_a_reason() -> None:
    job = Job(id="j", session="j", tier="cpu", purpose="p", runs_on=("ubuntu-latest",))
    event = Event(name="pull_request", labels=frozenset({"a", "b"}))
    from ci.github.job_plan import Decision

    text = summary_markdown(event, [Decision(job=job, runs=True, why="a|b")])
    assert text.splitlines()[-1] == "| `j` | yes | a\\|b |"
    assert text.splitlines()[0] == "### CI plan: pull_request synchronize, from this repository; labels: a, b"


# --- issue_comment and the one-file dispatch, through `plan` --------------------------------


def test_comment_flags_reach_the_gateway(capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--event", "issue_comment", "--comment", "/help", "--actor", "eve", "--association", "none"]
    on_pr = _plan_comment(capsys, *base)
    assert on_pr["verdict"] == "allowed"
    on_issue = _plan_comment(capsys, *base, "--not-pr")
    assert on_issue["verdict"] == "refused" and "pull request comments" in on_issue["why"]
    rerun = ["--event", "issue_comment", "--comment", "/rerun-failed", "--actor", "alice",
             "--association", "MEMBER", "--pr", "9", "--sha", SHA, "--teams", " core , ,"]
    assert _plan_comment(capsys, *rerun, "--no-fork")["verdict"] == "allowed"
    assert _plan_comment(capsys, *rerun, "--fork")["verdict"] == "refused"


def _plan_comment(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    assert main([*argv, "--root", str(REPO), "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_suite_flag_resolves_the_one_file_dispatch(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_comment(capsys, "--event", "workflow_dispatch", "--suite", "ckpt", "--sha", SHA)
    assert (out["suite"], out["tier"], out["sha"], out["command_line"]) == ("ckpt", "gpu", SHA, "nox -s ckpt")
    one = _plan_comment(capsys, "--event", "workflow_dispatch", "--suite", "ckpt",
                        "--only", "tests/e2e/test_tiny_ckpt.py")
    assert (one["only"], one["num_gpus"]) == ("tests/e2e/test_tiny_ckpt.py", 2)
    assert one["command_line"] == "nox -s ckpt -- --only tests/e2e/test_tiny_ckpt.py"
    with pytest.raises(UsageError, match="unknown suite 'nope'; known: "):
        main(["--event", "workflow_dispatch", "--suite", "nope", "--root", str(REPO)])


# --- rules the registry tables above do not reach ---------------------------------------------


def _job(**given: Any) -> Job:
    base: dict[str, Any] = {"id": "j", "session": "j", "tier": "gpu", "purpose": "p",
                            "runs_on": ("self-hosted", "gpu"), "label": "run-ci-j"}
    return Job(**(base | given))


def test_only_labelled_self_hosted_jobs_wait_for_the_plan() -> None:
    assert gated_by_plan(_job())
    assert not gated_by_plan(_job(runs_on=("ubuntu-latest",)))  # a labelled hosted job
    assert not gated_by_plan(_job(label=None))
    assert not gated_by_plan(_job(runs_on=("ubuntu-latest",), label=None))
    assert not gated_by_plan(_job(scheduled_only=True, crons=("0 1 * * *",)))
    hosted = pr_terms(_job(runs_on=("ubuntu-latest",)))
    assert not any("needs.plan" in t for t in hosted)
    assert not any("head.repo.full_name" in t for t in hosted)


def test_condition_lines_of_each_kind_of_job() -> None:
    assert condition_lines(_job(label=None, tier="cpu", runs_on=("ubuntu-latest",))) == [
        "(github.event_name != 'pull_request' && github.event_name != 'schedule')",
        "|| (github.event_name == 'pull_request' && github.event.action != 'labeled')"]
    # A job only schedules run, with no cron left: never.
    assert condition_lines(_job(scheduled_only=True)) == ["false"]
    assert condition_lines(_job(label="it's", crons=("0 1 * * *",))) == [
        "!cancelled()",
        "&& (github.event_name == 'workflow_dispatch'",
        "|| (github.event_name == 'pull_request'",
        "&& github.event.pull_request.head.repo.full_name == github.repository",
        "&& contains(github.event.pull_request.labels.*.name, 'it''s')",
        "&& (github.event.action != 'labeled' || github.event.label.name == 'it''s')",
        "&& contains(fromJSON(needs.plan.outputs.jobs || '[]'), 'j'))",
        "|| (github.event_name == 'schedule' && (github.event.schedule == '0 1 * * *')))"]


def test_a_tests_only_diff_runs_the_changed_job_and_a_schedule_lists_its_crons() -> None:
    changed = _job(full_history=True)
    event = Event(name="pull_request", labels=frozenset({"run-ci-j"}), tests_only=("tests/test_a.py",))
    assert decide(changed, event).runs
    twice = _job(scheduled_only=True, crons=("0 1 * * *", "0 2 * * 0"))
    assert decide(twice, Event(name="push")).why == "only its schedule runs it (0 1 * * *, 0 2 * * 0)"


def test_a_single_shard_job_runs_its_plain_command() -> None:
    assert _job().command(1) == "nox -s j"
    sharded = _job(shards=3)
    text = render_plan(Event(name="workflow_dispatch"), [decide(sharded, Event(name="workflow_dispatch"))])
    row = text.splitlines()[3]
    assert row.split("  ")[-2].strip() == ("nox -s j -- --shard 1/3; nox -s j -- --shard 2/3; "
                                           "nox -s j -- --shard 3/3")


def test_session_jobs_and_the_check_job() -> None:
    lint = session_job(Check(name="style", every_event=True, purpose="the style", profiles=("lint",),
                             commands=(("ruff",),), minutes=9), Style(), SUITES)
    assert (lint.id, lint.session, lint.tier, lint.purpose, lint.kind, lint.runs_on, lint.minutes, lint.crons,
            lint.scheduled_only) == ("style", "style", "cpu", "the style", "check", ("ubuntu-latest",), 9, (),
                                     False)
    gpu_smoke = session_job(Smoke(name="s", purpose="the smoke", profiles=(), runs=(SmokeRun(suite="cpu_unit"),),
                                  minutes=7), Style(hosted_runner=("own-runner",)), SUITES)
    assert (gpu_smoke.id, gpu_smoke.session, gpu_smoke.tier, gpu_smoke.purpose, gpu_smoke.runs_on,
            gpu_smoke.minutes, gpu_smoke.kind) == ("s", "s", "cpu", "the smoke", ("own-runner",), 7, "smoke")
    smoke = Smoke(name="s", purpose="p", profiles=(), runs=(SmokeRun(suite="cpu_unit"), SmokeRun(suite="nope"),
                                                          SmokeRun(suite="zzz")))
    with pytest.raises(UsageError) as info:
        session_job(smoke, Style(), SUITES)
    known = ", ".join(sorted(s.name for s in SUITES))
    assert str(info.value) == (f"session s runs suite 'nope', which the registry lacks: name one of "
                               f"{known} in ci/registry/repo_suites.py")
    from ci.github.job_plan import check_job

    job = check_job("workflow_check", Style())
    assert (job.kind, job.minutes) == ("check", LINT_MINUTES)
    assert job.purpose == "Generated workflow and U files are current with the registry"


def test_a_suite_job_carries_the_suites_tier_purpose_and_minutes() -> None:
    suite = Suite(name="g", tier="gpu", purpose="the g suite", profile="e2e", label="run-ci-g")
    job = job_for(suite)
    assert (job.tier, job.purpose, job.minutes) == ("gpu", "the g suite", suite_minutes(suite))
    assert job.minutes != LINT_MINUTES


def test_session_cadences_and_their_refusals() -> None:
    style = Style(schedules={"0 5 * * *": "nightly", "0 6 * * 1": "weekly"})
    nightly = session_job(Check(name="n", purpose="p", profiles=(), commands=(), cadences=("nightly",)), style,
                          SUITES)
    assert (nightly.crons, nightly.scheduled_only) == (("0 5 * * *",), True)
    both = Check(name="c", purpose="p", profiles=(), commands=(), every_event=True, cadences=("nightly",))
    with pytest.raises(UsageError) as info:
        session_job(both, Style(), SUITES)
    assert str(info.value) == ("session c: set every_event=True or cadences=(...) in ci/registry/repo_suites.py, not both "
                               "(or neither, for a session no CI job runs)")
    # A scheduled check's cadence needs a cron, as a suite's does.
    monthly = Check(name="m", purpose="p", profiles=(), commands=(), cadences=("monthly",))
    with pytest.raises(UsageError, match="'monthly'"):
        table(SUITES, Style(), (monthly,))


def test_the_stability_job_needs_a_weekly_cron_and_bounded_minutes() -> None:
    nightly_only = Suite(name="g", tier="gpu", purpose="p", profile="e2e", label="run-ci-g", cadences=("nightly",))
    with pytest.raises(UsageError, match="'weekly'"):
        table((nightly_only,), Style(schedules={"0 5 * * *": "nightly"}, stability_suite="g"), ())
    longest = MAX_MINUTES - SETUP_MINUTES
    job = stability_job((nightly_only,), Style(stability_suite="g", stability_minutes=longest))
    assert job is not None and (job.tier, job.minutes) == ("gpu", MAX_MINUTES)
    with pytest.raises(UsageError) as info:
        stability_job((nightly_only,), Style(stability_suite="g", stability_minutes=longest + 1))
    assert str(info.value) == f"WORKFLOW['stability_minutes'] must be 1..{longest}"
    with pytest.raises(UsageError) as info:
        stability_job((nightly_only,), Style(stability_suite="nope"))
    assert str(info.value) == ("WORKFLOW['stability_suite'] = 'nope': not a GPU suite of the registry "
                               "(name one, or set it to None)")


def test_the_monitor_job_exists_only_where_a_cron_maps_to_it() -> None:
    assert monitor_job(Style(schedules={"0 5 * * *": "nightly"})) is None
    job = monitor_job(Style(schedules={"0 5 * * *": "nightly", "*/30 * * * *": "monitor"}))
    assert job is not None
    assert (job.id, job.session, job.tier, job.kind, job.minutes) == ("monitor", "monitor", "cpu", "check", 10)
    assert job.crons == ("*/30 * * * *",) and job.scheduled_only and job.history_store
    assert job.report == ".ci-cache/monitor.md" and job.runs_on == Style().hosted_runner
    assert job.purpose.startswith("The failure monitor")
    ids = [j.id for j in table(SUITES, Style(schedules={**DEFAULT_SCHEDULES}), ())]
    assert ids.count("monitor") == 1
    without = {c: n for c, n in DEFAULT_SCHEDULES.items() if n != "monitor"}
    assert "monitor" not in [j.id for j in table(SUITES, Style(schedules=without), ())]


def test_two_duplicate_job_ids_are_both_named() -> None:
    # Twice "x", and "plan": the workflow's own plan job has that id.
    twins = (Suite(name="x", tier="cpu", purpose="p", profile="cpu"),
             Suite(name="x", tier="cpu", purpose="p", profile="cpu"),
             Suite(name="plan", tier="cpu", purpose="p", profile="cpu"))
    with pytest.raises(UsageError) as info:
        table(twins, Style(schedules={}, stability_suite=None), ())
    assert str(info.value) == "two CI jobs named plan, x: rename the suite in ci/registry/repo_suites.py"


def test_parse_event_takes_a_namespace_without_the_optional_flags() -> None:
    import argparse

    # The flags of the comment and schedule events are optional on a namespace a caller builds.
    args = argparse.Namespace(event="pull_request", labels="wip", added=None, action=None, fork=True)
    event = parse_event(args, ())
    assert (event.labels, event.from_fork, event.gpu_skip, event.tests_only) == (frozenset({"wip"}), True,
                                                                                 None, ())


@pytest.mark.parametrize(("given", "message"), [
    ({"event": "schedule"}, "--event schedule needs --cron '<the cron that fired>', and only it takes --cron"),
    ({"event": "push", "added": "wip"}, "--added only applies to --event pull_request"),
    ({"action": "labeled"}, "--action labeled needs --added LABEL (the label just added)"),
    ({"event": "push", "changed_paths": ["a.md"]}, "--paths and --diff only apply to --event pull_request"),
    # The comment event's own flags, named as typed (dashes), on any other event.
    ({"event": "push", "team_org": "acme"}, "--team-org only apply to --event issue_comment"),
    ({"team_org": "acme", "pr": 7}, "--pr, --team-org only apply to --event issue_comment"),
    ({"event": "push", "not_pr": True}, "--not-pr only apply to --event issue_comment"),
])
def test_refusals_are_the_whole_message(given: dict[str, object], message: str) -> None:
    import argparse

    args = argparse.Namespace(**({"event": "pull_request", "labels": "", "added": None, "action": None,
                                  "fork": False, "cron": None} | given))
    with pytest.raises(UsageError) as info:
        parse_event(args, ())
    assert str(info.value) == message


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
