"""What the history says: duration estimates, flake rates, failure streaks. Pure functions of rows."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ci.history.store import AttemptRow

OK = frozenset({"passed", "flaky", "deselected"})
# Outcomes whose seconds say nothing about the entry's next run.
UNMEASURED = frozenset({"interrupted", "deselected", "timeout", "lost"})
ESTIMATE_RUNS = 15  # as miles: the p90 of the last 15 passing runs
ESTIMATE_PERCENTILE = 0.9


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile, linear between closest ranks (numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def finals(rows: Iterable[AttemptRow]) -> list[AttemptRow]:
    return [r for r in rows if r.final]


def estimates(rows: Iterable[AttemptRow], *, runs: int = ESTIMATE_RUNS,
              q: float = ESTIMATE_PERCENTILE) -> dict[str, float]:
    """Seconds per entry: the q-quantile of its last `runs` passing attempts (rows oldest first).

    A high percentile, so one slow outlier does not dominate and one fast run does not
    make the planner starve a shard. An entry with no passing run in the history (it
    failed every time, e.g. a service that did not start) takes the same quantile of its
    failed runs: what it took when it failed is a better guess than the planner's guess
    for an entry it knows nothing of. Interrupted, timed-out or lost runs never count.
    """
    passing: dict[str, list[float]] = defaultdict(list)
    failing: dict[str, list[float]] = defaultdict(list)
    for r in finals(rows):
        if r.outcome in ("passed", "flaky"):
            passing[r.entry_id].append(r.seconds)
        elif r.outcome not in UNMEASURED:
            failing[r.entry_id].append(r.seconds)
    seen = {**failing, **passing}
    return {k: round(percentile(v[-runs:], q), 2) for k, v in seen.items()}


def failed_on_branch(rows: Iterable[AttemptRow], branch: str) -> set[str]:
    """Entries whose latest final attempt on `branch` did not pass."""
    last: dict[str, str] = {}
    for r in finals(rows):
        if r.branch == branch and r.outcome not in UNMEASURED - {"timeout"}:
            last[r.entry_id] = r.outcome
    return {k for k, v in last.items() if v not in OK}


@dataclass(frozen=True, kw_only=True)
class Flakiness:
    """How flaky one entry was over a window of runs."""

    entry_id: str
    runs: int  # runs of the entry in the window
    retried: int  # runs where it failed, then passed on a retry
    split: int  # failing runs on a commit where another run of it passed
    first_at: float
    last_at: float

    @property
    def flakes(self) -> int:
        return self.retried + self.split

    @property
    def rate(self) -> float:
        return self.flakes / self.runs if self.runs else 0.0


def flakiness(rows: Iterable[AttemptRow], *, window: int = 50) -> dict[str, Flakiness]:
    """Per entry over its last `window` runs: passing on retry, or failing and passing on one commit."""
    by_entry: dict[str, list[AttemptRow]] = defaultdict(list)
    for r in finals(rows):
        if r.outcome not in ("interrupted", "deselected"):
            by_entry[r.entry_id].append(r)
    out: dict[str, Flakiness] = {}
    for entry, every in by_entry.items():
        rs = every[-window:]
        passed_on = {(r.commit, r.hardware) for r in rs if r.outcome in OK and r.commit}
        out[entry] = Flakiness(
            entry_id=entry, runs=len(rs),
            retried=sum(r.outcome == "flaky" for r in rs),
            split=sum(r.outcome not in OK and (r.commit, r.hardware) in passed_on for r in rs),
            first_at=rs[0].started_at, last_at=rs[-1].started_at)
    return out


def auto_quarantine(flakes: Mapping[str, Flakiness], *, rate: float, min_runs: int) -> dict[str, str]:
    """Entries above the registry's flake rate (with enough runs to say so), with the reason."""
    return {k: f"flake rate {f.rate:.0%} ({f.flakes} of {f.runs} runs) is above {rate:.0%}"
            for k, f in flakes.items() if f.runs >= min_runs and f.rate > rate}


def after_lifts(rows: Iterable[AttemptRow], lifts: Mapping[tuple[str, str], float]) -> list[AttemptRow]:
    """The rows that still count toward a flake rate: an entry's runs before the hand-lift of
    its quarantine (its issue closed by a person) are forgotten."""
    return [r for r in rows if r.started_at >= lifts.get((r.suite, r.entry_id), float("-inf"))]


def clean_tail(rows: Iterable[AttemptRow]) -> dict[str, int]:
    """Per entry, how many of its last final attempts in a row passed plainly (first try)."""
    tail: dict[str, int] = defaultdict(int)
    for r in finals(rows):
        if r.outcome in ("interrupted", "deselected"):
            continue
        tail[r.entry_id] = tail[r.entry_id] + 1 if r.outcome == "passed" else 0
    return dict(tail)


def recovered(flakes: Mapping[str, str], rows: Iterable[AttemptRow], *, clean_runs: int) -> dict[str, str]:
    """The auto-quarantined entries still held: one whose last `clean_runs` runs all passed
    plainly is let go, though old flakes still weigh in its rate (its issue closes then too)."""
    tail = clean_tail(rows)
    return {k: v for k, v in flakes.items() if tail.get(k, 0) < clean_runs}


@dataclass(frozen=True, kw_only=True)
class Streak:
    """An entry failing run after run on a branch: the range to bisect and why it failed."""

    suite: str
    entry_id: str
    failures: int
    first_failing_commit: str
    last_passing_commit: str  # "" when no recorded run of it ever passed
    last_failing_commit: str
    reasons: tuple[str, ...]
    since: float


def streaks(rows: Iterable[AttemptRow], *, branch: str = "main", k: int = 3) -> list[Streak]:
    """Entries whose last `k` or more final attempts on `branch` all failed."""
    by_entry: dict[tuple[str, str], list[AttemptRow]] = defaultdict(list)
    for r in finals(rows):
        if r.branch == branch and r.outcome not in ("interrupted", "deselected"):
            by_entry[(r.suite, r.entry_id)].append(r)
    out: list[Streak] = []
    for (suite, entry), rs in by_entry.items():
        tail: list[AttemptRow] = []
        for r in reversed(rs):
            if r.outcome in OK:
                break
            tail.append(r)
        if len(tail) < k:
            continue
        tail.reverse()
        before = rs[:len(rs) - len(tail)]
        out.append(Streak(
            suite=suite, entry_id=entry, failures=len(tail),
            first_failing_commit=tail[0].commit, last_failing_commit=tail[-1].commit,
            last_passing_commit=before[-1].commit if before else "",
            reasons=tuple(dict.fromkeys(r.reason or r.outcome for r in tail)),
            since=tail[0].started_at))
    return sorted(out, key=lambda s: (-s.failures, s.suite, s.entry_id))
