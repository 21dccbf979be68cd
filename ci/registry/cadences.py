"""Scheduled runs: each cron of the workflow maps explicitly to a cadence; suites name theirs.

Nightly runs every GPU suite on main, so GPU regressions surface without a PR kept open to
get a GPU run; weekly runs them again plus the suites only it names (`image`) and the
stability job (the infinite mode, for a bounded time). A cron that maps to no cadence, or
a cadence that no cron reaches, is a generation error rather than a silent nightly.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping, Sequence

from ci.errors import UsageError
from ci.registry.model import Suite

NIGHTLY = "nightly"
WEEKLY = "weekly"
# The failure monitor (`history monitor` over the shared store): hourly, as a streak of
# failures on main should reach someone the same morning, not the next nightly.
MONITOR = "monitor"
# cron -> cadence (UTC). Off the hour: the top of the hour is when Actions' queue is longest.
DEFAULT_SCHEDULES: Mapping[str, str] = {"17 2 * * *": NIGHTLY, "41 3 * * 6": WEEKLY,
                                        "23 * * * *": MONITOR}
_CRON = re.compile(r"(\S+ ){4}\S+")
_NAME = re.compile(r"[a-z][a-z0-9_-]*")


def suite_cadences(suite: Suite) -> tuple[str, ...]:
    """The cadences a suite runs on: its own list, else every GPU suite nightly and weekly."""
    if suite.cadences is not None:
        return suite.cadences
    if suite.needs_gpus and not suite.dynamic:  # a diff-driven suite has nothing to run on main
        return (NIGHTLY, WEEKLY)
    return ()


def check_schedules(schedules: Mapping[str, str], suites: Sequence[Suite],
                    extra: Sequence[str] = ()) -> None:
    """Every cron is well formed and maps to a cadence something runs on, and vice versa."""
    used = {c for s in suites for c in suite_cadences(s)} | set(extra)
    for cron, cadence in schedules.items():
        if not _CRON.fullmatch(cron):
            raise UsageError(f"schedule {cron!r}: expected five cron fields, e.g. '17 2 * * *'")
        if not _NAME.fullmatch(cadence) or cadence not in used:
            raise UsageError(f"schedule {cron!r} maps to cadence {cadence!r}, which no suite runs on; "
                             f"cadences in use: {', '.join(sorted(used)) or 'none'}")
    reached = set(schedules.values())
    for suite in suites:
        missing = [c for c in suite_cadences(suite) if c not in reached]
        if missing:
            raise UsageError(f"suite {suite.name} runs on cadence {missing[0]!r} but no cron maps to it: "
                             f"add one to WORKFLOW['schedules'] (cron -> cadence)")
    for cadence in extra:  # a session's or the stability job's: a job no cron would ever start
        if cadence not in reached:
            raise UsageError(f"cadence {cadence!r} is named in the registry but no cron maps to it: "
                             f"add one to WORKFLOW['schedules'] (cron -> cadence)")


def cadence_of(cron: str, schedules: Mapping[str, str]) -> str:
    """The cadence of a scheduled run's cron; an unmapped cron is an error, never a default."""
    if cron not in schedules:
        known = ", ".join(f"{c!r} ({n})" for c, n in schedules.items()) or "none"
        raise UsageError(f"cron {cron!r} maps to no cadence; known: {known}")
    return schedules[cron]


def gpu_irrelevant(path: str, patterns: Sequence[str]) -> bool:
    """Whether no GPU job can be affected by `path`: under a `dir/` pattern, or matching a glob
    (a glob without `/` matches the file name anywhere, as `*.md` should)."""
    name = path.rsplit("/", 1)[-1]
    for pattern in patterns:
        if pattern.endswith("/"):
            if path.startswith(pattern):
                return True
        elif fnmatch.fnmatchcase(path if "/" in pattern else name, pattern):
            return True
    return False


def gpu_skip_reason(paths: Sequence[str], patterns: Sequence[str]) -> str | None:
    """Why a diff skips the GPU jobs (every path GPU-irrelevant); None when any path may reach a GPU."""
    if not paths or not all(gpu_irrelevant(p, patterns) for p in paths):
        return None
    return (f"the diff touches only GPU-irrelevant paths ({len(paths)} file(s) under "
            f"{', '.join(patterns)}): GPU job skipped")
