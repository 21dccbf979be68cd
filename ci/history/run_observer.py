"""The one interface through which a run of `python -m ci run` is observed.

An observer is told four things, in this order: the run begins (before selection, so
what it knows — the history's estimates and failure-first order — can feed it), each
attempt of an entry ends (called by the runner as it happens), the results are judged
(an observer may amend what a result counts as: metric gates, quarantine), and the run
ends (with the exit code: record it, draw it). `ci.run.pipeline` calls the hooks in
registration order; `ci.run.pipeline.registered` is the one list of observers.

It lives here, below the run command, so that the history's observers can name these
types without importing `ci.run`, which sits above the history.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol

from ci.log import Log
from ci.registry.model import Suite
from ci.results import Result


@dataclass(frozen=True, kw_only=True)
class RunStart:
    """What every observer is told before selection."""

    suite: Suite
    root: Path
    env: Mapping[str, str]
    history_url: str | None  # None: recording is off
    emulated: bool  # --emulate-gpus
    order: str  # --order: "auto", "failure-first" or "longest"
    base: str  # --base: the ref a branch's diff is taken against
    include_quarantined: bool  # quarantined entries gate again
    measured: Mapping[str, float]  # what the durations store held before this run
    log: Log
    record_executed: bool = False  # --record-executed: what each entry ran is recorded


@dataclass(frozen=True, kw_only=True)
class FirstOrder:
    """What selection runs first: entries that failed here before, then tests the diff reaches."""

    failed: frozenset[str]  # entry ids
    changed: Mapping[str, int]  # test file -> import distance from the diff (0: edited)


@dataclass(frozen=True, kw_only=True)
class Hints:
    """What an observer tells selection; the empty default changes nothing."""

    estimates: Mapping[str, float] = field(default_factory=dict)  # expected seconds per entry id
    first: FirstOrder | None = None  # None: longest first
    env: Mapping[str, str] = field(default_factory=dict)  # added to every entry's environment

    def merged(self, later: Hints) -> Hints:
        """Both observers' hints; where both name the same thing, `later`'s."""
        return Hints(estimates={**self.estimates, **later.estimates},
                     first=later.first if later.first is not None else self.first,
                     env={**self.env, **later.env})


@dataclass(frozen=True, kw_only=True)
class AttemptEnded:
    """One attempt of one entry is over (an entry run again ends several)."""

    result: Result  # this attempt's own result, before the retry policy calls a pass flaky
    attempt: int  # 1 for the first attempt of a pass
    retried: bool  # the entry runs again: a retry, or a lost node's second chance


@dataclass(frozen=True, kw_only=True)
class Judgement:
    """What the run's results count as; each observer's judge hook returns it amended."""

    results: tuple[Result, ...]  # what each entry came to: recorded in the history, drawn
    shown: tuple[Result, ...]  # what the report shows and the exit code counts
    misdeclared: bool = False  # a metric gate names a metric its entry never writes

    @classmethod
    def of(cls, results: Iterable[Result]) -> Judgement:
        """The runner's results, as yet unamended."""
        ran = tuple(results)
        return cls(results=ran, shown=ran)

    def amended(self, results: Iterable[Result], *, misdeclared: bool = False) -> Judgement:
        """What the entries came to has changed (a gate failed one): shown as such too, so
        an observer that changes only what is shown (`shown_as`) must come after this one."""
        new = tuple(results)
        return replace(self, results=new, shown=new, misdeclared=self.misdeclared or misdeclared)

    def shown_as(self, shown: Iterable[Result]) -> Judgement:
        """Only how the results count has changed (quarantine): the history keeps what they did."""
        return replace(self, shown=tuple(shown))


@dataclass(frozen=True, kw_only=True)
class RunEnd:
    """The run is over and reported."""

    judgement: Judgement
    exit_code: int  # from the shown results and misdeclared gates
    backend: str  # where entries ran, as the backend describes itself
    gpu_run: bool  # some entry took GPUs
    gpu_rows: tuple[str, ...]  # the run's GPUs as `node:gpu`, for the timeline
    work_dir: Path  # the run's logs, outputs and pages


class RunObserver(Protocol):
    """Watches a run. Subclass it to keep the no-op hooks you do not need."""

    def begin(self, start: RunStart) -> Hints:
        """The run begins; what is returned feeds selection."""
        return Hints()

    def attempt_ended(self, ended: AttemptEnded) -> None:
        """Called by the runner's worker threads, one call at a time (`Observers`)."""
        return None

    def judge(self, judgement: Judgement) -> Judgement:
        """Amend what the results count as, or return `judgement` as it came."""
        return judgement

    def run_ended(self, end: RunEnd) -> None:
        """The run is reported and its exit code decided."""
        return None


class Observers(RunObserver):
    """Several observers as one, each hook called on each in registration order."""

    def __init__(self, observers: Sequence[RunObserver]) -> None:
        self.observers = tuple(observers)
        self._lock = threading.Lock()  # attempts end on the runner's worker threads

    def begin(self, start: RunStart) -> Hints:
        hints = Hints()
        for o in self.observers:
            hints = hints.merged(o.begin(start))
        return hints

    def attempt_ended(self, ended: AttemptEnded) -> None:
        with self._lock:
            for o in self.observers:
                o.attempt_ended(ended)

    def judge(self, judgement: Judgement) -> Judgement:
        for o in self.observers:
            judgement = o.judge(judgement)
        return judgement

    def run_ended(self, end: RunEnd) -> None:
        for o in self.observers:
            o.run_ended(end)
