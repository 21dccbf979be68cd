"""Why an entry did not pass: one verdict per entry of a run, from the run and the history. Pure.

A verdict is the first rule of `RULES` that matches, in table order; each rule names its
verdict and returns the evidence a reader checks it by. The table is the documentation
(docs/verdicts.md repeats it): a maintainer who disagrees with a verdict finds the rule
that gave it by its id, which the PR comment and `python -m ci why` print beside it.

The baseline is trusted runs only (`HistoryStore.attempts(trusted_only=True)`): a pull
request's own runs never make `main` look green or red. Attempts whose failure was the
infrastructure's (a lost node, a kill, a pull that failed) never count as `main` failing
or passing either: they judged no code. That is read from the attempt's own status (outcome,
exit status, backend), never from words in its output.
"""

from __future__ import annotations

import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from ci.history.stats import Flakiness, flakiness
from ci.history.store import AttemptRow

Kind = Literal["new", "already-failing", "flaky", "infrastructure", "unknown"]
KINDS: tuple[Kind, ...] = ("new", "already-failing", "flaky", "infrastructure", "unknown")
LABELS: dict[Kind, str] = {"new": "new", "already-failing": "already failing on main", "flaky": "flaky",
                           "infrastructure": "infrastructure", "unknown": "unknown"}
# What fails the `verdict` check unless a suite says otherwise (Suite.verdict_blocks).
BLOCKING: tuple[Kind, ...] = ("new", "unknown")
PASSING = frozenset({"passed", "deselected"})  # a final outcome that needs no verdict
OK = frozenset({"passed", "flaky", "deselected"})
FLAKE_WINDOW = 50  # runs of the entry the flake rate is measured over (as `history flaky`)
_DIGITS = re.compile(r"\d+")
SAME_FLAKES = 2  # recorded flakes with the very failure that make one below the threshold a flake

# An infrastructure verdict reads only what the attempt's own status says: its outcome (set by
# the runner and the backends, never by the test), its exit status and the backend it ran on.
# Words in its output never count: a test prints "failed to pull" or "oom-kill" as easily as
# Docker or the kernel does, and an honest new failure was once passed as the infrastructure's.
#
# A signal that ended the process from outside: SIGKILL, SIGTERM (negative: Popen's way, a real
# signal). SIGSEGV, SIGABRT and the like are the code's own crash and stay the code's.
_SIGNALLED = {-9: "SIGKILL", -15: "SIGTERM"}
# In Docker, `docker run` passes its container's signal on as 128+N; elsewhere 137 is an exit
# status any process may choose.
_DOCKER_SIGNALLED = {137: "SIGKILL", 143: "SIGTERM"}
_DOCKER_RUN_FAILED = 125  # `docker run` itself failed: the container never started
# Docker's own words when the image could not be pulled; read only from an attempt that exited
# 125 under the Docker backend, whose output is then Docker's.
_PULL = re.compile(r"(?i)Unable to find image .* locally|pull access denied|manifest unknown|"
                   r"toomanyrequests|error pulling image|failed to pull|"
                   r"Error response from daemon:.*\bpull\b")
# The GPU allocator's WaitTimeout (ci/gpu/allocator.py), which the runner records as a `timeout`
# before the entry starts: the attempt never got its GPUs.
_GPU_WAIT = re.compile(r"^timed out after \S+ waiting for ")


@dataclass(frozen=True, kw_only=True)
class Trial:
    """One entry in the run being judged: its attempts there, oldest first."""

    suite: str
    entry_id: str
    attempts: tuple[AttemptRow, ...]

    @property
    def final(self) -> AttemptRow:
        return self.attempts[-1]

    @property
    def failures(self) -> tuple[AttemptRow, ...]:
        """The attempts that failed: the final one when it failed, else those before it."""
        if self.final.outcome not in OK:
            return (self.final,)
        return tuple(a for a in self.attempts[:-1] if a.outcome not in OK)


