"""The infrastructure verdict is read from an attempt's own status, never from what its test printed.

An honest new failure whose output says "failed to pull", "oom-kill" or "HeadStartTimeout",
or a test run outside Docker that exits 125 or 137, must be judged as the code's failure (here:
`new`, which blocks). Hypothesis then writes the output: no text makes a plain exit
infrastructure, and under Docker only 125 (and the signals) do.
"""

import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.history.store import AttemptRow
from ci.history.verdicts import SuiteRules, infra_cause, judge

NUM_GPUS = 0
E = "tests/e2e/test_download.py"
CFG = {"gpu": SuiteRules(flaky_rate=0.1, min_runs=10)}
DOCKER, LOCAL = "docker slime:latest", "local"


def attempt(outcome, reason, code, *, backend, n=1000, branch="feature", trusted=False):
    return AttemptRow(run_uid=f"{branch}-{n}", suite="gpu", commit=f"{branch[:2]}{n:08d}", branch=branch,
                      event="push", hardware="cuda", started_at=float(n), entry_id=E, path=E, attempt=1,
                      final=True, outcome=outcome, seconds=1.0, reason=reason, num_gpus=1, trusted=trusted,
                      exit_code=code, node="n1", backend=backend)


GREEN_MAIN = [attempt("passed", "", 0, backend=DOCKER, n=n, branch="main", trusted=True) for n in range(1, 6)]

# What a test can print on its way to an honest failure (a test of a downloader, of a memory guard).
TALKED_PAST = [
    ("failed", "E   AssertionError: expected 'failed to pull' in the message", 1, DOCKER),
    ("failed", "RuntimeError: docker: Error response from daemon: pull access denied for x/y", 1, DOCKER),
    ("failed", "E   AssertionError: oom-kill counter is 0", 1, DOCKER),
    ("failed", "[1.0] Out of memory: Killed process 42 (python)", 1, DOCKER),
    ("failed", "slime.utils.external_utils.ray_head.HeadStartTimeout: ray head exited with code 1 while "
               "starting", 1, DOCKER),
    ("failed", "docker: Error response from daemon: pull access denied for x/y", 125, LOCAL),  # not in Docker
    ("failed", "SystemExit: 137", 137, LOCAL),  # an exit status, not a signal, outside Docker
    ("failed", "SystemExit: 143", 143, "emulated"),
]


@pytest.mark.parametrize(("outcome", "reason", "code", "backend"), TALKED_PAST)
def test_words_in_the_output_and_exit_statuses_outside_docker_are_the_codes_failure(outcome, reason, code,
                                                                                    backend):
    judged = [attempt(outcome, reason, code, backend=backend)]
    [v] = judge(judged, GREEN_MAIN, base=None, suites=CFG)
    assert (v.kind, v.rule) == ("new", "new"), (reason, v.rule, v.evidence)


@pytest.mark.parametrize(("reason", "code", "backend", "rule"), [
    ("docker: Error response from daemon: pull access denied for x/y", 125, DOCKER, "image-pull"),
    ("docker: Error response from daemon: could not select device driver", 125, DOCKER, "docker-run"),
    ("exit code 137", 137, DOCKER, "killed"),
    ("exit code -9", -9, LOCAL, "killed"),  # Popen's own word for a signal, wherever it ran
])
def test_the_attempts_own_status_still_says_infrastructure(reason, code, backend, rule):
    [v] = judge([attempt("failed", reason, code, backend=backend)], GREEN_MAIN, base=None, suites=CFG)
    assert (v.kind, v.rule) == ("infrastructure", rule), v.evidence


@settings(max_examples=300, deadline=None, database=None)
@given(reason=st.text(max_size=120), code=st.integers(min_value=0, max_value=255),
       backend=st.sampled_from([LOCAL, "emulated", "Ray cluster at 10.0.0.1:6379, each entry a task on one node",
                                "workflow (the session recorded nothing)", ""]))
def test_no_output_and_no_exit_status_makes_a_failure_outside_docker_infrastructure(reason, code, backend):
    assert infra_cause(attempt("failed", reason, code, backend=backend)) is None, (reason, code, backend)


@settings(max_examples=300, deadline=None, database=None)
@given(reason=st.text(max_size=120), code=st.integers(min_value=0, max_value=255).filter(
    lambda c: c not in (125, 137, 143)))
def test_under_docker_only_125_and_the_signals_are_infrastructure_whatever_the_output(reason, code):
    assert infra_cause(attempt("failed", reason, code, backend=DOCKER)) is None, (reason, code)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
