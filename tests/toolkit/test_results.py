"""What counts as a pass: judging one attempt from its exit code or its JUnit report, the
reason line a failure shows, and the run's closing line. Real JUnit and log files in tmp_path;
no process started (this file is what `nox -s mutation` reruns for ci/results.py)."""

import sys
from pathlib import Path

import pytest

from ci.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE
from ci.results import (
    Attempt,
    Counts,
    Result,
    closing,
    interrupted,
    judge,
    no_test_ran,
    parse_junit,
    reason,
    run_exit_code,
    tail,
)
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0

PYTEST = ResolvedEntry(id="tests/test_a.py", path="tests/test_a.py", timeout=300.0, num_gpus=0, kind="pytest")
SCRIPT = ResolvedEntry(id="tests/e2e/x.py", path="tests/e2e/x.py", timeout=600.0, num_gpus=2, kind="script")


def junit(tmp_path: Path, *suites: tuple[int, int, int, int], wrap: bool = True) -> Path:
    body = "".join(f'<testsuite name="s{i}" tests="{t}" failures="{f}" errors="{e}" skipped="{s}"/>'
                   for i, (t, f, e, s) in enumerate(suites))
    path = tmp_path / "junit.xml"
    path.write_text(f"<testsuites>{body}</testsuites>" if wrap else body)
    return path


def log(tmp_path: Path, text: str = "") -> Path:
    path = tmp_path / "entry.log"
    path.write_text(text)
    return path


def attempt(code: int | None = 0, *, timed_out: bool = False, interrupted: bool = False) -> Attempt:
    return Attempt(returncode=code, seconds=2.5, timed_out=timed_out, interrupted=interrupted)


# --- JUnit ---------------------------------------------------------------------------------


def test_parse_junit_adds_up_every_suite(tmp_path):
    path = junit(tmp_path, (5, 1, 1, 1), (3, 0, 0, 2))
    assert parse_junit(path) == Counts(tests=8, failures=1, errors=1, skipped=3)
    assert parse_junit(path).passed == 3


def test_parse_junit_reads_a_lone_testsuite(tmp_path):
    path = junit(tmp_path, (4, 1, 0, 0), wrap=False)
    assert parse_junit(path) == Counts(tests=4, failures=1, errors=0, skipped=0)


def test_parse_junit_counts_every_test_once(tmp_path):
    # Totals on <testsuites> itself, and a lone suite whose totals include a nested one:
    # only the suites' own figures count, each once.
    wrapped = tmp_path / "wrapped.xml"
    wrapped.write_text('<testsuites tests="5" failures="1"><testsuite tests="5" failures="1">'
                       '<testcase name="a"/></testsuite></testsuites>')
    assert parse_junit(wrapped) == Counts(tests=5, failures=1)
    nested = tmp_path / "nested.xml"
    nested.write_text('<testsuite tests="3" failures="1"><testsuite tests="2" failures="1"/></testsuite>')
    assert parse_junit(nested) == Counts(tests=3, failures=1)


def test_parse_junit_missing_counts_are_zero(tmp_path):
    bare = tmp_path / "bare.xml"
    bare.write_text('<testsuites><testsuite tests="2"/><testsuite failures="1"/><testsuite/></testsuites>')
    assert parse_junit(bare) == Counts(tests=2, failures=1, errors=0, skipped=0)
    for attr in ("tests", "failures", "errors", "skipped"):
        one = tmp_path / f"{attr}.xml"
        one.write_text(f'<testsuite {attr}="4"/>')
        assert parse_junit(one) == Counts(**{attr: 4}), attr


def test_parse_junit_of_a_missing_or_broken_file_is_none(tmp_path):
    assert parse_junit(tmp_path / "none.xml") is None
    bad = tmp_path / "bad.xml"
    bad.write_text("<testsuites><testsuite")
    assert parse_junit(bad) is None


def test_counts_passed_is_never_negative():
    assert Counts(tests=2, failures=1, errors=1, skipped=1).passed == 0
    assert Counts(tests=5, failures=1, errors=1, skipped=1).passed == 2


# --- judging --------------------------------------------------------------------------------