@dataclass(frozen=True, kw_only=True)
class Base:
    """The pull request's merge base: its commit, and when `main` first ran it (None: unknown)."""

    commit: str
    at: float | None


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What a rule reads: the trial, and what the trusted history says about the entry."""

    trial: Trial
    main: tuple[AttemptRow, ...]  # final trusted attempts on main that judged code, oldest first
    flakes: Flakiness | None  # over the trusted history's window
    flaky_rate: float | None  # the suite's threshold; None: only a rerun here says flaky
    min_runs: int
    base: Base | None  # None: no base given; judged against main's latest runs
    branch: str = "main"
    # failure_key() of each failure that was a flake -> how many times it was
    flake_reasons: Mapping[str, int] = field(default_factory=dict)

    @property
    def since_base(self) -> tuple[AttemptRow, ...]:
        if self.base is None or self.base.at is None:
            return self.main
        at = self.base.at
        return tuple(r for r in self.main if r.started_at >= at)

    @property
    def main_failing(self) -> tuple[AttemptRow, ...]:
        """The failures that end main's runs of the entry (its streak), oldest first."""
        tail: list[AttemptRow] = []
        for r in reversed(self.main):
            if r.outcome in OK:
                break
            tail.append(r)
        return tuple(reversed(tail))

    def is_flake(self, r: AttemptRow) -> bool:
        """A failure the way this entry has flaked before (the same reason, numbers aside)."""
        return r.outcome not in OK and self.flake_reasons.get(failure_key(r.reason), 0) > 0

    @property
    def flaky_by_rate(self) -> bool:
        f = self.flakes
        return (f is not None and self.flaky_rate is not None and f.runs >= self.min_runs
                and f.rate > self.flaky_rate)


Match = Callable[[Facts], "str | None"]


@dataclass(frozen=True, kw_only=True)
class Rule:
    """One row of the table: its id, the verdict it gives, what it means, and its test."""

    id: str
    verdict: Kind
    says: str
    match: Match  # the evidence when it applies, else None


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """One entry's verdict, with the rule that gave it and the evidence."""

    suite: str
    entry_id: str
    path: str
    kind: Kind
    rule: str
    evidence: str
    outcome: str
    reason: str
    run_uid: str
    commit: str
    # Where the deciding failure's assertion is, as its run recorded it ("" and None: unknown),
    # and the Actions run, attempt and job of that run ("" and None: not run in Actions).
    fail_path: str = ""
    fail_line: int | None = None
    gh_run_id: str = ""
    gh_run_attempt: int | None = None
    gh_job: str = ""

    @property
    def label(self) -> str:
        return LABELS[self.kind]


def when(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(epoch))


def short(commit: str) -> str:
    return commit[:10] or "?"


# --- the infrastructure: the attempt never judged the code ------------------------------------

def _infra(sign: Callable[[AttemptRow], str | None]) -> Match:
    """A rule that fires when this sign explains the deciding failure, and every other failure
    of the trial was the infrastructure's too (a lost node, then a pass elsewhere)."""
    def match(f: Facts) -> str | None:
        failures = f.trial.failures
        if not failures or any(infra_cause(a) is None for a in failures):
            return None
        return sign(failures[-1])
    return match


def _lost(a: AttemptRow) -> str | None:
    return f"{a.reason or 'its node was lost'} (outcome lost)" if a.outcome == "lost" else None


def _interrupted(a: AttemptRow) -> str | None:
    return "the run was stopped before this entry was judged (cancelled, or a newer push)" \
        if a.outcome == "interrupted" else None


def in_docker(a: AttemptRow) -> bool:
    """Whether the attempt ran under the Docker backend (its run's `backend`: "docker IMAGE")."""
    return a.backend == "docker" or a.backend.startswith("docker ")


def _gpu_wait(a: AttemptRow) -> str | None:
    # The reason of a `timeout` is the runner's own line, never the test's output.
    if a.outcome != "timeout" or not _GPU_WAIT.match(a.reason):
        return None
    return f"never got its GPUs: {a.reason}"


def _killed(a: AttemptRow) -> str | None:
    if a.exit_code is None or a.outcome not in ("failed", "empty"):
        return None
    sig = _SIGNALLED.get(a.exit_code) or (_DOCKER_SIGNALLED.get(a.exit_code) if in_docker(a) else None)
    if sig is None:
        return None
    return f"killed by {sig} from outside the test (exit {a.exit_code}) on {a.node or 'its node'}"


def _docker_exit(a: AttemptRow) -> bool:
    return in_docker(a) and a.exit_code == _DOCKER_RUN_FAILED and a.outcome in ("failed", "empty")


