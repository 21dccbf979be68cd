"""An entry's page: its durations and flake rate over time, its last failures, its quarantine
and issue, the metrics its gates watch. Pure functions of the entry's rows."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import quote

from ci.github.flaky_issues import FLAKY_TITLE
from ci.history.stats import Flakiness, flakiness, percentile
from ci.history.store import AttemptRow, MetricRow
from ci.history.verdicts import FLAKE_WINDOW, OK, infra_cause

POINTS = 30  # at most this many points per trend: a page of 500 runs stays light
LAST_FAILURES = 10


@dataclass(frozen=True, kw_only=True)
class Point:
    at: float
    value: float


@dataclass(frozen=True, kw_only=True)
class Failure:
    run_uid: str
    commit: str
    at: float
    attempt: int
    outcome: str
    reason: str
    infra: str  # the infrastructure sign that explains it ("": the code's)


@dataclass(frozen=True, kw_only=True)
class EntryView:
    suite: str
    entry_id: str
    runs: int
    p50: tuple[Point, ...]
    p90: tuple[Point, ...]
    flake_rate: tuple[Point, ...]
    flakes: Flakiness | None  # over the last FLAKE_WINDOW runs, as the quarantine counts
    failures: tuple[Failure, ...]  # newest first
    held: str  # why it is quarantined now; "" when it is not
    issue_url: str  # where its issue is found; "" when no repository is known
    metrics: Mapping[str, tuple[Point, ...]]  # gated metric -> its last step's value per run


def _buckets(n: int) -> list[tuple[int, int]]:
    """[start, end) index ranges cutting n runs into at most POINTS consecutive groups."""
    size = max(1, math.ceil(n / POINTS))
    return [(i, min(n, i + size)) for i in range(0, n, size)]


def issue_search(repo: str, entry_id: str) -> str:
    """The issue of a held entry: the `slime-ci` label and the title `python -m ci issues` gives
    it (ci/github/flaky_issues.py; the store keeps no issue numbers)."""
    if not repo:
        return ""
    q = f'is:issue label:slime-ci in:title "{FLAKY_TITLE}{entry_id}"'
    return f"https://github.com/{quote(repo, safe='/')}/issues?q={quote(q, safe='')}"


def _metric_points(series: Sequence[MetricRow]) -> tuple[Point, ...]:
    last: dict[str, MetricRow] = {}
    for m in series:  # ordered by run, then step: the last step's value wins
        last[m.run_uid] = m
    return tuple(Point(at=m.started_at, value=m.value) for m in last.values())


def build(suite: str, entry_id: str, rows: Sequence[AttemptRow], *, held: str, repo: str,
          metrics: Mapping[str, Sequence[MetricRow]]) -> EntryView:
    """The view of one entry from its trusted rows (oldest first)."""
    finals = [r for r in rows if r.final and r.outcome not in ("interrupted", "deselected")]
    p50: list[Point] = []
    p90: list[Point] = []
    rate: list[Point] = []
    for lo, hi in _buckets(len(finals)):
        group = finals[lo:hi]
        seconds = [r.seconds for r in group if r.outcome in ("passed", "flaky")]
        at = group[-1].started_at
        if seconds:
            p50.append(Point(at=at, value=percentile(seconds, 0.5)))
            p90.append(Point(at=at, value=percentile(seconds, 0.9)))
        upto = flakiness(finals[max(0, hi - FLAKE_WINDOW):hi], window=FLAKE_WINDOW).get(entry_id)
        if upto is not None:
            rate.append(Point(at=at, value=upto.rate))
    failed = [r for r in rows if r.outcome not in OK and r.outcome != "deselected"]
    failures = tuple(Failure(run_uid=r.run_uid, commit=r.commit, at=r.started_at, attempt=r.attempt,
                             outcome=r.outcome, reason=r.reason, infra=infra_cause(r) or "")
                     for r in reversed(failed[-LAST_FAILURES:]))
    return EntryView(suite=suite, entry_id=entry_id, runs=len(finals), p50=tuple(p50), p90=tuple(p90),
                     flake_rate=tuple(rate), flakes=flakiness(rows, window=FLAKE_WINDOW).get(entry_id),
                     failures=failures, held=held,
                     issue_url=issue_search(repo, entry_id) if held else "",
                     metrics={name: _metric_points(s) for name, s in metrics.items()})
