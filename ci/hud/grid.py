"""The main page's grid: the last N commits of a branch × every entry, one cell each. Pure.

A cell is the entry's outcome on that commit over every trusted run of it there: passed,
failed, flaky (it failed, then passed on a retry or in another run of the same commit),
infrastructure (every failure was the infrastructure's: a lost node, a kill), quarantined
(a held entry that did not pass) or not run. Its verdict and evidence are the verdict
table's (`ci.history.verdicts.judge`), judged against the runs of the entry before it, so
the page and the PR comment never disagree on the same evidence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ci.history.bisects import BisectRow
from ci.history.stats import after_lifts, auto_quarantine, flakiness, recovered
from ci.history.store import AttemptRow
from ci.history.verdicts import OK, SuiteRules, infra_cause, judge, short

CellKind = Literal["pass", "fail", "flaky", "infra", "quarantined", "not-run"]
CELL_KINDS: tuple[CellKind, ...] = ("pass", "fail", "flaky", "infra", "quarantined", "not-run")
# What judge() reads of an entry's past: its flake window three times over (flake_reasons).
_PAST_ROWS = 160
# The runs a run's quarantine decision reads (ci/history/record.py read_before: last_runs=300).
QUARANTINE_RUNS = 300


@dataclass(frozen=True, kw_only=True)
class Column:
    suite: str
    entry_id: str


@dataclass(frozen=True, kw_only=True)
class Commit:
    sha: str
    at: float  # when the branch first ran it


@dataclass(frozen=True, kw_only=True)
class Cell:
    """One entry on one commit."""

    kind: CellKind
    verdict: str  # "passed", or the verdict's label and rule ("new (rule new)")
    evidence: str
    run_uid: str = ""  # the run the cell links to; "" when not run
    seconds: float = 0.0
    first_red: bool = False  # the first failing commit of a streak
    streak: int = 0  # on the first red cell: how many commits in a row failed
    bisect: str = ""  # on the first red cell: the bisect's answer, where one exists


NOT_RUN = Cell(kind="not-run", verdict="not run", evidence="no trusted run of it on this commit")


@dataclass(frozen=True, kw_only=True)
class Grid:
    commits: tuple[Commit, ...]  # newest first
    columns: tuple[Column, ...]  # grouped by suite
    cells: Mapping[tuple[str, Column], Cell]  # (commit sha, column); absent: not run

    def cell(self, sha: str, column: Column) -> Cell:
        return self.cells.get((sha, column), NOT_RUN)


def commits_of(rows: Iterable[AttemptRow], last: int) -> tuple[Commit, ...]:
    """The last `last` commits the rows ran, newest first (by when each was first run)."""
    first: dict[str, float] = {}
    for r in rows:
        if r.commit and r.commit not in first:
            first[r.commit] = r.started_at
    ordered = sorted(first.items(), key=lambda kv: kv[1], reverse=True)[:last]
    return tuple(Commit(sha=sha, at=at) for sha, at in ordered)


def columns_of(rows: Iterable[AttemptRow], suite_order: Sequence[str] = ()) -> tuple[Column, ...]:
    """Every (suite, entry) the rows ran, suites in registry order (unknown ones after), entries sorted."""
    seen = {(r.suite, r.entry_id) for r in rows}
    rank = {name: i for i, name in enumerate(suite_order)}
    return tuple(Column(suite=s, entry_id=e)
                 for s, e in sorted(seen, key=lambda k: (rank.get(k[0], len(rank)), k[0], k[1])))


def held(rows: Sequence[AttemptRow], *, registry: Mapping[tuple[str, str], str],
         rates: Mapping[str, tuple[float | None, int, int]],
         lifts: Mapping[tuple[str, str], float],
         default: tuple[float | None, int, int] = (None, 0, 0)) -> dict[tuple[str, str], str]:
    """(suite, entry) -> why it is held now: the registry's reason, or its flake rate, decided as a
    run decides it (ci/history/record.py: trusted rows per suite and hardware, after the lifts).
    `rates`: suite -> (quarantine rate, min runs, clean runs); `default` for a suite not in it."""
    out = dict(registry)
    groups: dict[tuple[str, str], list[AttemptRow]] = defaultdict(list)
    for r in rows:
        groups[(r.suite, r.hardware)].append(r)
    for (suite, _hw), group in groups.items():
        rate, min_runs, clean = rates.get(suite, default)
        if rate is None:
            continue
        newest = list(dict.fromkeys(r.run_uid for r in reversed(group)))[:QUARANTINE_RUNS]
        kept = set(newest)
        trusted = after_lifts([r for r in group if r.run_uid in kept], lifts)
        auto = recovered(auto_quarantine(flakiness(trusted), rate=rate, min_runs=min_runs),
                         trusted, clean_runs=clean)
        for entry, why in auto.items():
            out.setdefault((suite, entry), why)
    return out


def _kind(finals: Sequence[AttemptRow], runs: Mapping[str, list[AttemptRow]]) -> CellKind:
    if any(r.outcome == "flaky" for r in finals):
        return "flaky"
    ok = [r for r in finals if r.outcome in OK]
    if len(ok) == len(finals):
        return "pass"
    if ok:  # failed in one run of this commit and passed in another
        return "flaky"
    failed = [a for rs in runs.values() for a in rs if a.outcome not in OK]
    return "infra" if all(infra_cause(a) is not None for a in failed) else "fail"


def _cell(sha: str, column: Column, runs: Mapping[str, list[AttemptRow]], past: Sequence[AttemptRow],
          rules: Mapping[str, SuiteRules], branch: str) -> Cell:
    finals = [rs[-1] for rs in runs.values() if rs[-1].final]
    if not finals:
        return NOT_RUN
    kind = _kind(finals, runs)
    last = finals[-1]
    if kind == "pass":
        return Cell(kind="pass", verdict=last.outcome, run_uid=last.run_uid, seconds=last.seconds,
                    evidence=f"{last.outcome} in {last.seconds:.1f} s"
                             + (f" ({len(finals)} runs)" if len(finals) > 1 else ""))
    # The run the cell is judged by: the newest that did not plainly pass.
    judged_uid = next(r.run_uid for r in reversed(finals) if r.outcome != "passed")
    verdicts = judge(runs[judged_uid], past, base=None, suites=rules, branch=branch)
    if verdicts:
        v = verdicts[0]
        verdict, evidence = f"{v.label} (rule {v.rule})", v.evidence
    else:
        verdict, evidence = "passed", "passed"
    if kind == "flaky" and not any(r.outcome == "flaky" for r in finals):
        passed = next(r for r in finals if r.outcome in OK)
        verdict = "flaky (failed and passed on one commit)"
        evidence = (f"failed in run {judged_uid[:8]} ({runs[judged_uid][-1].reason or 'no reason'}), "
                    f"passed in run {passed.run_uid[:8]} of {short(sha)}")
    return Cell(kind=kind, verdict=verdict, evidence=evidence, run_uid=judged_uid,
                seconds=runs[judged_uid][-1].seconds)


def _streaks(grid: dict[tuple[str, Column], Cell], commits: Sequence[Commit], column: Column,
             bisects: Sequence[BisectRow]) -> None:
    """Mark the first red commit of each streak of failing commits (oldest to newest; commits
    that did not run it, or where only the infrastructure failed, neither break nor extend it)."""
    streak: list[str] = []

    def close() -> None:
        if not streak:
            return
        first = grid[(streak[0], column)]
        answer = next((b for b in reversed(bisects) if b.entry_id == column.entry_id
                       and b.bad in streak), None)
        grid[(streak[0], column)] = replace(first, first_red=True, streak=len(streak),
                                            bisect=answer.summary if answer else "")
        streak.clear()

    for c in reversed(commits):
        cell = grid.get((c.sha, column))
        if cell is None or cell.kind in ("not-run", "infra"):
            continue
        if cell.kind == "fail" or (cell.kind == "quarantined" and cell.verdict.startswith("held, failed")):
            streak.append(c.sha)
        else:
            close()
    close()


def build(rows: Sequence[AttemptRow], *, last: int, rules: Mapping[str, SuiteRules],
          held_now: Mapping[tuple[str, str], str], bisects: Sequence[BisectRow] = (),
          suite_order: Sequence[str] = (), branch: str = "main") -> Grid:
    """The grid of the last `last` commits of trusted rows on `branch` (oldest first)."""
    commits = commits_of(rows, last)
    shown = {c.sha for c in commits}
    columns = columns_of([r for r in rows if r.commit in shown], suite_order)
    by_column: dict[tuple[str, str], list[AttemptRow]] = defaultdict(list)
    for r in rows:
        by_column[(r.suite, r.entry_id)].append(r)
    cells: dict[tuple[str, Column], Cell] = {}
    for column in columns:
        every = by_column[(column.suite, column.entry_id)]
        per_commit: dict[str, dict[str, list[AttemptRow]]] = defaultdict(dict)
        first_row: dict[str, int] = {}
        for i, r in enumerate(every):
            if r.commit in shown:
                per_commit[r.commit].setdefault(r.run_uid, []).append(r)
                first_row.setdefault(r.commit, i)
        why = held_now.get((column.suite, column.entry_id))
        for sha, runs in per_commit.items():
            start = first_row[sha]
            cell = _cell(sha, column, runs, every[max(0, start - _PAST_ROWS):start], rules, branch)
            if why is not None and cell.kind in ("fail", "flaky"):
                did = "failed" if cell.kind == "fail" else "flaky"
                cell = replace(cell, kind="quarantined", verdict=f"held, {did} ({cell.verdict})",
                               evidence=f"quarantined: {why}; {cell.evidence}")
            cells[(sha, column)] = cell
        _streaks(cells, commits, column, bisects)
    return Grid(commits=commits, columns=columns, cells=cells)
