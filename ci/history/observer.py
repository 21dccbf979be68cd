"""The history's observers of a run: the recorder, the metric gates, the quarantine.

`HistoryRecorder` reads the history once as the run begins (estimates and failure-first
order for selection) and records the run as it ends; `MetricGates` and `Quarantine`
judge the results against what it read. They observe the run through
`ci.history.run_observer`, registered in `ci.run.pipeline`.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from ci.errors import StoreError
from ci.history import metric_gates as gate_rules
from ci.history.record import Before, hardware_kind, new_uid, read_before, run_context, write_after
from ci.history.rows import build_run
from ci.history.run_observer import FirstOrder, Hints, Judgement, RunEnd, RunObserver, RunStart
from ci.history.store import open_store
from ci.registry.loader import REGISTRY, registry_name, registry_path
from ci.registry.model import Entry, Suite
from ci.results import Result

Warn = Callable[[str], None]
MAIN_BRANCHES = frozenset({"main", "master"})


@dataclass(frozen=True, kw_only=True)
class HistoryRun:
    """One run's view of the history: where it is, what it said before the run."""

    url: str | None
    uid: str
    suite: Suite
    hardware: str
    context: Mapping[str, str]
    before: Before
    started_at: float
    registry: str = REGISTRY  # the registry file that declares the suite, for messages

    @property
    def branch(self) -> str:
        return self.context.get("branch", "")

    @property
    def on_feature_branch(self) -> bool:
        return bool(self.branch) and self.branch not in MAIN_BRANCHES


def begin(url: str | None, *, suite: Suite, root: Path, env: Mapping[str, str], emulated: bool,
          warn: Warn) -> HistoryRun:
    hardware = hardware_kind(needs_gpus=suite.needs_gpus, emulated=emulated, env=env)
    context = run_context(root, env)
    before = read_before(url, suite=suite.name, hardware=hardware, branch=context.get("branch", ""),
                         quarantine_rate=suite.quarantine_rate,
                         min_runs=suite.quarantine_min_runs, warn=warn,
                         clean_runs=suite.quarantine_clean_runs)
    source = registry_path(root)
    return HistoryRun(url=url, uid=new_uid(), suite=suite, hardware=hardware, context=context,
                      before=before, started_at=time.time(),
                      registry=registry_name(source) if source is not None else REGISTRY)


def changed_tests(root: Path, base: str, warn: Warn) -> dict[str, int]:
    """Test files the branch's diff edits (distance 0) or reaches through imports (the
    chain's length: 1 for a direct importer) -> that distance; empty when git cannot say."""
    try:
        from ci.select.changed import affected_test_chains, diff_vs_base, edited_tests

        _base, _head, changes = diff_vs_base(root, base)
        distances = {path: 0 for path in edited_tests(changes)}
        for path, chain in affected_test_chains(root, changes).items():
            distances.setdefault(path, len(chain) - 1)
        return distances
    except Exception as exc:  # ordering is a hint: no diff must never stop a run
        warn(f"failure-first order without the diff ({str(exc).splitlines()[0] if str(exc) else exc})")
        return {}


def registry_entries(suite: Suite) -> dict[str, Entry]:
    return {e.id: e for e in suite.entries}


def apply_gates(run: HistoryRun, results: Sequence[Result], note: Warn) -> tuple[list[Result], bool]:
    """Judge gated e2e entries against the history; (results, whether a gate is misdeclared)."""
    declared = registry_entries(run.suite)
    gated = [r for r in results if declared.get(r.entry.id) and declared[r.entry.id].gates and r.ok]
    if not gated:
        return list(results), False
    if run.url is None or run.before.error:
        note("metric gates: inactive (" + ("history is off" if run.url is None
                                           else "the history store is unavailable") + ")")
        return list(results), False
    try:
        store = open_store(run.url)
    except StoreError as exc:
        note(f"metric gates: inactive ({exc})")
        return list(results), False
    misdeclared = False
    out: dict[str, Result] = {}
    with store:
        for r in gated:
            entry_gates = declared[r.entry.id].gates
            try:
                history = store.metric_series(r.entry.id, hardware=run.hardware,
                                              names=[g.metric for g in entry_gates], exclude_uid=run.uid)
            except StoreError as exc:
                note(f"metric gates of {r.entry.id}: inactive ({exc})")
                continue
            verdicts = [gate_rules.judge(r.entry.id, g, r.metrics, history, hardware=run.hardware,
                                         registry=run.registry)
                        for g in entry_gates]
            for v in verdicts:
                if v.status in ("inactive", "pass"):
                    note(v.line)
            bad = [v for v in verdicts if v.status in ("fail", "error")]
            misdeclared |= any(v.status == "error" for v in bad)
            if bad:
                out[r.entry.id] = replace(r, outcome="failed", failed=max(1, r.failed),
                                          reason=bad[0].line)
    return [out.get(r.entry.id, r) for r in results], misdeclared


