"""bisect.yml and the monitor's dispatch step, as generated, and the dispatch script run for real
with a stand-in `gh` on PATH (GitHub's API cannot exist here): it records its arguments."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.github.bisect_workflow import BISECT_PATH
from ci.github.job_plan import table
from ci.github.workflow import WORKFLOW_PATH, render
from ci.registry.model import MONITOR_BISECT_PLAN

NUM_GPUS = 0


@pytest.fixture(scope="module")
def files():
    return render(table())


def test_bisect_runs_on_the_tier_s_runner_with_the_whole_history(files):
    flow = yaml.safe_load(files[BISECT_PATH])
    assert flow["permissions"] == {}
    assert set(flow["on"]["workflow_dispatch"]["inputs"]) == {"suite", "tier", "entry", "good", "bad", "trigger"}
    cpu, gpu = flow["jobs"]["bisect_cpu"], flow["jobs"]["bisect_gpu"]
    assert (cpu["if"], gpu["if"]) == ("inputs.tier == 'cpu'", "inputs.tier == 'gpu'")
    assert gpu["runs-on"] == ["self-hosted", "gpu"] and cpu["runs-on"] == "ubuntu-latest"
    for job in (cpu, gpu):
        assert job["permissions"] == {"contents": "read"}
        checkout = job["steps"][0]["with"]
        assert checkout == {"persist-credentials": False, "fetch-depth": 0}
        run = next(s for s in job["steps"] if s["name"] == "python -m ci bisect")
        assert "${{" not in run["run"], "inputs reach the shell through the environment only"
        assert run["env"]["ENTRY"] == "${{ inputs.entry }}"
        assert '"$venv/bin/python" -m ci bisect "$@"' in run["run"] and "--from-monitor" in run["run"]
        # An explicit range runs only the default branch's commits, as the monitor's does.
        assert '--good "$GOOD" --bad "${BAD:-HEAD}" --branch-only' in run["run"]
        assert "--answer-dir .ci-cache/bisect" in run["run"]
        assert '--work-dir "$RUNNER_TEMP"' in run["run"]  # in the work dir a GPU runner maps to its host
    runs = [next(s for s in j["steps"] if s["name"] == "python -m ci bisect") for j in (cpu, gpu)]
    assert "SLIME_CI_LOCK_TIMEOUT" in runs[1]["env"] and "SLIME_CI_LOCK_TIMEOUT" not in runs[0]["env"]
    assert cpu["env"] == {"SLIME_CI_TORCH_INDEX": "https://download.pytorch.org/whl/cpu"}


def test_the_monitor_dispatches_with_the_token_and_without_the_secret(files):
    monitor = yaml.safe_load(files[WORKFLOW_PATH])["jobs"]["monitor"]
    assert monitor["permissions"] == {"contents": "read", "actions": "write", "issues": "write"}
    dispatch = monitor["steps"][-1]
    assert dispatch["if"] == "failure()"
    assert "secrets." not in json.dumps(dispatch)
    assert dispatch["env"]["GH_TOKEN"] == "${{ github.token }}"


def _fake_gh(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True)
    gh = bin_dir / "gh"
    gh.write_text('#!/usr/bin/env python3\nimport json, os, sys\n'
                  'open(os.environ["GH_LOG"], "a").write(json.dumps(sys.argv[1:]) + "\\n")\n')
    gh.chmod(gh.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "gh.log"
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GH_LOG": str(log),
            "REPO": "org/repo", "DEFAULT_BRANCH": "main", "GH_TOKEN": "t"}, log


def _run_dispatch(files, tmp_path, plan_lines):
    """The monitor's dispatch step in bash, with a `gh` that writes its argv as JSON lines."""
    monitor = yaml.safe_load(files[WORKFLOW_PATH])["jobs"]["monitor"]
    script = monitor["steps"][-1]["run"]
    env, log = _fake_gh(tmp_path)
    work = tmp_path / "checkout"
    (work / Path(MONITOR_BISECT_PLAN).parent).mkdir(parents=True)
    if plan_lines is not None:
        (work / MONITOR_BISECT_PLAN).write_text("".join(json.dumps(x) + "\n" for x in plan_lines))
    proc = subprocess.run(["bash", "-e", "-c", script], cwd=work, env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
    return proc, calls


def test_the_dispatch_step_starts_one_bisect_per_planned_streak(files, tmp_path):
    rows = [{"suite": "cpu_unit", "tier": "cpu", "entry": "tests/unit/test_a b.py"},
            {"suite": "megatron", "tier": "gpu", "entry": "tests/e2e/test_x.py"}]
    proc, calls = _run_dispatch(files, tmp_path, rows)
    assert proc.returncode == 0, proc.stderr
    assert calls == [["workflow", "run", "bisect.yml", "--repo", "org/repo", "--ref", "main",
                      "-f", f"suite={r['suite']}", "-f", f"tier={r['tier']}", "-f", f"entry={r['entry']}",
                      "-f", "trigger=monitor"] for r in rows]


def test_no_plan_dispatches_nothing(files, tmp_path):
    for plan in (None, []):
        proc, calls = _run_dispatch(files, tmp_path / str(plan), plan)
        assert proc.returncode == 0 and calls == [] and "no streak to bisect" in proc.stdout


def test_a_bisect_comment_is_dispatched_by_the_gateway_s_run_job(files, tmp_path):
    """The gateway's `run` job acts on the decision `plan --event issue_comment` printed."""
    from ci.github.gateway_workflow import GATEWAY_PATH

    run = yaml.safe_load(files[GATEWAY_PATH])["jobs"]["run"]
    (step,) = [s for s in run["steps"] if "gh workflow run" in s.get("run", "")]
    env, log = _fake_gh(tmp_path)
    decision = {"dispatch": {"workflow": "bisect.yml", "inputs": {
        "suite": "ckpt", "tier": "gpu", "entry": "tests/e2e/test_tiny_ckpt.py", "trigger": "comment"}}}
    proc = subprocess.run(["bash", "-e", "-c", step["run"]], cwd=tmp_path,
                          env={**env, "DECISION": json.dumps(decision)}, capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert [json.loads(x) for x in log.read_text().splitlines()] == [[
        "workflow", "run", "bisect.yml", "--repo", "org/repo", "--ref", "main", "-f", "suite=ckpt",
        "-f", "tier=gpu", "-f", "entry=tests/e2e/test_tiny_ckpt.py", "-f", "trigger=comment"]]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
