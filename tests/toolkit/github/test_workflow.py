"""The generated workflow: its shape, its security properties, and the drift check."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO as ROOT

from ci.errors import UsageError
from ci.github.job_plan import table
from ci.github.workflow import (
    ACTIONLINT_PATH,
    MARKER,
    NOX_VERSION,
    WORKFLOW_PATH,
    Flow,
    Folded,
    Note,
    find_root,
    render,
    to_yaml,
)
from ci.registry import Suite
from ci.registry.repo_suites import SUITES

NUM_GPUS = 0
# The checks of ci.suites.SESSIONS that only a schedule runs, in registry order.
SCHEDULED_CHECKS = ("gpu_smoke_nightly", "actions_real", "mutation", "plants", "lock_check")

BIN = Path(sys.executable).parent


def _tool(name: str) -> str | None:
    local = BIN / name
    return str(local) if local.exists() else shutil.which(name)


def _files() -> dict[str, str]:
    return render(table())


def _workflow() -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load(_files()[WORKFLOW_PATH])
    return parsed


def _nox_step(job: dict[str, Any]) -> dict[str, Any]:
    """The step running the job's session (not the history steps around it)."""
    (step,) = [s for s in job["steps"] if s.get("run", "").startswith(("nox -s ", _NARROWED))
               and not s["run"].startswith("nox -s history ")]
    return step


_NARROWED = 'if [ "$NARROW" = true ]; then nox -s '