def quarantine_reasons(run: HistoryRun) -> dict[str, str]:
    """Entries quarantined: by the registry (with its reason), or by their flake rate."""
    reasons = dict(run.before.quarantined)
    reasons.update({k: e.quarantine for k, e in registry_entries(run.suite).items() if e.quarantine})
    return reasons


def apply_quarantine(results: Sequence[Result], reasons: Mapping[str, str]) -> list[Result]:
    """Quarantined entries reported as such: whatever they did, they do not fail the job."""
    out = []
    for r in results:
        why = reasons.get(r.entry.id)
        if why is None or r.outcome == "interrupted":
            out.append(r)
            continue
        did = "passed" if r.ok else f"{r.outcome}: {r.reason}"
        out.append(replace(r, outcome="quarantined", reason=f"QUARANTINED ({why}); it {did}"))
    return out


def finish(run: HistoryRun, results: Sequence[Result], exit_code: int, *, root: Path, backend: str,
           durations: Mapping[str, float], warn: Warn, note: Warn) -> bool:
    """Record the run (real outcomes, before quarantine); never fails the run."""
    context = {**run.context, "hardware": run.hardware, "backend": backend}
    record = build_run(uid=run.uid, suite=run.suite.name, results=results, started_at=run.started_at,
                       ended_at=time.time(), exit_code=exit_code, context=context,
                       metrics={r.entry.id: r.metrics for r in results}, root=root)
    return write_after(run.url, record, root=root, durations=durations, warn=warn, note=note,
                       known_error=run.before.error)


def first_order(start: RunStart, run: HistoryRun) -> FirstOrder | None:
    """What runs first (`--order`): on a branch, what failed on it before, then what its
    diff changes or affects; None: longest first."""
    if start.order == "longest" or (start.order == "auto" and not run.on_feature_branch):
        return None
    changed = changed_tests(start.root, start.base,
                            warn=lambda m: print(f"note: {m}", file=sys.stderr))
    return FirstOrder(failed=run.before.failed_here, changed=changed)


class HistoryRecorder(RunObserver):
    """Reads the history before selection and records the run once it is reported (as the
    gates judged it, never as the quarantine shows it); the gates and the quarantine
    judge by what it read."""

    def __init__(self) -> None:
        self._begun: tuple[RunStart, HistoryRun] | None = None

    @property
    def run(self) -> HistoryRun:
        """This run's view of the history (read in `begin`)."""
        return self._started()[1]

    def _started(self) -> tuple[RunStart, HistoryRun]:
        if self._begun is None:
            raise RuntimeError("the history is read when the run begins; begin() was not called")
        return self._begun

    def begin(self, start: RunStart) -> Hints:
        run = begin(start.history_url, suite=start.suite, root=start.root, env=start.env,
                    emulated=start.emulated, warn=_warning(start))
        self._begun = (start, run)
        return Hints(estimates=run.before.estimates, first=first_order(start, run))

    def run_ended(self, end: RunEnd) -> None:
        start, run = self._started()
        finish(run, end.judgement.results, end.exit_code, root=start.root, backend=end.backend,
               durations=start.measured, warn=_warning(start), note=start.log.line)


class MetricGates(RunObserver):
    """Gated e2e entries that passed fail when a metric strays from its history."""

    def __init__(self, history: HistoryRecorder) -> None:
        self._history = history
        self._note: Warn = print

    def begin(self, start: RunStart) -> Hints:
        self._note = start.log.line
        return Hints()

    def judge(self, judgement: Judgement) -> Judgement:
        results, misdeclared = apply_gates(self._history.run, judgement.results, note=self._note)
        return judgement.amended(results, misdeclared=misdeclared)


class Quarantine(RunObserver):
    """Quarantined entries are shown as such and fail nothing, unless --include-quarantined."""

    def __init__(self, history: HistoryRecorder) -> None:
        self._history = history
        self._gates_again = False

    def begin(self, start: RunStart) -> Hints:
        self._gates_again = start.include_quarantined
        return Hints()

    def judge(self, judgement: Judgement) -> Judgement:
        if self._gates_again:
            return judgement
        return judgement.shown_as(apply_quarantine(judgement.shown,
                                                   quarantine_reasons(self._history.run)))


def _warning(start: RunStart) -> Warn:
    return lambda m: start.log.line(f"warning: {m}")
