"""Pull requests through the generated pr-test.yml under a real act (`python -m ci actions`):
which jobs ran, their commands, the REST calls, and that `python -m ci plan` agrees.

act is real and runs each job on this host; GitHub's actions, `gh` and REST API are the
loopback stand-ins of ci/actions/ (this machine has no GitHub), `nox` the recording stand-in.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _act import commands, ran, requests, session

from ci.actions.events import EventSpec
from ci.github.pr_verdicts import MARKER

NUM_GPUS = 0
pytestmark = pytest.mark.slow  # act runs each PR's jobs: ~15-30 s an event on 2 cores

GPU_JOBS = {"sglang_config", "megatron", "precision", "ckpt", "image", "changed"}
CPU_JOBS = {"cpu_unit", "agent_adapter", "toolkit", "lint", "gpu_smoke"}
CODE = ("slime/loop.py",)


@pytest.fixture(scope="module")
def act(tmp_path_factory):
    yield from session(tmp_path_factory.mktemp("actions"))


def test_a_pr_touching_slime_runs_the_cpu_jobs_and_no_gpu_job(act):
    out = act.run(EventSpec(name="pull_request", action="opened", paths=CODE))
    assert set(ran(out)) == {"plan", *CPU_JOBS, "verdict"}
    assert out.disagreements == ()
    skipped = {j.job: j.why for j in out.jobs if j.job in GPU_JOBS}
    assert all(why.startswith("if: !cancelled()") for why in skipped.values()), skipped
    assert commands(out, "cpu_unit") == ["nox -s cpu_unit",
                                         "nox -s history -- record --suite cpu_unit --status success "
                                         "--export .ci-cache/history-export"]  # CPU jobs export too
    plan = commands(out, "plan")
    assert plan[0].startswith("python -m ci plan --event pull_request --labels '' --paths-from ")
    assert plan[0].endswith("--github --action opened")
    assert all(j.result == "success" for j in ran(out).values())
    posted = requests(out, "POST", "/issues/7/comments")
    assert len(posted) == 1 and str(posted[0]["body"]["body"]).startswith(MARKER)  # type: ignore[index]


def test_a_docs_only_pr_runs_no_gpu_job_even_with_its_label(act):
    out = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron",), paths=("docs/workflow.md",)))
    assert "megatron" not in ran(out) and "plan" in ran(out)
    assert out.disagreements == ()
    assert set(ran(out)) & GPU_JOBS == set()


def test_the_megatron_label_runs_megatron_alone_and_a_second_push_edits_the_verdict(act):
    spec = EventSpec(name="pull_request", labels=("run-ci-megatron",), paths=CODE)
    first = act.run(spec)
    assert set(ran(first)) & GPU_JOBS == {"megatron"}
    assert first.disagreements == ()
    # A PR runs the entries its diff reaches: the NARROW expression was true under act.
    assert commands(first, "megatron")[0] == "nox -s megatron -- --by-executed 'HEAD^1'"
    assert not any(c.startswith("nox -s megatron") for j in CPU_JOBS for c in commands(first, j))
    # The GPU job's runs go to the ingest as an artifact named for the job.
    assert any(r["tool"] == "upload-artifact" and r["argv"][0] == "history-megatron" and r["job"] == "megatron"
               for r in first.records)
    # A new commit on the same PR whose megatron session fails: the failure reaches the verdict
    # job through `needs`, and the one sticky comment is edited in place.
    second = act.run(spec, fail={"megatron": 1})
    assert ran(second)["megatron"].result == "failure" and ran(second)["verdict"].result == "failure"
    edited = requests(second, "PATCH", "/issues/comments/")
    assert len(edited) == 1 and not requests(second, "POST", "/issues/7/comments")
    assert len(second.github.comments[7]) == 1
    body = second.github.comments[7][0]["body"]
    assert body.startswith(MARKER) and "**verdict: fail.**" in body and "`megatron`" in body


def test_a_fork_pr_with_the_label_runs_no_gpu_job_and_sees_no_secret(act):
    out = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron",), fork=True, paths=CODE))
    assert set(ran(out)) & GPU_JOBS == set() and "cpu_unit" in ran(out)
    assert out.disagreements == ()
    seen = [env for j in out.jobs if j.workflow == "pr-test.yml" for env in j.env]
    assert len(seen) > 10  # every recorded command of every job that ran
    leaked = [(k, v) for env in seen for k, v in env.items() for s in act.secrets.values() if s in v]
    assert leaked == []


def test_an_unrelated_label_reruns_nothing(act):
    out = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron", "documentation"),
                            added="documentation", paths=CODE))
    assert set(ran(out)) == {"plan", "verdict"}
    assert out.disagreements == ()
    why = {j.job: j.why for j in out.jobs}
    assert "github.event.action != 'labeled'" in why["cpu_unit"]



def test_the_if_rules_alone_keep_gpu_jobs_from_forks_other_labels_and_unrelated_labels(act):
    """The plan's output guards GPU jobs too, so a broken label or fork rule in the rendered
    `if:` would hide behind it: here the plan's `jobs` output lists every GPU job, and only the
    rules the generator rendered decide."""
    every = sorted(GPU_JOBS)
    own = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron",), paths=CODE), plan_jobs=every)
    assert set(ran(own)) & GPU_JOBS == {"megatron"}  # each other GPU job wants its own label
    fork = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron",), fork=True, paths=CODE),
                   plan_jobs=every)
    assert set(ran(fork)) & GPU_JOBS == set()
    other = act.run(EventSpec(name="pull_request", labels=("run-ci-megatron", "documentation"),
                              added="documentation", paths=CODE), plan_jobs=every)
    assert set(ran(other)) == {"plan", "verdict"}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider"]))