def _ci(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ci", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60, check=False)


# --- the YAML writer ----------------------------------------------------------------------------

def test_yaml_writer_round_trips_tricky_scalars_through_a_real_parser() -> None:
    tree = {
        "on": {"yes": "no", "off": "null", "plain": "nox -s cpu_unit", "empty": ""},
        "colon": "a: b", "hash": "x #y", "quote": "it's \"quoted\"", "expr": "${{ a && 'b' }}",
        "unicode": "tiers … ok", "number_like": "1.5", "leading_dash": "-x", "star": "*x",
        "lead_space": " x", "newline": "a\nb", "bools": [True, False, None, 0, 12],
        "flow": Flow(("self-hosted", "gpu", "on")), "empty_map": {},
        "note": Note("read", "why: it is # needed"), "folded": Folded(("a == 'b'", "|| c")),
        "steps": [{"name": "one", "with": {"k": Note(0, "zero")}}, {"run": "echo hi"}],
        "nested": [[1, 2], {"a": [{"b": 1}]}],
    }
    text = to_yaml(tree, header=["a header", ""], spaced=1)
    assert text.startswith("# a header\n#\n")
    loaded = yaml.safe_load(text)
    assert loaded == {
        **tree,
        "flow": ["self-hosted", "gpu", "on"], "note": "read", "folded": "a == 'b' || c",
        "steps": [{"name": "one", "with": {"k": 0}}, {"run": "echo hi"}],
    }
    assert "  # why: it is # needed" in text
    assert to_yaml(tree) == text.split("\n", 2)[2].replace("\n\n", "\n")


# --- the workflow's shape ----------------------------------------------------------------------

# The HUD's build and its Pages deployment: their own shape, their own permissions and
# environments, tested in tests/toolkit/github/test_pages_workflow.py.
HUD_JOBS = ("hud", "pages")


def own_shape(jobs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in jobs.items() if k not in HUD_JOBS}


def test_one_job_per_session_each_running_nox() -> None:
    jobs = _workflow()["jobs"]
    # The plan job asks `python -m ci plan` about the PR's diff (tests/toolkit/github/test_job_plan_events.py).
    # After the stability job, the scheduled checks (ci.suites.SESSIONS with cadences), then
    # the hourly failure monitor and, on its cron, the HUD's build and Pages deployment.
    assert list(jobs) == ["plan", *(s.name for s in SUITES), "lint", "gpu_smoke", "megatron_stability",
                          *SCHEDULED_CHECKS, "monitor", "hud", "pages", "verdict"]
    matrix = {j.id: j.matrix for j in table()}
    narrows = {j.id: j.narrows for j in table()}
    assert sorted(k for k, v in narrows.items() if v) == sorted(
        s.name for s in SUITES if s.needs_gpus and not s.dynamic)
    for job_id, job in jobs.items():
        if job_id in ("megatron_stability", "plan", "verdict", *HUD_JOBS):  # their own shape: tested on their own
            continue
        last = _nox_step(job)
        # K is the matrix's width: the plan job's count for a job sized by a target.
        sharded = ' -- --shard "$SHARD/$SHARDS"' if matrix[job_id] else ""
        if narrows[job_id]:  # a GPU suite: on a PR, the entries its diff reaches
            assert last["run"] == (f'if [ "$NARROW" = true ]; then nox -s {job_id} -- --by-executed '
                                   f"HEAD^1; else nox -s {job_id}; fi")
            assert "'run-ci-all-entries'" in last["env"]["NARROW"]
            assert "github.event_name == 'pull_request'" in last["env"]["NARROW"]
            assert job["steps"][0]["with"]["fetch-depth"] == 2
        else:
            assert last["run"] == f"nox -s {job_id}{sharded}"
        assert job["steps"][2]["run"].startswith("python -m pip install nox==")
        gpu = job_id not in {"cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke", *SCHEDULED_CHECKS,
                             "monitor"}
        assert job["runs-on"] == (["self-hosted", "gpu"] if gpu else "ubuntu-latest")
        assert ("SLIME_TEST_ENABLE_INFINITE_RUN" in last.get("env", {})) == gpu
        assert job["timeout-minutes"] > 0
    assert jobs["changed"]["steps"][0]["with"]["fetch-depth"] == 0
    assert "fetch-depth" not in jobs["cpu_unit"]["steps"][0]["with"]
    assert jobs["cpu_unit"]["env"]["SLIME_CI_TORCH_INDEX"].endswith("/whl/cpu")


def test_the_verdict_job_judges_every_pr_job_from_the_base_code_with_a_comment_token_only() -> None:
    jobs = _workflow()["jobs"]
    verdict = jobs["verdict"]
    pr_jobs = [j for j in jobs if j not in ("verdict", "megatron_stability", "monitor", *SCHEDULED_CHECKS, *HUD_JOBS)]
    assert verdict["needs"] == pr_jobs, "it judges after every job a PR can run"
    assert verdict["if"] == "always() && github.event_name == 'pull_request'", "a failed job must not skip it"
    checkout = verdict["steps"][0]
    assert checkout["uses"].startswith("actions/checkout@")
    assert checkout["with"] == {"persist-credentials": False, "ref": "${{ github.event.pull_request.base.sha }}"}, \
        "it judges with the base's code, never the PR's"
    assert verdict["permissions"] == {"contents": "read", "actions": "read", "pull-requests": "write",
                                      "checks": "write"}
    # No secret: the trusted snapshot, then this run's exports as this PR's untrusted runs.
    assert "secrets." not in json.dumps(verdict) and "environment" not in verdict
    names = [s["name"] for s in verdict["steps"]]
    assert names.index("Restore the trusted history (the ingest job's snapshot)") < names.index(
        "Record them beside the snapshot, untrusted, as this PR's runs") < len(names) - 2
    record = next(s for s in verdict["steps"] if s["name"].startswith("Record them"))
    assert record["run"] == 'nox -s history -- ingest "$RUNNER_TEMP/history" --pr "$PR"'
    fetch = next(s for s in verdict["steps"] if s["name"].startswith("Fetch the run's"))
    assert fetch["env"]["RUN"] == "${{ github.run_id }}", "this run's own artifacts"
    why = verdict["steps"][-2]  # the last one fails the job after a cancel
    assert why["run"].startswith("nox -s verdict -- --pr \"$PR\" --base \"$BASE\"") and "--gate" in why["run"]
    assert '--checks --head "$HEAD"' in why["run"] and why["env"]["HEAD"] == "${{ github.event.pull_request.head.sha }}"
    assert "${{" not in why["run"], "values reach the shell through the environment"
    assert why["env"]["GITHUB_TOKEN"] == "${{ github.token }}" and why["env"]["NEEDS"] == "${{ toJSON(needs) }}"
    monitor = jobs["monitor"]
    assert monitor["permissions"] == {"contents": "read", "actions": "write", "issues": "write"}
    assert _nox_step(monitor)["env"]["GITHUB_TOKEN"] == "${{ github.token }}"
    assert all("issues" not in j.get("permissions", {}) for k, j in jobs.items() if k != "monitor")


def test_jobs_install_the_nox_that_the_ci_entry_point_pins() -> None:
    entry = ROOT / ".ci" / "run"
    if not entry.exists():
        pytest.skip(".ci/run not present")
    pinned = re.findall(r"nox==([\w.]+)", entry.read_text())
    assert pinned
    assert {f"nox=={NOX_VERSION}"} == {f"nox=={v}" for v in pinned}
    assert f"nox=={NOX_VERSION}" in _files()[WORKFLOW_PATH]


def test_dispatch_declares_the_infinite_run_input() -> None:
    inputs = _workflow()["on"]["workflow_dispatch"]["inputs"]
    assert inputs == {"infinite_run": {"description": inputs["infinite_run"]["description"],
                                       "type": "boolean", "default": False}}


def test_sharded_suite_becomes_a_matrix_passing_shard_through_the_environment() -> None:
    suites = tuple(
        Suite(name=s.name, tier=s.tier, purpose=s.purpose, profile=s.profile, label=s.label,
              shards=3 if s.name == "ckpt" else 1)
        for s in SUITES
    )
    wf = yaml.safe_load(render(table(suites))[WORKFLOW_PATH])
    ckpt = wf["jobs"]["ckpt"]
    # Each leg carries K (`of`): act leaves strategy.job-total empty, and a step reading it ran
    # `--shard 1/`.
    assert ckpt["strategy"] == {"fail-fast": False, "matrix": {"shard": [1, 2, 3], "of": [3]}}
    step = _nox_step(ckpt)
    assert step["env"]["SHARD"] == "${{ matrix.shard }}"
    assert step["env"]["SHARDS"] == "${{ matrix.of }}"
    assert step["run"] == 'nox -s ckpt -- --shard "$SHARD/$SHARDS"'
    assert "${{ matrix.shard }}" in ckpt["name"]
    assert "strategy" not in wf["jobs"]["megatron"]


# --- measured durations carried between runs --------------------------------------------------

def _cache_steps(job: dict[str, Any]) -> tuple[int, dict[str, Any], int, dict[str, Any]]:
    steps = job["steps"]
    (restore, *_) = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/restore@")
                     and s["with"]["key"].startswith("slime-ci-durations-")]
    (save,) = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/cache/save@")]
    return restore, steps[restore], save, steps[save]


