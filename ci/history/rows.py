"""What the history keeps: a run, its entry attempts, e2e metric points. Pure builders."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ci.history.failure_site import failure_site
from ci.results import MetricPoint, Result

METRICS_FILE = "metrics.jsonl"
# Entries write a few dozen metrics per step; a runaway writer must not fill the store.
MAX_POINTS_PER_ENTRY = 20_000
# What a test writes is read, never trusted: at most this much of the file, and a step
# only when the store's integer column can hold it (PostgreSQL's INTEGER is 32-bit).
MAX_METRICS_BYTES = 32 * 1024 * 1024
STEP_MIN, STEP_MAX = -(2**31), 2**31 - 1
MAX_NAME_CHARS = 256


@dataclass(frozen=True, kw_only=True)
class AttemptRecord:
    """One process of one entry."""

    entry_id: str
    path: str
    attempt: int
    final: bool
    outcome: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    num_gpus: int = 0
    devices: str = ""
    node: str = ""
    seconds: float = 0.0
    reason: str = ""
    exit_code: int | None = None  # the process's status; negative: killed by that signal
    # Where its failure's assertion is (ci/history/failure_site.py): "" and None when unknown.
    fail_path: str = ""
    fail_line: int | None = None


# What one run may keep of what its entries executed (`run --record-executed`): beyond these
# bounds a record is refused, never cut (a cut record would leave out functions it ran).
MAX_EXECUTED_FILES = 20_000  # repository files per entry
MAX_EXECUTED_FUNCTIONS = 200_000  # functions per entry, all files together
MAX_FUNCTION_CHARS = 1024
MAX_SPAN_CHARS = 2_000_000  # the lines of all its files, as spans, per entry
_BLOB = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a git blob id (SHA-1 or SHA-256)
_SPANS = re.compile(r"[1-9][0-9]*(-[1-9][0-9]*)?(,[1-9][0-9]*(-[1-9][0-9]*)?)*")


def lines_problem(lines: object) -> str | None:
    """What is wrong with a record's lines ({file: [blob, spans]}), else None (pure)."""
    if not isinstance(lines, Mapping) or len(lines) > MAX_EXECUTED_FILES:
        return f"`lines` is not an object of at most {MAX_EXECUTED_FILES} files"
    total = 0
    for path, value in lines.items():
        pair = tuple(value) if isinstance(value, (list, tuple)) else ()
        if (not isinstance(path, str) or not 0 < len(path) <= MAX_FUNCTION_CHARS or "\x00" in path
                or len(pair) != 2 or not all(isinstance(v, str) for v in pair)
                or not _BLOB.fullmatch(pair[0]) or not _SPANS.fullmatch(pair[1])):
            return f"{str(path)[:80]!r} is not a file with [a git blob id, line spans like \"1-5,9\"]"
        total += len(pair[1])
    if total > MAX_SPAN_CHARS:
        return f"more than {MAX_SPAN_CHARS} characters of line spans"
    return None


def lines_json(lines: Mapping[str, tuple[str, str]]) -> str:
    """A record's lines as the `executed.lines` column keeps them."""
    return json.dumps({f: list(v) for f, v in sorted(lines.items())}, sort_keys=True)


def lines_of(text: str | None) -> dict[str, tuple[str, str]]:
    """The column read back; {} for a row of schema 8 or one no writer of ours made."""
    try:
        raw = json.loads(text or "{}")
    except ValueError:
        return {}
    if lines_problem(raw) is not None:
        return {}
    return {str(f): (str(v[0]), str(v[1])) for f, v in raw.items()}


@dataclass(frozen=True, kw_only=True)
class ExecutedRecord:
    """What one passing entry of the run executed: repository file -> its functions, and
    (schema 9) -> (the file's git blob id, the lines it ran as spans)."""

    entry_id: str
    files: Mapping[str, tuple[str, ...]]
    lines: Mapping[str, tuple[str, str]] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One invocation of one suite, everything the store keeps about it."""

    uid: str
    suite: str
    commit: str = ""
    branch: str = ""
    event: str = "local"
    host: str = ""
    runner: str = ""
    backend: str = ""
    hardware: str = "cpu"
    started_at: float
    ended_at: float
    exit_code: int
    trusted: bool = True  # False: a pull request's code ran (see ci/history/schema.py)
    pr: int | None = None
    # The GitHub Actions run (its id, attempt) and job that ran it; "" and None: not in Actions.
    gh_run_id: str = ""
    gh_run_attempt: int | None = None
    gh_job: str = ""
    attempts: tuple[AttemptRecord, ...] = ()
    metrics: tuple[MetricPoint, ...] = ()
    executed: tuple[ExecutedRecord, ...] = ()  # schema 7: what each passing entry executed

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        data: dict[str, Any] = json.loads(text)
        data["attempts"] = tuple(AttemptRecord(**a) for a in data.get("attempts", ()))
        data["metrics"] = tuple(MetricPoint(**m) for m in data.get("metrics", ()))
        data["executed"] = tuple(ExecutedRecord(entry_id=x["entry_id"],
                                                files={f: tuple(fns) for f, fns in x["files"].items()},
                                                lines={f: (b, s) for f, (b, s) in x.get("lines", {}).items()})
                                 for x in data.get("executed", ()))
        return cls(**data)


def storable(text: str, limit: int | None = None) -> str:
    """Text as every store takes it: no NUL, no lone surrogate, at most `limit` characters."""
    clean = text.replace("\x00", "").encode("utf-8", "replace").decode("utf-8")
    return clean if limit is None else clean[:limit]


def _seconds(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else 0.0


def _exit_code(code: int | None) -> int | None:
    """The attempt's exit status as the store's 32-bit column holds it (None beyond that)."""
    return code if code is None or -(2**31) <= code < 2**31 else None


def _site(result: Result, root: Path | None) -> tuple[str, int | None]:
    """Where a failed pytest attempt's assertion is, from its own JUnit report; ("", None) else."""
    if result.outcome in ("passed", "deselected", "skipped") or result.entry.kind != "pytest":
        return "", None
    found = failure_site(result.junit_path, result.entry.path, root)
    return (storable(found[0], 1024), found[1]) if found is not None else ("", None)


