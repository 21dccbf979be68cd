"""The verdict rules, one planted case per rule: each case gets its rule's verdict, and only by it."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.history.store import AttemptRow
from ci.history.verdicts import RULES, Base, SuiteRules, blocking, infra_cause, judge

NUM_GPUS = 0
E = "tests/e2e/test_x.py"
CFG = {"gpu": SuiteRules(flaky_rate=0.1, min_runs=10)}
PR_AT = 10_000.0


def row(n, outcome, *, branch="main", attempt=1, final=True, reason="", exit_code=None, trusted=True,
        commit=None, pr=None, node="n1", entry=E, backend="docker slime:latest"):
    return AttemptRow(run_uid=f"{branch}-{n}", suite="gpu", commit=commit or f"{branch[:2]}{n:08d}",
                      branch=branch, event="push", hardware="cuda", started_at=float(n * 10),
                      entry_id=entry, path=entry.split()[0], attempt=attempt, final=final, outcome=outcome,
                      seconds=1.0, reason=reason, num_gpus=1, trusted=trusted, pr=pr, exit_code=exit_code,
                      node=node, backend=backend)


def pr(*attempts, backend="docker slime:latest"):
    """One PR run's attempts of E: (outcome, reason, exit_code) each, the last one final."""
    return [row(int(PR_AT // 10), o, branch="feature", attempt=i, final=i == len(attempts), reason=why,
                exit_code=code, trusted=False, pr=5, backend=backend)
            for i, (o, why, code) in enumerate(attempts, 1)]


GREEN_MAIN = [row(n, "passed") for n in range(1, 6)]


def flaky_history(every, reason):
    """20 runs on main; one in `every` failed with `reason`, then passed on its retry."""
    rows = []
    for n in range(1, 21):
        if n % every == 0:
            rows += [row(n, "failed", final=False, reason=reason), row(n, "flaky", attempt=2)]
        else:
            rows.append(row(n, "passed"))
    return rows
FAIL = ("failed", "E   AssertionError: loss is nan", 1)

# rule id -> (this run's attempts, the history, the base); the expected verdict is the rule's own.
CASES = {
    "node-lost": (pr(("lost", "node gpu-7 lost mid-entry", None)), GREEN_MAIN, None),
    "interrupted": (pr(("interrupted", "interrupted", None)), GREEN_MAIN, None),
    "gpu-wait": (pr(("timeout", "timed out after 600s waiting for 2 GPU(s): GPUs 0,1 held by pid 7", 124)),
                 GREEN_MAIN, None),
    "killed": (pr(("failed", "exit code 137", 137)), GREEN_MAIN, None),  # the OOM killer's SIGKILL, in Docker
    "image-pull": (pr(("failed", "docker: Error response from daemon: pull access denied for x/y", 125)),
                   GREEN_MAIN, None),
    "docker-run": (pr(("failed", "docker: Error response from daemon: could not select device driver", 125)),
                   GREEN_MAIN, None),
    "flaky-retry": (pr(FAIL, ("flaky", "failed 1 time(s), then passed", 0)), GREEN_MAIN, None),
    "main-broken": (pr(FAIL), [*GREEN_MAIN, row(7, "failed", reason="boom"), row(8, "failed", reason="boom")],
                    None),
    "flaky-rate": (pr(FAIL), [*flaky_history(4, FAIL[1]), row(21, "failed", reason=FAIL[1])], None),
    "main-failed-last": (pr(FAIL), [*GREEN_MAIN, row(7, "failed", reason="boom")], None),
    "same-flake": (pr(FAIL, FAIL), flaky_history(10, FAIL[1]), None),  # 10 %: not above the threshold
    "no-history": (pr(FAIL), [row(n, "passed", entry="tests/other.py") for n in range(1, 4)], None),
    "base-unknown": (pr(FAIL), GREEN_MAIN, Base(commit="deadbeef00", at=None)),
    "not-since-base": (pr(FAIL), GREEN_MAIN, Base(commit="ma00000009", at=90.0)),
    "new": (pr(FAIL), GREEN_MAIN, Base(commit="ma00000003", at=30.0)),
    "no-rule": None,  # reached only when the table above it is edited; checked apart below
}


def test_every_rule_has_its_case():
    assert [r.id for r in RULES] == list(CASES), "a rule without a planted case, or a case without a rule"


@pytest.mark.parametrize("rule_id", [k for k, v in CASES.items() if v is not None])
def test_each_rule_gives_its_verdict(rule_id):
    judged, history, base = CASES[rule_id]
    [v] = judge(judged, history, base=base, suites=CFG)
    rule = next(r for r in RULES if r.id == rule_id)
    assert (v.rule, v.kind) == (rule_id, rule.verdict), v.evidence
    assert v.evidence and v.path == E


def test_the_evidence_names_what_a_reader_checks():
    judged, history, base = CASES["main-broken"]
    [v] = judge(judged, history, base=base, suites=CFG)
    assert "since ma00000007" in v.evidence and "2 run(s)" in v.evidence
    assert "bisect ma00000005..ma00000007" in v.evidence
    judged, history, base = CASES["new"]
    [v] = judge(judged, history, base=base, suites=CFG)
    assert "passed on main at ma00000005" in v.evidence and "3 of 3 run(s)" in v.evidence
    judged, history, base = CASES["flaky-rate"]
    [v] = judge(judged, history, base=base, suites=CFG)
    assert "flake rate 24% (5 of 21 runs" in v.evidence and "above the suite's 10%" in v.evidence


def test_a_flake_rate_explains_only_a_failure_the_entry_flaked_with_before():
    stalled = ("failed", "TimeoutError: rollout stalled after 600 s", 1)
    history = flaky_history(4, "TimeoutError: rollout stalled after 412 s")
    [v] = judge(pr(stalled, stalled), history, base=None, suites=CFG)
    assert v.rule == "flaky-rate", "the same failure, numbers aside, as its flakes"
    [v] = judge(pr(FAIL, FAIL), history, base=None, suites=CFG)
    assert v.rule == "new", "a flaky entry that fails in a new way is judged as any other"
    once = flaky_history(20, FAIL[1])  # it flaked this way only once: not yet a pattern
    [v] = judge(pr(FAIL), once, base=None, suites=CFG)
    assert v.rule == "new", v.evidence


def test_one_failure_on_main_the_way_the_entry_flakes_is_not_a_break():
    history = [*flaky_history(10, FAIL[1]), row(21, "failed", reason=FAIL[1])]
    [v] = judge(pr(FAIL), history, base=None, suites=CFG)
    assert v.rule == "same-flake", v.evidence
    history[-1] = row(21, "failed", reason="ImportError: cannot import name 'x'")
    [v] = judge(pr(FAIL), history, base=None, suites=CFG)
    assert v.rule == "main-failed-last", v.evidence


def test_the_last_rule_says_unknown_rather_than_guess():
    from ci.history.verdicts import Facts, Trial, decide

    # A trial no earlier rule explains (a main pass, then only infra since): the table's end.
    facts = Facts(trial=Trial(suite="gpu", entry_id=E, attempts=tuple(pr(FAIL))),
                  main=(row(1, "failed"), row(2, "passed")), flakes=None, flaky_rate=None, min_runs=10,
                  base=None)
    rule, _ = decide(facts)
    assert rule.id == "new"
    rule, evidence = RULES[-1], RULES[-1].match(facts)
    assert (rule.verdict, evidence) == ("unknown", "no rule matched: the evidence does not say")


def test_a_pull_requests_own_runs_are_never_its_baseline():
    """A PR's earlier green run on `main`'s name (untrusted) must not make the failure look new."""
    untrusted_green = [row(n, "passed", trusted=False) for n in range(1, 6)]
    [v] = judge(pr(FAIL), untrusted_green, base=None, suites=CFG)
    assert (v.kind, v.rule) == ("unknown", "no-history")


def test_infrastructure_failures_on_main_neither_break_nor_clear_it():
    history = [*GREEN_MAIN, row(7, "lost", reason="node gpu-2 lost mid-entry"), row(8, "failed", exit_code=-9)]
    [v] = judge(pr(FAIL), history, base=None, suites=CFG)
    assert v.kind == "new", v.evidence  # main's two infra failures are not a streak


def test_a_crash_of_the_code_is_not_infrastructure():
    for code in (-11, -6, 139, 1):
        assert infra_cause(row(1, "failed", exit_code=code, reason="Segmentation fault")) is None
    assert infra_cause(row(1, "timeout", reason="timed out after 900s; the whole process group was killed")) \
        is None, "an entry that hung judged the code"


def test_lost_then_passed_is_infrastructure_not_a_flake():
    judged = pr(("lost", "node gpu-7 lost mid-entry", None), ("flaky", "node gpu-7 lost; passed on n2", 0))
    [v] = judge(judged, GREEN_MAIN, base=None, suites=CFG)
    assert (v.kind, v.rule) == ("infrastructure", "node-lost")
    mixed = pr(FAIL, ("flaky", "failed 1 time(s), then passed", 0))
    [v] = judge(mixed, GREEN_MAIN, base=None, suites=CFG)
    assert v.kind == "flaky"


def test_passing_entries_get_no_verdict_and_the_suite_says_what_blocks():
    judged = [*pr(FAIL), row(int(PR_AT // 10), "passed", branch="feature", entry="tests/ok.py", trusted=False)]
    history = [*GREEN_MAIN, *(row(n, "passed", entry="tests/ok.py") for n in range(1, 6))]
    verdicts = judge(judged, history, base=None, suites=CFG)
    assert [v.entry_id for v in verdicts] == [E]
    assert blocking(verdicts, CFG) == verdicts
    lenient = {"gpu": SuiteRules(flaky_rate=0.1, min_runs=10, blocks=("unknown",))}
    assert blocking(verdicts, lenient) == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