def _record_step(job: dict[str, Any]) -> dict[str, Any]:
    (step,) = [s for s in job["steps"] if s.get("run", "").startswith("nox -s history -- record ")]
    return step


def test_suite_jobs_restore_durations_from_main_before_the_run_and_save_after_it_on_main() -> None:
    jobs = _workflow()["jobs"]
    assert not any("actions/cache" in s.get("uses", "") for s in jobs["lint"]["steps"])
    committed = {j.id: j.shards for j in table()}
    keys = set()
    for job_id, job in jobs.items():
        if job_id in ("lint", "megatron_stability", "plan", *SCHEDULED_CHECKS, "monitor", "verdict", *HUD_JOBS):  # checks; infinite
            continue
        restore_at, restore, save_at, save = _cache_steps(job)
        nox_at = job["steps"].index(_nox_step(job))
        record_at = job["steps"].index(_record_step(job))
        assert restore_at < nox_at < record_at < save_at  # the record step may add a run
        prefix = f"slime-ci-durations-{job_id}-"
        keys.add(prefix)
        if "strategy" in job:  # a matrix: one cache per shard, every shard restores them all
            # main's shards: pushes save the caches, and no plan runs on a push.
            count = committed[job_id]
            restores = [s for s in job["steps"] if s.get("name", "").startswith("Restore shard ")]
            assert [s["with"]["restore-keys"] for s in restores] == [f"{prefix}{i}-" for i in range(1, count + 1)]
            assert save["with"]["key"] == prefix + "${{ matrix.shard }}-${{ github.run_id }}-${{ github.run_attempt }}"
            assert save["if"].endswith("hashFiles(format('.ci-cache/shards/{0}/durations.json', "
                                       "matrix.shard)) != ''")
            continue
        cached = ".ci-cache/durations.json\n.ci-cache/history.sqlite\n"  # and the run history
        assert restore["with"] == {"path": cached, "restore-keys": prefix,
                                   "key": prefix + "${{ github.run_id }}"}
        assert save["with"]["path"] == cached
        # A key per run and attempt: cache entries are immutable, and the restore's prefix finds it.
        assert save["with"]["key"] == prefix + "${{ github.run_id }}-${{ github.run_attempt }}"
        # Only a push to main writes; a failed run still saves what it measured.
        assert save["if"] == ("!cancelled() && github.event_name == 'push' && "
                              "github.ref == 'refs/heads/main' && "
                              "hashFiles('.ci-cache/durations.json') != ''")
    # No job's prefix is a prefix of another's: each job reads only its own durations.
    assert not any(a != b and b.startswith(a) for a in keys for b in keys)


