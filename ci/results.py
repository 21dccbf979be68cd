"""Results: what happened to one entry, and the rules that decide it.

Outcomes, the `Result` record, JUnit parsing and judging an attempt all live here,
so the runner, the report and the session read one set of rules.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from ci.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE
from ci.select.entries import ResolvedEntry


@dataclass(frozen=True, kw_only=True)
class MetricPoint:
    """One value an e2e entry wrote to metrics.jsonl (the run history keeps them)."""

    entry_id: str
    step: int
    name: str
    value: float


Outcome = Literal["passed", "failed", "timeout", "empty", "deselected", "flaky", "interrupted", "lost",
                  "quarantined"]
# "quarantined": the registry or the flake history quarantined the entry; whatever it did,
# it does not fail the job (ci/history/quarantine.py).
OK_OUTCOMES: frozenset[str] = frozenset({"passed", "deselected", "flaky", "quarantined"})
# Outcomes whose duration says nothing about the entry's next run.
UNMEASURED: frozenset[str] = frozenset({"interrupted", "deselected", "timeout", "lost"})
PYTEST_NO_TESTS = 5  # pytest's exit code when it collected (or selected) nothing
NOT_RUN = "did not run: interrupted"


@dataclass(frozen=True, kw_only=True)
class Result:
    """What happened to one entry."""

    entry: ResolvedEntry
    outcome: Outcome
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    seconds: float = 0.0
    returncode: int | None = None
    attempts: int = 1
    devices: tuple[int, ...] = ()
    reason: str = ""  # one line for the summary: the error the file raised, the timeout…
    output_tail: str = ""
    log_path: Path | None = None
    junit_path: Path | None = None
    # Wall-clock (epoch seconds) for the run timeline: when the entry began waiting for
    # its GPUs (None: it needed none), when it got them and started, when it ended.
    queued_at: float | None = None
    started_at: float | None = None
    ended_at: float | None = None
    node: str = ""  # where it ran: the hostname, or the cluster node
    earlier: tuple[Result, ...] = ()  # attempts before this one (retries), oldest first
    metrics: tuple[MetricPoint, ...] = ()  # an e2e entry's metrics.jsonl, read before its outputs go
    # What it executed (`run --record-executed`, a passing entry): repository file -> functions,
    # as ci.select.executed reduces them; None: not recorded.
    executed: Mapping[str, tuple[str, ...]] | None = None
    # And the lines it ran: repository file -> (its git blob id, the lines as spans).
    executed_lines: Mapping[str, tuple[str, str]] | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in OK_OUTCOMES


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """How one attempt of an entry ended, wherever it ran (this host, a container, a cluster node)."""

    returncode: int | None
    seconds: float
    timed_out: bool
    interrupted: bool
    devices: tuple[int, ...] = ()  # the GPUs it held, host ids on its node
    node: str | None = None  # where it ran; None: this machine (the runner names it)
    queued_at: float | None = None  # when it began waiting to be placed elsewhere (a cluster)
    started_at: float | None = None
    ended_at: float | None = None
    lost: str = ""  # its node died under it: why, naming the node (the runner retries once)
    error: str = ""  # the remote side failed for another reason


def gpu_row(node: str, device: int) -> str:
    """A GPU as the timeline and the backends name it: `node:device`."""
    return f"{node}:{device}"


@dataclass(frozen=True, kw_only=True)
class Counts:
    """Test counts of one JUnit report."""

    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def passed(self) -> int:
        return max(0, self.tests - self.failures - self.errors - self.skipped)


def junit_suites(root: ET.Element) -> list[ET.Element]:
    """The `<testsuite>` elements of a JUnit document (a lone suite or a `<testsuites>`)."""
    return [root] if root.tag == "testsuite" else list(root.iter("testsuite"))


def parse_junit(path: Path) -> Counts | None:
    """Counts from a JUnit file; None when it is missing or unreadable (a crash, a kill)."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return None
    tests = failures = errors = skipped = 0
    for suite in junit_suites(root):
        tests += int(suite.get("tests", 0))
        failures += int(suite.get("failures", 0))
        errors += int(suite.get("errors", 0))
        skipped += int(suite.get("skipped", 0))
    return Counts(tests=tests, failures=failures, errors=errors, skipped=skipped)


def tail(log: Path, lines: int = 60) -> str:
    """The last lines of a log file ("" when it cannot be read)."""
    try:
        data = log.read_bytes()[-64_000:]
    except OSError:
        return ""
    return "\n".join(data.decode("utf-8", "replace").splitlines()[-lines:])


_PYTEST_ERROR = re.compile(r"^E\s+(\w*(?:Error|Exception|Exit)\b.*)$")
_EXCEPTION = re.compile(r"^[\w.]*(?:Error|Exception|Exit|Interrupt)\b")
# A line that says what went wrong, in the words tools use (docker, bash, pip, git…).
_TELLING = re.compile(r"(?i)\b(?:error|cannot|can't|could not|failed|fatal|denied|not found|"
                      r"no such|refused|unable|killed|timed out)\b")
# Lines that follow an error and say nothing about it: usage hints, separators.
_NOISE = re.compile(r"(?i)--help\b|for more information|^=+|^-+$|^\s*$")