def test_pytest_entry_passes_when_tests_ran_and_none_failed(tmp_path):
    r = judge(PYTEST, attempt(0), junit=junit(tmp_path, (3, 0, 0, 1)), log=log(tmp_path), filtering=False)
    assert (r.outcome, r.passed, r.failed, r.skipped, r.reason) == ("passed", 2, 0, 1, "")
    assert r.ok and r.seconds == 2.5 and r.returncode == 0 and r.junit_path == tmp_path / "junit.xml"
    assert r.entry is PYTEST and r.log_path == tmp_path / "entry.log"


def test_pytest_entry_that_ran_nothing_is_empty_not_green(tmp_path):
    for code, suites in ((5, (0, 0, 0, 0)), (0, (0, 0, 0, 0)), (0, (2, 0, 0, 2))):
        r = judge(PYTEST, attempt(code), junit=junit(tmp_path, suites), log=log(tmp_path), filtering=False)
        assert (r.outcome, r.failed) == ("empty", 1), (code, suites)
        assert r.reason == "ran no test: a test file must execute at least one test"
        assert not r.ok


def test_pytest_entry_that_ran_nothing_under_a_filter_is_deselected(tmp_path):
    r = judge(PYTEST, attempt(5), junit=junit(tmp_path, (0, 0, 0, 0)), log=log(tmp_path), filtering=True)
    assert (r.outcome, r.reason, r.failed) == ("deselected", "no test matched the filter", 0)
    assert r.ok


def test_pytest_entry_with_a_failure_fails_with_pytests_error_line(tmp_path):
    out = "collected 3 items\nE   AssertionError: 1 != 2\n1 failed, 2 passed\n"
    r = judge(PYTEST, attempt(1), junit=junit(tmp_path, (3, 1, 0, 0)), log=log(tmp_path, out),
              filtering=False)
    assert (r.outcome, r.passed, r.failed, r.reason) == ("failed", 2, 1, "AssertionError: 1 != 2")
    assert r.output_tail == out.rstrip("\n")


def test_failures_and_errors_both_count_as_failed(tmp_path):
    r = judge(PYTEST, attempt(1), junit=junit(tmp_path, (6, 2, 1, 1)), log=log(tmp_path), filtering=False)
    assert (r.outcome, r.passed, r.failed, r.skipped) == ("failed", 2, 3, 1)


def test_one_test_that_passed_is_a_pass(tmp_path):
    r = judge(PYTEST, attempt(0), junit=junit(tmp_path, (1, 0, 0, 0)), log=log(tmp_path), filtering=False)
    assert (r.outcome, r.passed) == ("passed", 1)


def test_a_report_with_failures_fails_even_on_exit_code_0(tmp_path):
    # Not "empty": tests ran; the report, not the exit code, says one failed.
    r = judge(PYTEST, attempt(0), junit=junit(tmp_path, (2, 1, 0, 0)), log=log(tmp_path), filtering=False)
    assert (r.outcome, r.failed, r.reason) == ("failed", 1, "exit code 0")


def test_pytest_entry_failing_by_exit_code_alone_still_fails(tmp_path):
    # A report of green tests with a non-zero exit (a crash at teardown) is not a pass.
    r = judge(PYTEST, attempt(3), junit=junit(tmp_path, (2, 0, 0, 0)), log=log(tmp_path), filtering=False)
    assert (r.outcome, r.failed, r.reason) == ("failed", 1, "exit code 3")


def test_pytest_entry_without_a_report_fails_and_says_so(tmp_path):
    r = judge(PYTEST, attempt(-9), junit=tmp_path / "none.xml", log=log(tmp_path), filtering=False)
    assert (r.outcome, r.failed, r.reason) == ("failed", 1, "pytest wrote no report (exit code -9)")


def test_script_entry_is_judged_by_its_exit_code(tmp_path):
    ok = judge(SCRIPT, attempt(0), junit=tmp_path / "none.xml", log=log(tmp_path), filtering=False)
    assert (ok.outcome, ok.passed, ok.failed, ok.reason, ok.junit_path) == ("passed", 1, 0, "", None)
    assert ok.entry is SCRIPT and ok.log_path == tmp_path / "entry.log"
    bad = judge(SCRIPT, attempt(2), junit=tmp_path / "none.xml", log=log(tmp_path), filtering=False)
    assert (bad.outcome, bad.passed, bad.failed, bad.reason) == ("failed", 0, 1, "exit code 2")
    told = judge(SCRIPT, attempt(1), junit=tmp_path / "none.xml",
                 log=log(tmp_path, "step 1\nRuntimeError: NCCL timeout\n"), filtering=False)
    assert told.reason == "RuntimeError: NCCL timeout"