def test_every_suite_job_records_its_run_last_even_when_it_failed() -> None:
    jobs = _workflow()["jobs"]
    for job in table():
        if job.kind == "check":  # commands, not suites: nothing to record
            assert not any("history" in s.get("run", "") for s in jobs[job.id]["steps"])
            continue
        step = _record_step(jobs[job.id])
        assert step["if"] == "always()"  # after a failure, a timeout or a cancel too
        # Every suite and smoke job, GPU and CPU alike, exports its runs for the ingest workflow.
        export = ' --keep-in ".ci-cache/shards/$SHARD"' * job.matrix + " --export .ci-cache/history-export"
        assert step["run"] == f'nox -s history -- record --suite {job.session} --status "$STATUS"{export}'
        assert step["env"]["STATUS"] == "${{ job.status }}"
        # No suite job reaches the shared store: neither the record step nor the session.
        assert "SLIME_CI_HISTORY_URL" not in step["env"], job.id
        (session,) = [s for s in jobs[job.id]["steps"] if f"nox -s {job.session}" in s.get("run", "")]
        assert "SLIME_CI_HISTORY_URL" not in session.get("env", {}), job.id
        steps = jobs[job.id]["steps"]
        uploads = [s for s in steps if s.get("name") == "Upload this job's runs for the history ingest"]
        snapshot = [s for s in steps if s.get("name") == "Restore the trusted history (the ingest job's snapshot)"]
        # Right after the record step, also after a failure.
        (upload,) = uploads
        # Before the session, over the job's own cache: the trusted baseline it reads.
        (restore,) = snapshot
        assert steps.index(restore) < steps.index(session) and all(
            steps.index(s) < steps.index(restore) for s in steps if s.get("name", "").startswith("Restore measured"))
        assert restore["with"] == {"path": ".ci-cache/history.sqlite",
                                   "key": "slime-ci-history-trusted-${{ github.run_id }}",
                                   "restore-keys": "slime-ci-history-trusted-"}
        assert steps.index(upload) == steps.index(step) + 1 and upload["if"] == "always()"
        # One artifact per shard of a matrix job, or their uploads would collide.
        shard = "-${{ matrix.shard }}" if job.matrix else ""
        assert upload["with"]["name"] == f"history-{job.id}{shard}"
        assert upload["with"]["path"] == ".ci-cache/history-export"