def _pull(a: AttemptRow) -> str | None:
    found = _PULL.search(a.reason) if _docker_exit(a) else None
    return f"the Docker image could not be pulled ({found.group(0)!r}; exit 125)" if found else None


def _docker_run(a: AttemptRow) -> str | None:
    return (f"`docker run` failed before the container started (exit {a.exit_code}): {a.reason}"
            if _docker_exit(a) else None)


# Checked in this order: the first sign that explains an attempt names its cause.
INFRA_SIGNS: tuple[tuple[str, Callable[[AttemptRow], str | None]], ...] = (
    ("node-lost", _lost), ("interrupted", _interrupted), ("gpu-wait", _gpu_wait),
    ("killed", _killed), ("image-pull", _pull), ("docker-run", _docker_run),
)


def infra_cause(a: AttemptRow) -> str | None:
    """The id of the infrastructure sign that explains this failed attempt, else None."""
    if a.outcome in OK:
        return None
    return next((name for name, sign in INFRA_SIGNS if sign(a) is not None), None)


# --- the code's failures against main ---------------------------------------------------------

def _flaky_retry(f: Facts) -> str | None:
    t = f.trial
    if t.final.outcome != "flaky" and not (t.final.outcome in OK and len(t.attempts) > 1):
        return None
    failed = [a for a in t.attempts[:-1] if a.outcome not in OK]
    why = failed[-1].reason if failed else t.final.reason
    return (f"failed {len(failed) or len(t.attempts) - 1} time(s) here ({why or 'no reason recorded'}), "
            f"then passed on attempt {t.final.attempt}")


def _streak(f: Facts, *, least: int) -> str | None:
    tail = f.main_failing
    if len(tail) < least or tail[0].started_at > f.trial.final.started_at:
        return None
    before = f.main[:len(f.main) - len(tail)]
    good = before[-1].commit if before else ""
    range_ = (f"bisect {short(good)}..{short(tail[0].commit)}" if good
              else "no passing run of it on main recorded")
    return (f"failing on {f.branch} since {short(tail[0].commit)} ({when(tail[0].started_at)}), "
            f"{len(tail)} run(s) in a row, last on {short(tail[-1].commit)}: "
            f"{tail[-1].reason or tail[-1].outcome}; {range_}")


def _main_broken(f: Facts) -> str | None:
    return _streak(f, least=2)


def _main_failed_last(f: Facts) -> str | None:
    tail = f.main_failing
    if f.flaky_by_rate or (tail and f.is_flake(tail[-1])):
        return None  # one failure on main, the way it flakes: not yet a break
    return _streak(f, least=1)


def _flaky_rate(f: Facts) -> str | None:
    if not f.flaky_by_rate or f.flakes is None or f.flaky_rate is None:
        return None
    x = f.flakes
    why = failure_key(f.trial.failures[-1].reason) if f.trial.failures else ""
    if not f.flake_reasons.get(why, 0):
        return None  # a flaky entry that fails in a way it never flaked: judged as any other
    return (f"flake rate {x.rate:.0%} ({x.flakes} of {x.runs} runs: {x.retried} passed on a retry, "
            f"{x.split} failed on a commit where it also passed) is above the suite's "
            f"{f.flaky_rate:.0%}, and it flaked with this very failure before; "
            f"window {when(x.first_at)} .. {when(x.last_at)}")


def _same_flake(f: Facts) -> str | None:
    if not f.trial.failures or not f.main or any(not f.is_flake(r) for r in f.main_failing):
        return None
    why = failure_key(f.trial.failures[-1].reason)
    seen = f.flake_reasons.get(why, 0)
    if seen < SAME_FLAKES:
        return None
    return (f"it failed as it flaked {seen} times before ({f.trial.failures[-1].reason[:120]!r}: failed, "
            f"then passed on a retry or on the same commit), and {f.branch} passes it")


def _no_history(f: Facts) -> str | None:
    return None if f.main else f"no trusted run of it on {f.branch} (a new entry, or a new hardware kind)"


def _base_unknown(f: Facts) -> str | None:
    if f.base is None or f.base.at is not None:
        return None
    return f"the merge base {short(f.base.commit)} is in neither the history nor this checkout's git"