def test_timeout_and_interrupt_come_before_the_report(tmp_path):
    report = junit(tmp_path, (3, 0, 0, 0))
    t = judge(PYTEST, attempt(None, timed_out=True), junit=report, log=log(tmp_path), filtering=False)
    assert (t.outcome, t.failed) == ("timeout", 1)
    assert t.reason == "timed out after 300s; the whole process group was killed"
    i = judge(SCRIPT, attempt(None, interrupted=True, timed_out=True), junit=report, log=log(tmp_path),
              filtering=False)
    assert (i.outcome, i.failed, i.reason) == ("interrupted", 1, "interrupted")


# --- the reason line ------------------------------------------------------------------------


def test_reason_prefers_pytests_first_error_line():
    out = "E   ValueError: first\nE   KeyError: second\nTypeError: last traceback line\n"
    assert reason(out) == "ValueError: first"


def test_reason_then_the_last_exception_line():
    out = "Traceback (most recent call last):\n  File x\nOSError: one\nsubprocess.CalledProcessError: two\n"
    assert reason(out) == "subprocess.CalledProcessError: two"


def test_reason_then_the_last_telling_line_not_noise():
    out = ("pulling image\ndocker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock.\n"
           "See 'docker run --help'.\n\n")
    assert reason(out) == "docker: Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
    assert reason("step one\nstep two\n=====\n") == "step two"
    assert reason("") == "" and reason("\n  \n-----\n") == ""
    # A telling line beats a later plain one; a telling line that is only a hint does not count.
    assert reason("fatal: bad object HEAD\nplain last line\n") == "fatal: bad object HEAD"
    assert reason("fatal: bad thing\nerror: see --help for more information\n") == "fatal: bad thing"


def test_reason_is_cut_at_200_characters():
    long = "x" * 300
    assert reason(f"E   ValueError: {long}") == f"ValueError: {long}"[:200]
    assert reason(f"Error {long}") == f"Error {long}"[:200]
    assert reason(f"it failed {long}") == f"it failed {long}"[:200]
    assert reason(f"plain {long}") == f"plain {long}"[:200]


def test_tail_keeps_the_last_lines(tmp_path):
    path = log(tmp_path, "".join(f"line {i}\n" for i in range(100)))
    assert tail(path, 3) == "line 97\nline 98\nline 99"
    assert tail(path).splitlines()[0] == "line 40"
    assert tail(tmp_path / "missing.log") == ""


def test_tail_reads_the_last_64000_bytes_and_survives_bad_utf8(tmp_path):
    path = tmp_path / "big.log"
    path.write_bytes(b"a" * 70_000 + b"\nlast\n")
    first, last = tail(path).splitlines()
    assert (len(first), last) == (64_000 - len(b"\nlast\n"), "last")
    path.write_bytes(b"ok\n\xff\xfe bad\n")
    assert tail(path) == "ok\n\ufffd\ufffd bad"


# --- the closing line -----------------------------------------------------------------------


def result(outcome, passed=0, failed=0, skipped=0) -> Result:
    return Result(entry=PYTEST, outcome=outcome, passed=passed, failed=failed, skipped=skipped)


def test_closing_line_adds_up_tests():
    rs = [result("passed", 5, 0, 1), result("failed", 2, 3, 0), result("passed", 1, 0, 2)]
    assert closing("cpu_unit", rs) == "cpu_unit: 8 passed, 3 failed, 3 skipped"


def test_closing_line_of_an_interrupted_run_counts_entries_apart():
    rs = [result("passed", 4, 0, 1), result("failed", 0, 3, 0), interrupted(PYTEST),
          interrupted(PYTEST, "did not run: interrupted")]
    assert closing("toolkit", rs) == ("toolkit: interrupted; 2 of 4 entries finished (2 stopped or never run); "
                                      "tests: 4 passed, 3 failed, 1 skipped")
    assert rs[3].reason == "did not run: interrupted" and rs[2].failed == 1
    assert (rs[2].reason, rs[2].outcome, rs[2].entry) == ("interrupted", "interrupted", PYTEST)