def test_a_sharded_job_keeps_one_cache_per_shard_and_merges_all_before_it_plans() -> None:
    suites = tuple(Suite(name=s.name, tier=s.tier, purpose=s.purpose, profile=s.profile, label=s.label,
                         shards=4 if s.name == "cpu_unit" else 1) for s in SUITES)
    job = yaml.safe_load(render(table(suites))[WORKFLOW_PATH])["jobs"]["cpu_unit"]
    steps = job["steps"]
    restores = [s for s in steps if s.get("uses", "").startswith("actions/cache/restore@")
                and s["with"]["restore-keys"].startswith("slime-ci-durations-")]
    assert [r["with"]["restore-keys"] for r in restores] == [
        f"slime-ci-durations-cpu_unit-{i}-" for i in (1, 2, 3, 4)]
    for i, r in enumerate(restores, 1):  # each shard's files in a folder of its own
        assert r["with"]["path"] == (f".ci-cache/shards/{i}/durations.json\n"
                                     f".ci-cache/shards/{i}/history.sqlite\n")
    merge = next(s for s in steps if s.get("run", "").startswith("nox -s history -- merge"))
    assert steps.index(restores[-1]) < steps.index(merge) < steps.index(_nox_step(job))
    record = _record_step(job)
    assert record["run"].endswith('--keep-in ".ci-cache/shards/$SHARD" --export .ci-cache/history-export')
    upload = next(s for s in steps if s.get("name") == "Upload this job's runs for the history ingest")
    assert upload["with"]["name"] == "history-cpu_unit-${{ matrix.shard }}", "one artifact per shard"
    (save,) = [s for s in steps if s.get("uses", "").startswith("actions/cache/save@")]
    assert save["with"]["key"] == ("slime-ci-durations-cpu_unit-${{ matrix.shard }}-"
                                   "${{ github.run_id }}-${{ github.run_attempt }}")
    assert save["with"]["path"] == (".ci-cache/shards/${{ matrix.shard }}/durations.json\n"
                                    ".ci-cache/shards/${{ matrix.shard }}/history.sqlite\n")
    # Formatted by the expression: a `${{ }}` inside `if:` makes the condition a string, always true.
    assert "hashFiles(format('.ci-cache/shards/{0}/durations.json', matrix.shard))" in save["if"]


# --- security properties -----------------------------------------------------------------------

def test_least_privilege_and_no_credentials_left_on_disk() -> None:
    wf = _workflow()
    assert wf["permissions"] == {}
    text = _files()[WORKFLOW_PATH]
    assert "pull_request_target" not in text
    # One secret, the history store's URL, only in the env of the steps that open the store.
    assert set(re.findall(r"secrets\.\w+", text)) == {"secrets.SLIME_CI_HISTORY_URL"}
    for job_id, job in own_shape(wf["jobs"]).items():
        # Only the scheduled monitor opens the shared store here (GPU jobs export their runs to
        # the ingest workflow); it alone names the environment, and no deployment.
        opens = "secrets." in json.dumps(job)
        assert opens == (job_id == "monitor"), job_id
        assert job.get("environment") == ({"name": "ci-history", "deployment": False} if opens else None)
        for step in job["steps"]:
            if "secrets." in json.dumps(step):
                assert "secrets." not in json.dumps({k: v for k, v in step.items() if k != "env"})
                assert step["run"].startswith("nox -s ") or "nox -s " in step["run"]
    for job_id, job in own_shape(wf["jobs"]).items():
        # The monitor alone may dispatch (bisect.yml, one run per streak), from a step that
        # holds the token and no secret; the step holding the store's secret holds no token.
        # Beyond reading: the monitor keeps its issues; the verdict job reads this run's
        # exported runs (actions), edits its PR comment and creates its check runs.
        extra = {"monitor": {"actions": "write", "issues": "write"},
                 "verdict": {"actions": "read", "pull-requests": "write", "checks": "write"}}.get(job_id, {})
        assert job["permissions"] == {"contents": "read", **extra}, job_id
        for step in job["steps"]:
            env = json.dumps(step.get("env", {}))
            # One step holds both: the monitor's session files the issues of held and
            # main-breaking entries (main's code, on a schedule, on a hosted runner).
            files_issues = job_id == "monitor" and step.get("run") == "nox -s monitor"
            assert not ("github.token" in env and "secrets." in env) or files_issues, (job_id, step["name"])
            assert ("gh workflow run" in step.get("run", "")) <= (job_id == "monitor")
        checkout = job["steps"][0]
        assert checkout["uses"].startswith("actions/checkout@")
        assert checkout["with"]["persist-credentials"] is False