def reason(output: str) -> str:
    """The most telling line of a failed entry's output, not merely its last.

    In order: the exception pytest reports (`E   ValueError: …`), the last exception
    line of a traceback, the last line that names a failure in a tool's words
    ("Cannot connect to the Docker daemon…"), and only then the last line.
    """
    lines = output.splitlines()
    for line in lines:
        match = _PYTEST_ERROR.match(line)
        if match:
            return match.group(1).strip()[:200]
    for line in reversed(lines):
        if _EXCEPTION.match(line.strip()):
            return line.strip()[:200]
    for line in reversed(lines):
        if _TELLING.search(line) and not _NOISE.search(line):
            return line.strip()[:200]
    for line in reversed(lines):
        if not _NOISE.search(line):
            return line.strip()[:200]
    return ""


def judge(entry: ResolvedEntry, attempt: Attempt, *, junit: Path, log: Path,
          filtering: bool) -> Result:
    """The outcome of one attempt: a lost node or a remote failure first, then its exit code
    (scripts) or its JUnit report (pytest)."""
    result = _judge_process(entry, attempt, junit=junit, log=log, filtering=filtering)
    if attempt.interrupted:
        return result
    if attempt.lost:
        return replace(result, outcome="lost", failed=max(1, result.failed), reason=attempt.lost)
    if attempt.error:
        return replace(result, outcome="failed", failed=max(1, result.failed), reason=attempt.error)
    return result


def _judge_process(entry: ResolvedEntry, attempt: Attempt, *, junit: Path, log: Path,
                   filtering: bool) -> Result:
    out = tail(log)
    base = Result(entry=entry, outcome="failed", seconds=attempt.seconds,
                  returncode=attempt.returncode, output_tail=out, log_path=log,
                  junit_path=junit if entry.kind == "pytest" else None)
    if attempt.interrupted:
        return replace(base, outcome="interrupted", failed=1, reason="interrupted")
    if attempt.timed_out:
        return replace(base, outcome="timeout", failed=1,
                       reason=f"timed out after {entry.timeout:.0f}s; the whole process group was killed")
    if entry.kind == "script":
        ok = attempt.returncode == 0
        return replace(base, outcome="passed" if ok else "failed", passed=int(ok), failed=int(not ok),
                       reason="" if ok else (reason(out) or f"exit code {attempt.returncode}"))
    counts = parse_junit(junit)
    if counts is None:
        return replace(base, failed=1,
                       reason=reason(out) or f"pytest wrote no report (exit code {attempt.returncode})")
    result = replace(base, passed=counts.passed, failed=counts.failures + counts.errors,
                     skipped=counts.skipped)
    executed = counts.tests - counts.skipped
    if attempt.returncode == 0 and executed > 0 and result.failed == 0:
        return replace(result, outcome="passed")
    if attempt.returncode == PYTEST_NO_TESTS or (attempt.returncode == 0 and executed == 0):
        if filtering:
            return replace(result, outcome="deselected", reason="no test matched the filter")
        # The original CI counted files that ran nothing as green; here they fail.
        return replace(result, outcome="empty", failed=max(1, result.failed),
                       reason="ran no test: a test file must execute at least one test")
    return replace(result, failed=max(1, result.failed),
                   reason=reason(out) or f"exit code {attempt.returncode}")


def interrupted(entry: ResolvedEntry, why: str = "interrupted") -> Result:
    """An entry the interrupt stopped, or one that never started."""
    return Result(entry=entry, outcome="interrupted", failed=1, reason=why)


def closing(suite: str, results: Sequence[Result]) -> str:
    """The run's closing line: test counts; an interrupted run says so and counts entries apart."""
    passed = sum(r.passed for r in results)
    skipped = sum(r.skipped for r in results)
    stopped = [r for r in results if r.outcome == "interrupted"]
    held = sum(r.outcome == "quarantined" for r in results)
    if not stopped:
        # A quarantined entry's failures do not fail the job: they are counted apart.
        failed = sum(r.failed for r in results if r.outcome != "quarantined")
        tail = f", {held} quarantined" if held else ""
        return f"{suite}: {passed} passed, {failed} failed, {skipped} skipped{tail}"
    # Entries the interrupt ended, or never started, are neither passed nor failed tests.
    failed = sum(r.failed for r in results if r.outcome != "interrupted")
    finished = len(results) - len(stopped)
    return (f"{suite}: interrupted; {finished} of {len(results)} entries finished "
            f"({len(stopped)} stopped or never run); tests: {passed} passed, {failed} failed, "
            f"{skipped} skipped")


def no_test_ran(results: Sequence[Result]) -> bool:
    """Nothing passed and nothing was held back by a quarantine: the run tested nothing."""
    return sum(r.passed for r in results) == 0 and not any(r.outcome == "quarantined" for r in results)


def run_exit_code(results: Sequence[Result], *, misdeclared: bool = False) -> int:
    """The exit code of a run, from its (gated, quarantined) results.

    130 an entry was interrupted; 124 an entry gave up waiting for its GPUs (--lock-timeout);
    1 something failed or no test ran; 2 instead of 1 when a metric gate names a metric
    its entry never writes (`misdeclared`: fix the registry); else 0.
    """
    if any(r.outcome == "interrupted" for r in results):
        return EXIT_INTERRUPTED
    if any(r.outcome == "timeout" and r.started_at is None and r.queued_at is not None
           for r in results):
        return EXIT_TIMEOUT
    if any(not r.ok for r in results) or no_test_ran(results):
        return EXIT_USAGE if misdeclared else EXIT_FAILED
    return EXIT_OK
