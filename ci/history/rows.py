"""What the history keeps: a run, its entry attempts, e2e metric points. Pure builders."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ci.results import MetricPoint, Result

METRICS_FILE = "metrics.jsonl"
# Entries write a few dozen metrics per step; a runaway writer must not fill the store.
MAX_POINTS_PER_ENTRY = 20_000


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
    attempts: tuple[AttemptRecord, ...] = ()
    metrics: tuple[MetricPoint, ...] = ()

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunRecord:
        data: dict[str, Any] = json.loads(text)
        data["attempts"] = tuple(AttemptRecord(**a) for a in data.get("attempts", ()))
        data["metrics"] = tuple(MetricPoint(**m) for m in data.get("metrics", ()))
        return cls(**data)


def _attempt(result: Result, number: int, final: bool) -> AttemptRecord:
    return AttemptRecord(
        entry_id=result.entry.id, path=result.entry.path, attempt=number, final=final,
        outcome=result.outcome, passed=result.passed, failed=result.failed,
        skipped=result.skipped, num_gpus=result.entry.num_gpus,
        devices=",".join(map(str, result.devices)), node=result.node,
        seconds=round(result.seconds, 3), reason=result.reason[:500], exit_code=result.returncode)


def attempt_records(results: Iterable[Result]) -> tuple[AttemptRecord, ...]:
    """Every attempt of every entry: the retries first, then the one the run reported."""
    out: list[AttemptRecord] = []
    for r in results:
        out += [_attempt(e, i, False) for i, e in enumerate(r.earlier, 1)]
        out.append(_attempt(r, len(r.earlier) + 1, True))
    return tuple(out)


def parse_metrics(entry_id: str, text: str) -> tuple[MetricPoint, ...]:
    """Numeric scalars of each `metrics.jsonl` row; the row's `step` (else its line number)."""
    points: dict[tuple[int, str], float] = {}
    for number, line in enumerate(text.splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue  # a line cut short by a kill: the steps before it still count
        if not isinstance(row, dict):
            continue
        step = row.get("step", number)
        if not isinstance(step, int) or isinstance(step, bool):
            step = number
        for name, value in row.items():
            if name == "step" or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                # A step written twice (a resumed run) keeps its last value: one point per step.
                points[(step, str(name)[:256])] = float(value)
    return tuple(MetricPoint(entry_id=entry_id, step=step, name=name, value=value)
                 for (step, name), value in list(points.items())[:MAX_POINTS_PER_ENTRY])


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
            return parse_metrics(entry_id, path.read_text(encoding="utf-8", errors="replace"))
        except OSError:
            continue
    return ()


def build_run(*, uid: str, suite: str, results: Sequence[Result], started_at: float, ended_at: float,
              exit_code: int, context: Mapping[str, str],
              metrics: Mapping[str, tuple[MetricPoint, ...]]) -> RunRecord:
    """The record of one run from its results, its context (commit, branch…) and metric series."""
    return RunRecord(
        uid=uid, suite=suite, started_at=started_at, ended_at=ended_at, exit_code=exit_code,
        commit=context.get("commit", ""), branch=context.get("branch", ""),
        event=context.get("event", "local"), host=context.get("host", ""),
        runner=context.get("runner", ""), backend=context.get("backend", ""),
        hardware=context.get("hardware", "cpu"),
        attempts=attempt_records(results),
        metrics=tuple(p for r in results for p in metrics.get(r.entry.id, ())),
    )