# The verdict job's actions: checkout (the base), the trusted snapshot's restore, setup-python.
VERDICT_ACTIONS = 3
# The HUD's build (checkout, setup-python, upload-pages-artifact) and deployment (deploy-pages).
HUD_ACTIONS = 4


def test_every_action_is_pinned_to_a_full_sha_with_its_version_beside_it() -> None:
    text = _files()[WORKFLOW_PATH]
    uses = re.findall(r"uses: (\S+)(.*)", text)
    # checkout and setup-python everywhere; cache restore and save in every job but lint.
    # The weekly stability job keeps no durations (its runs repeat until a bound); the plan
    # job checks out, sets up Python and restores the trusted snapshot (the shard counts'
    # p90); a check with a report uploads it.
    # A suite or smoke job restores the ingest job's trusted snapshot and uploads its runs for it.
    # A matrix job restores every shard's cache: one restore step per shard.
    assert len(uses) == sum((2 if j.kind == "check" or j.infinite else 3 + j.shards) + bool(j.report)
                            + 2 * (j.kind != "check") for j in table()) + 3 + VERDICT_ACTIONS \
        + HUD_ACTIONS
    for ref, rest in uses:
        assert re.fullmatch(r"[\w.-]+/[\w.-]+(/[\w.-]+)?@[0-9a-f]{40}", ref), ref
        assert re.fullmatch(r"  # v\d+\.\d+\.\d+", rest), rest


def test_no_expression_reaches_a_shell_directly() -> None:
    for job in _workflow()["jobs"].values():
        for step in job["steps"]:
            assert "${{" not in step.get("run", "")


def test_self_hosted_jobs_carry_an_inline_reasoned_zizmor_ignore() -> None:
    lines = _files()[WORKFLOW_PATH].splitlines()
    hosted = [ln for ln in lines if "runs-on: [self-hosted" in ln]
    assert len(hosted) == sum(j.self_hosted for j in table())
    for line in hosted:
        reason = line.split("zizmor: ignore[self-hosted-runner]", 1)[1]
        assert "fork" in reason


def test_banner_names_the_command() -> None:
    for text in _files().values():
        assert text.startswith(f"# {MARKER}")
        assert "run `python -m ci workflows`" in text


def test_actionlint_config_declares_the_self_hosted_labels() -> None:
    config = yaml.safe_load(_files()[ACTIONLINT_PATH])
    assert config == {"self-hosted-runner": {"labels": ["gpu"]}}


# --- drift check --------------------------------------------------------------------------------

def test_committed_files_are_up_to_date() -> None:
    result = _ci("workflows", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "up to date" in result.stdout


def _checkout(tmp_path: Path) -> Path:
    for rel, text in _files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text, encoding="utf-8")
    return tmp_path