def _not_since_base(f: Facts) -> str | None:
    if f.base is None or f.base.at is None or f.since_base:
        return None
    last = f.main[-1]
    return (f"{f.branch} has not run it since the merge base {short(f.base.commit)}; its last run "
            f"there was {short(last.commit)} ({when(last.started_at)}, {last.outcome})")


def _new(f: Facts) -> str | None:
    runs = tuple(r for r in f.since_base if not f.is_flake(r))  # main's flakes say nothing here
    if not runs or runs[-1].outcome not in OK:
        return None
    good = [r for r in runs if r.outcome in OK]
    where = "since the merge base " + short(f.base.commit) if f.base is not None else "in its latest runs"
    return (f"passed on {f.branch} at {short(runs[-1].commit)} ({when(runs[-1].started_at)}); "
            f"{len(good)} of {len(runs)} run(s) there {where} passed (commits "
            f"{', '.join(dict.fromkeys(short(r.commit) for r in good[-3:]))})")


def _nothing(f: Facts) -> str | None:
    return "no rule matched: the evidence does not say"


# The table, in order: (id, verdict, match, what it means). The infrastructure's rows come first,
# one per sign of INFRA_SIGNS, in its order and under its ids.
_INFRA_SAYS = {
    "node-lost": "the runner or its cluster node was lost under the attempt",
    "interrupted": "the run was stopped (cancelled, superseded) before it judged the entry",
    "gpu-wait": "the attempt timed out waiting for its GPUs (the allocator's WaitTimeout)",
    "killed": "a signal ended it from outside the test: SIGKILL or SIGTERM (the OOM killer's too), "
              "read from its exit status (128+N only under Docker)",
    "image-pull": "under Docker, `docker run` exited 125 and said the image could not be pulled",
    "docker-run": "under Docker, `docker run` failed before the container started (exit 125)",
}
_CODE_ROWS: tuple[tuple[str, Kind, Match, str], ...] = (
    ("flaky-retry", "flaky", _flaky_retry, "it failed, then passed on a retry in this very run"),
    ("main-broken", "already-failing", _main_broken,
     "its last two or more trusted runs on main failed, the first before this run"),
    ("flaky-rate", "flaky", _flaky_rate,
     "its flake rate over the window is above the suite's threshold, and it failed here "
     "as it did in one of its flakes (same reason, numbers aside)"),
    ("main-failed-last", "already-failing", _main_failed_last,
     "its last trusted run on main failed, not the way it flakes (nor is it flaky by rate)"),
    ("same-flake", "flaky", _same_flake,
     "below the threshold, but it failed exactly as in two or more of its recorded flakes, "
     "and main passes it"),
    ("no-history", "unknown", _no_history, "no trusted run of it on main: nothing to compare with"),
    ("base-unknown", "unknown", _base_unknown, "the merge base is unknown, so no run can be placed after it"),
    ("not-since-base", "unknown", _not_since_base, "main has not run it since the merge base"),
    ("new", "new", _new, "main passed it at or after the merge base; here it failed"),
    ("no-rule", "unknown", _nothing, "none of the rules above applied"),
)
RULES: tuple[Rule, ...] = (
    *(Rule(id=name, verdict="infrastructure", match=_infra(sign), says=_INFRA_SAYS[name])
      for name, sign in INFRA_SIGNS),
    *(Rule(id=i, verdict=k, match=m, says=says) for i, k, m, says in _CODE_ROWS),
)


def failure_key(reason: str) -> str:
    """A failure's reason with its numbers blanked: two flakes of one cause compare equal."""
    return _DIGITS.sub("N", reason.strip())[:160]


def flake_reasons(rows: Sequence[AttemptRow]) -> Counter[str]:
    """The reasons of an entry's failures that were flakes: the failed tries of runs that passed
    on a retry, and failures on a commit where another run of it passed (rows oldest first)."""
    passed_on = {(r.commit, r.hardware) for r in rows if r.final and r.outcome in OK and r.commit}
    flaky_runs = {r.run_uid for r in rows if r.final and r.outcome == "flaky"}
    return Counter(failure_key(r.reason) for r in rows if r.outcome not in OK and (
        r.run_uid in flaky_runs or (r.final and (r.commit, r.hardware) in passed_on)))


def decide(facts: Facts) -> tuple[Rule, str]:
    """The first rule that matches, and its evidence."""
    for rule in RULES:
        evidence = rule.match(facts)
        if evidence is not None:
            return rule, evidence
    raise AssertionError("the last rule always matches")  # pragma: no cover


