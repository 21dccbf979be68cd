"""The entries a pull request's labelled GPU job runs: by what they executed (`by_execution`).

The edge of that pure rule: the suite's entries resolved, the records given (the history's
newest per entry, read by the plan: `ci.history.record.executed_records`) or read from the
checkout's records file, and a branch's hunks read from git (`plan --diff BASE`); with only
changed paths (`plan --paths`) every changed file counts as a whole.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ci.errors import CIError, UsageError
from ci.registry.loader import Registry
from ci.registry.model import SelectionPolicy, Suite
from ci.select import executed
from ci.select.blocks import git_line_map
from ci.select.by_execution import Change, Pick, changes, pick
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry, resolve
from ci.select.unified_diff import parse_diff


@dataclass(frozen=True, kw_only=True)
class JobEntries:
    """One job's entries for one event: each picked or not, and why."""

    picks: tuple[Pick, ...]

    @property
    def chosen(self) -> tuple[str, ...]:
        return tuple(p.entry for p in self.picks if p.runs)

    def summary(self) -> str:
        """"3 of 10 entries", as the plan's table shows it."""
        return f"{len(self.chosen)} of {len(self.picks)} entries"


def everything(entries: Iterable[str], reason: str) -> JobEntries:
    """Every entry, for one reason (a push, the nightly, dispatch, the all-entries label)."""
    return JobEntries(picks=tuple(Pick(entry=e, runs=True, reason=reason) for e in entries))


def suite_entries(root: Path, suite: Suite, registry: str) -> tuple[tuple[str, str], ...]:
    """The suite's entries as (id, file)."""
    return tuple((e.id, e.path) for e in resolve(suite, discover(root), registry=registry))


def for_diff(root: Path, entries: Sequence[tuple[str, str]], diff: Sequence[Change],
             policy: SelectionPolicy, *, records: Mapping[str, executed.Record] | None = None) -> JobEntries:
    """The entries the diff can reach, from `records` (the history's newest per entry, as
    the caller read them), else from the checkout's records file."""
    stored = records if records is not None else executed.load(root / executed.RECORDS_FILE)
    return JobEntries(picks=pick(entries, diff, stored, policy, line_map=git_line_map(root)))


def entries_by_job(root: Path, registry: Registry, jobs: Sequence[tuple[str, str]], event: str,
                   labels: Iterable[str], diff: Sequence[Change] | None, *,
                   records: Mapping[str, executed.Record] | None = None) -> dict[str, JobEntries]:
    """Job id -> its entries, for running self-hosted jobs given as (job id, suite name).

    A pull request's job is narrowed by its diff; the all-entries label, a push, the schedule
    and dispatch run every entry, and so does a pull request whose diff is not known."""
    policy = registry.selection
    label = policy.all_entries_label
    out: dict[str, JobEntries] = {}
    for job, name in jobs:
        suite = registry.get(name)
        if suite is None or suite.dynamic:
            continue
        try:
            entries = suite_entries(root, suite, registry.name)
        except CIError:  # nothing registered, a missing file: the run says so; the plan is of jobs
            continue
        ids = [e for e, _ in entries]
        if event != "pull_request":
            out[job] = everything(ids, f"every entry on {event}")
        elif any(x.casefold() == label.casefold() for x in labels):
            out[job] = everything(ids, f"label {label}")
        elif diff is None:
            out[job] = everything(ids, "the diff is unknown (pass --diff BASE or --paths)")
        else:
            out[job] = for_diff(root, entries, diff, policy, records=records)
    return out


def json_fields(chosen: JobEntries | None) -> dict[str, Any]:
    """What `plan --json` adds to a job: its entries and each one's reason."""
    if chosen is None:
        return {}
    return {"selected": chosen.summary(),
            "entries": [{"entry": p.entry, "runs": p.runs, "reason": p.reason} for p in chosen.picks]}


def narrow(root: Path, entries: Sequence[ResolvedEntry], base: str, policy: SelectionPolicy,
           note: Callable[[str], None], *,
           records: Mapping[str, executed.Record] | None = None) -> list[ResolvedEntry]:
    """`run --by-executed BASE`: the entries HEAD's diff against BASE reaches, each with its reason.

    `records`: what the run's store holds (a GPU job's trusted snapshot), over the checkout's
    records file; None reads the file alone."""
    from ci.select.changed import diff_vs_base

    merge_base, _, _ = diff_vs_base(root, base)
    chosen = for_diff(root, [(e.id, e.path) for e in entries], branch_changes(root, merge_base), policy,
                      records=records)
    why = {p.entry: p.reason for p in chosen.picks}
    note(f"selection by executed code: {chosen.summary()} (against {base})")
    for p in chosen.picks:
        if not p.runs:
            note(f"  left out {p.entry}: {p.reason}")
    return [replace(e, why=why[e.id]) for e in entries if e.id in chosen.chosen]


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                              timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"git {args[0]} failed in {root} ({exc.__class__.__name__}); "
                         "is git installed and the checkout readable?") from None


def branch_changes(root: Path, merge_base: str) -> tuple[Change, ...]:
    """What HEAD changed against `merge_base`, function by function (`git diff -U0`)."""
    return revision_changes(root, merge_base, "HEAD")


def commit_known(root: Path, sha: str) -> bool:
    """Whether the checkout holds the commit and its first parent (a shallow clone may not)."""
    return _git(root, "rev-parse", "--verify", "-q", f"{sha}^{{commit}}").returncode == 0 and \
        _git(root, "rev-parse", "--verify", "-q", f"{sha}^1^{{commit}}").returncode == 0


def commit_changes(root: Path, sha: str) -> tuple[Change, ...]:
    """What one commit changed against its first parent, function by function."""
    return revision_changes(root, f"{sha}^1", sha)


def revision_changes(root: Path, old: str, new: str) -> tuple[Change, ...]:
    """What `new` changed against `old`, function by function (`git diff -U0`)."""
    diff = _git(root, "diff", "-U0", "-M", "--no-color", "--no-ext-diff", old, new)
    if diff.returncode != 0:
        raise UsageError(f"git diff {old} {new} failed: {diff.stderr.strip()[:200]}")

    def reader(rev: str) -> Callable[[str], str | None]:
        def read(path: str) -> str | None:
            shown = _git(root, "show", f"{rev}:{path}")
            return shown.stdout if shown.returncode == 0 else None
        return read

    return changes(parse_diff(diff.stdout), reader(old), reader(new))