def test_check_prints_a_unified_diff_and_fails_on_a_hand_edit(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    path = root / WORKFLOW_PATH
    edited = path.read_text().replace("timeout-minutes: 60 ", "timeout-minutes: 61 ", 1)
    path.write_text(edited)
    (root / ACTIONLINT_PATH).unlink()

    check = _ci("workflows", "--check", "--root", str(root))
    assert check.returncode == 1
    assert f"--- a/{WORKFLOW_PATH}\n+++ b/{WORKFLOW_PATH}\n" in check.stdout
    assert "-    timeout-minutes: 61 " in check.stdout and "+    timeout-minutes: 60 " in check.stdout
    assert f"--- /dev/null\n+++ b/{ACTIONLINT_PATH}" in check.stdout
    assert check.stderr.count("\n") == 1
    assert "run `python -m ci workflows`" in check.stderr

    dry = _ci("workflows", "--dry-run", "--root", str(root))
    assert dry.returncode == 0
    assert "+    timeout-minutes: 60" in dry.stdout
    assert path.read_text() == edited  # nothing written

    fix = _ci("workflows", "--root", str(root))
    assert fix.returncode == 0
    assert f"wrote {WORKFLOW_PATH}" in fix.stdout
    assert _ci("workflows", "--check", "--root", str(root)).returncode == 0


def test_stale_generated_workflow_is_reported_and_removed_but_hand_written_ones_stay(
        tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    stale = root / ".github/workflows/old-gpu.yml"
    stale.write_text(f"# {MARKER} from somewhere.\nname: old\n")
    mine = root / ".github/workflows/release.yaml"
    mine.write_text("name: release\n")
    check = _ci("workflows", "--check", "--root", str(root))
    assert check.returncode == 1
    assert "--- a/.github/workflows/old-gpu.yml\n+++ /dev/null" in check.stdout
    assert "release.yaml" not in check.stdout
    assert _ci("workflows", "--root", str(root)).returncode == 0
    assert not stale.exists()
    assert mine.read_text() == "name: release\n"


def test_bad_flags_exit_2() -> None:
    result = _ci("workflows", "--check", "--dry-run")
    assert result.returncode == 2
    assert "not allowed with" in result.stderr


def test_check_from_a_subdirectory_finds_the_checkout(tmp_path: Path) -> None:
    assert _ci("workflows", "--check", cwd=ROOT / "tests").returncode == 0
    nested = tmp_path / "repo" / "a" / "b"
    nested.mkdir(parents=True)
    (tmp_path / "repo" / "ci" / "registry").mkdir(parents=True)
    (tmp_path / "repo" / "ci" / "registry" / "repo_suites.py").write_text("")
    assert find_root(nested) == tmp_path / "repo"
    (tmp_path / "adopted" / ".slime-ci").mkdir(parents=True)  # where `slime-ci adopt` writes it
    (tmp_path / "adopted" / ".slime-ci" / "suites.py").write_text("")
    assert find_root(tmp_path / "adopted") == tmp_path / "adopted"
    with pytest.raises(UsageError, match=r"no \.slime-ci/suites\.py or ci/registry/repo_suites\.py in / or above"):
        find_root(Path("/"))


# --- the real linters (installed by the lint profile) -------------------------------------------

@pytest.mark.skipif(_tool("zizmor") is None, reason="zizmor not installed (lint profile)")
def test_zizmor_finds_nothing_even_as_auditor_and_the_only_silenced_finding_is_self_hosted(
        tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    zizmor = _tool("zizmor")
    assert zizmor is not None
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NO_COLOR": "1"}
    folder = str(root / ".github/workflows")
    for persona in ("pedantic", "auditor"):
        run = subprocess.run([zizmor, "--offline", "--persona", persona, folder], env=env,
                             capture_output=True, text=True, timeout=60, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "No findings to report" in run.stdout
    # Without the inline ignores, self-hosted-runner is all that zizmor reports.
    path = root / WORKFLOW_PATH
    path.write_text(re.sub(r"  # zizmor: ignore.*", "", path.read_text()))
    bare = subprocess.run([zizmor, "--offline", "--persona", "auditor", "--format", "json",
                           folder], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    idents = [f["ident"] for f in yaml.safe_load(bare.stdout)]
    hosted = sum(j.self_hosted for j in table())
    # The history secret lives in the ci-history environment: no secrets-outside-env to silence.
    assert sorted(idents) == ["self-hosted-runner"] * hosted


@pytest.mark.skipif(_tool("check-jsonschema") is None,
                    reason="check-jsonschema not installed (lint profile)")
def test_workflow_validates_against_the_github_workflow_schema(tmp_path: Path) -> None:
    root = _checkout(tmp_path)
    tool = _tool("check-jsonschema")
    assert tool is not None
    # One run (the tool is slow to start): the generated file passes, a broken copy does not.
    broken = root / ".github/workflows/broken.yml"
    broken.write_text(_files()[WORKFLOW_PATH].replace("runs-on:", "run-on:"))
    run = subprocess.run([tool, "--builtin-schema", "vendor.github-workflows",
                          str(root / WORKFLOW_PATH), str(broken)], capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 1
    assert str(broken) in run.stdout
    assert str(root / WORKFLOW_PATH) not in run.stdout + run.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