# --- a run's trials and the history around them -----------------------------------------------

def trials(rows: Iterable[AttemptRow]) -> list[Trial]:
    """Per (suite, entry), the attempts of the newest run that ran it (rows oldest first)."""
    by_run: dict[tuple[str, str], dict[str, list[AttemptRow]]] = defaultdict(dict)
    for r in rows:
        by_run[(r.suite, r.entry_id)].setdefault(r.run_uid, []).append(r)
    out = []
    for (suite, entry), runs in by_run.items():
        newest = max(runs.values(), key=lambda rs: rs[-1].started_at)
        attempts = tuple(sorted(newest, key=lambda a: a.attempt))
        if attempts[-1].final:
            out.append(Trial(suite=suite, entry_id=entry, attempts=attempts))
    return sorted(out, key=lambda t: (t.suite, t.entry_id))


def head_rows(rows: Sequence[AttemptRow]) -> list[AttemptRow]:
    """The rows of a pull request's newest commit (the one its latest run tested)."""
    if not rows:
        return []
    head = max(rows, key=lambda r: r.started_at).commit
    return [r for r in rows if r.commit == head]


def base_of(commit: str, history: Iterable[AttemptRow], git_time: float | None = None) -> Base:
    """The merge base, placed in time by the first trusted run of that commit, else by git."""
    seen = [r.started_at for r in history if r.commit == commit and r.trusted]
    return Base(commit=commit, at=min(seen) if seen else git_time)


@dataclass(frozen=True, kw_only=True)
class SuiteRules:
    """What a suite declares for its verdicts (ci/registry/model.py)."""

    flaky_rate: float | None
    min_runs: int
    blocks: tuple[str, ...] = BLOCKING


def judge(judged: Sequence[AttemptRow], history: Sequence[AttemptRow], *, base: Base | None,
          suites: Mapping[str, SuiteRules], branch: str = "main",
          window: int = FLAKE_WINDOW) -> list[Verdict]:
    """A verdict for every entry of `judged` whose final attempt did not plainly pass.

    `history` is read as trusted only here too (a row of an untrusted run is dropped), and the
    judged runs themselves never count as their own baseline.
    """
    own = {r.run_uid for r in judged}
    trusted = [r for r in history if r.trusted and r.run_uid not in own]
    by_entry: dict[tuple[str, str, str], list[AttemptRow]] = defaultdict(list)
    for r in trusted:
        by_entry[(r.suite, r.hardware, r.entry_id)].append(r)
    out = []
    for t in trials(judged):
        if t.final.outcome in PASSING:
            continue
        rows = by_entry.get((t.suite, t.final.hardware, t.entry_id), [])
        rates = flakiness(rows, window=window).get(t.entry_id)
        main = tuple(r for r in rows if r.final and r.branch == branch and infra_cause(r) is None
                     and r.outcome not in ("interrupted", "deselected"))
        cfg = suites.get(t.suite, SuiteRules(flaky_rate=None, min_runs=10))
        facts = Facts(trial=t, main=main, flakes=rates, flaky_rate=cfg.flaky_rate, min_runs=cfg.min_runs,
                      base=base, branch=branch, flake_reasons=flake_reasons(rows[-window * 3:]))
        rule, evidence = decide(facts)
        failed = t.failures[-1] if t.failures else t.final
        out.append(Verdict(suite=t.suite, entry_id=t.entry_id, path=t.final.path, kind=rule.verdict,
                           rule=rule.id, evidence=evidence, outcome=t.final.outcome,
                           reason=failed.reason, run_uid=t.final.run_uid, commit=t.final.commit,
                           fail_path=failed.fail_path, fail_line=failed.fail_line,
                           gh_run_id=t.final.gh_run_id, gh_run_attempt=t.final.gh_run_attempt,
                           gh_job=t.final.gh_job))
    return out


def blocking(verdicts: Iterable[Verdict], suites: Mapping[str, SuiteRules]) -> list[Verdict]:
    """The verdicts that fail the `verdict` check, as each suite declares."""
    default = SuiteRules(flaky_rate=None, min_runs=10)
    return [v for v in verdicts if v.kind in suites.get(v.suite, default).blocks]