def _attempt(result: Result, number: int, final: bool, root: Path | None = None) -> AttemptRecord:
    fail_path, fail_line = _site(result, root)
    return AttemptRecord(
        entry_id=storable(result.entry.id), path=storable(result.entry.path), attempt=number, final=final,
        outcome=result.outcome, passed=result.passed, failed=result.failed,
        skipped=result.skipped, num_gpus=result.entry.num_gpus,
        devices=storable(",".join(map(str, result.devices)), 256), node=storable(result.node, 256),
        seconds=_seconds(result.seconds), reason=storable(result.reason, 500),
        exit_code=_exit_code(result.returncode), fail_path=fail_path, fail_line=fail_line)


def attempt_records(results: Iterable[Result], root: Path | None = None) -> tuple[AttemptRecord, ...]:
    """Every attempt of every entry: the retries first, then the one the run reported.

    `root`: the checkout pytest ran in, stripped from an absolute path of a failure's site."""
    out: list[AttemptRecord] = []
    for r in results:
        out += [_attempt(e, i, False, root) for i, e in enumerate(r.earlier, 1)]
        out.append(_attempt(r, len(r.earlier) + 1, True, root))
    return tuple(out)


def _value(value: object) -> float | None:
    """A finite float of a JSON number, else None (booleans, text, 1e400, 400-digit integers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an integer beyond any float
        return None
    return number if math.isfinite(number) else None


def parse_metrics(entry_id: str, text: str) -> tuple[MetricPoint, ...]:
    """Numeric scalars of each `metrics.jsonl` row; the row's `step` (else its line number).

    Total: any text gives points the store can hold (a step within its integer column, a
    finite value, a name it takes), never an exception; whatever else a row holds is skipped.
    """
    points: dict[tuple[int, str], float] = {}
    for number, line in enumerate(text.splitlines()):
        try:
            row = json.loads(line)
        except (ValueError, RecursionError):
            continue  # a line cut short by a kill (or no JSON): the steps before it still count
        if not isinstance(row, dict):
            continue
        step = row.get("step", number)
        if not isinstance(step, int) or isinstance(step, bool) or not STEP_MIN <= step <= STEP_MAX:
            step = number
        for name, raw in row.items():
            value = _value(raw)
            if name == "step" or value is None:
                continue
            # A step written twice (a resumed run) keeps its last value: one point per step.
            points[(step, storable(str(name), MAX_NAME_CHARS))] = value
    return tuple(MetricPoint(entry_id=entry_id, step=step, name=name, value=value)
                 for (step, name), value in list(points.items())[:MAX_POINTS_PER_ENTRY])


def _read_regular(path: Path) -> str:
    """At most MAX_METRICS_BYTES of a regular file; a FIFO or device is an OSError, never a hang."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path} is not a regular file")
        data = fh.read(MAX_METRICS_BYTES)
    return data.decode("utf-8", errors="replace")


def read_metrics(entry_id: str, out_dir: Path) -> tuple[MetricPoint, ...]:
    """The metric series an entry left in its output directory.

    An entry that trains in phases (record, then replay) leaves one file per phase: the
    one written last is the run the entry ends on.
    """
    try:
        found = sorted(out_dir.rglob(METRICS_FILE), key=lambda p: p.stat().st_mtime, reverse=True)
    except OSError:
        return ()
    for path in found:
        try:
            return parse_metrics(entry_id, _read_regular(path))
        except OSError:
            continue
    return ()


def gh_run_id(raw: str) -> str:
    """An Actions run id as the history keeps it: digits only, else "" (never part of a link)."""
    return raw if raw.isascii() and raw.isdigit() and len(raw) <= 20 else ""


def gh_run_attempt(raw: str) -> int | None:
    return int(raw) if raw.isascii() and raw.isdigit() and 0 < int(raw) <= 10_000 else None


def build_run(*, uid: str, suite: str, results: Sequence[Result], started_at: float, ended_at: float,
              exit_code: int, context: Mapping[str, str],
              metrics: Mapping[str, tuple[MetricPoint, ...]], root: Path | None = None) -> RunRecord:
    """The record of one run from its results, its context (commit, branch…) and metric series."""
    return RunRecord(
        uid=uid, suite=suite, started_at=started_at, ended_at=ended_at, exit_code=exit_code,
        commit=storable(context.get("commit", ""), 64), branch=storable(context.get("branch", ""), 256),
        event=storable(context.get("event", "local"), 64), host=storable(context.get("host", ""), 256),
        runner=storable(context.get("runner", ""), 256), backend=storable(context.get("backend", ""), 256),
        hardware=storable(context.get("hardware", "cpu"), 64),
        gh_run_id=gh_run_id(context.get("gh_run_id", "")),
        gh_run_attempt=gh_run_attempt(context.get("gh_run_attempt", "")),
        gh_job=storable(context.get("gh_job", ""), 128),
        attempts=attempt_records(results, root),
        metrics=tuple(p for r in results for p in metrics.get(r.entry.id, ())),
        executed=tuple(ExecutedRecord(entry_id=storable(r.entry.id), files=dict(r.executed),
                                      lines=dict(r.executed_lines or {}))
                       for r in results if r.executed is not None),
    )