def test_quarantined_entries_are_counted_apart_and_their_failures_fail_nothing():
    held = result("quarantined", 1, 2, 0)
    assert closing("cpu_unit", [result("passed", 5, 0, 1), held]) == (
        "cpu_unit: 6 passed, 0 failed, 1 skipped, 1 quarantined")
    assert closing("cpu_unit", [result("failed", 0, 3), held, held]) == (
        "cpu_unit: 2 passed, 3 failed, 0 skipped, 2 quarantined")


# --- a node lost, a remote failure ----------------------------------------------------------


def test_a_lost_node_or_a_remote_error_decides_over_the_process(tmp_path):
    """A pytest that reported a pass on a node that then died did not pass here."""
    ran = junit(tmp_path, (3, 0, 0, 0))
    base = dict(returncode=0, seconds=2.5, timed_out=False, interrupted=False)
    lost = judge(PYTEST, Attempt(**base, lost="node n1 died"), junit=ran, log=log(tmp_path), filtering=False)
    assert (lost.outcome, lost.passed, lost.failed, lost.reason, lost.seconds) == ("lost", 3, 1, "node n1 died", 2.5)
    error = judge(PYTEST, Attempt(**base, error="remote: no space"), junit=ran, log=log(tmp_path),
                  filtering=False)
    assert (error.outcome, error.passed, error.failed, error.reason) == ("failed", 3, 1, "remote: no space")
    # Its own failures are kept when there were more than one.
    two = junit(tmp_path, (3, 2, 0, 0))
    assert judge(PYTEST, Attempt(**base, lost="n1"), junit=two, log=log(tmp_path), filtering=False).failed == 2
    assert judge(PYTEST, Attempt(**base, error="e"), junit=two, log=log(tmp_path), filtering=False).failed == 2
    # A lost node wins over an error; an interrupt over both.
    both = judge(PYTEST, Attempt(**base, lost="n1", error="e"), junit=ran, log=log(tmp_path), filtering=False)
    assert (both.outcome, both.reason) == ("lost", "n1")
    stopped = judge(PYTEST, Attempt(**{**base, "interrupted": True}, lost="n1", error="e"), junit=ran,
                    log=log(tmp_path), filtering=False)
    assert (stopped.outcome, stopped.reason) == ("interrupted", "interrupted")


# --- the run's exit code --------------------------------------------------------------------


def test_no_test_ran_unless_one_passed_or_a_quarantine_held_one_back():
    assert no_test_ran([]) and no_test_ran([result("deselected"), result("failed", 0, 1)])
    assert not no_test_ran([result("passed", 1)])
    assert not no_test_ran([result("deselected"), result("quarantined", 0, 1)])


def test_the_exit_code_of_a_run():
    waited = Result(entry=PYTEST, outcome="timeout", failed=1, queued_at=1.0)  # never got its GPUs
    ran_out = Result(entry=PYTEST, outcome="timeout", failed=1, queued_at=1.0, started_at=2.0)
    assert run_exit_code([result("passed", 2)]) == EXIT_OK
    assert run_exit_code([result("passed", 2), result("quarantined", 0, 1)]) == EXIT_OK
    assert run_exit_code([result("passed", 2), result("failed", 0, 1)]) == EXIT_FAILED
    assert run_exit_code([result("deselected")]) == EXIT_FAILED  # no test ran
    assert run_exit_code([result("passed", 2), interrupted(PYTEST), waited]) == EXIT_INTERRUPTED
    assert run_exit_code([result("passed", 2), waited]) == EXIT_TIMEOUT
    assert run_exit_code([result("passed", 2), ran_out]) == EXIT_FAILED  # it ran: a test's timeout
    # A gate naming a metric its entry never writes: fix the registry (2), only when it failed.
    assert run_exit_code([result("failed", 0, 1)], misdeclared=True) == EXIT_USAGE
    assert run_exit_code([result("deselected")], misdeclared=True) == EXIT_USAGE
    assert run_exit_code([result("passed", 1)], misdeclared=True) == EXIT_OK


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
