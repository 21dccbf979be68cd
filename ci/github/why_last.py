"""`python -m ci why --last`: the last local run judged against main's trusted history, before
any push.

The run is the newest one in this checkout's own store (`--history`, else
.ci-cache/history.sqlite: where `nox -s <suite>` recorded it). The baseline is main's trusted
runs, read and never written: from the shared store when SLIME_CI_HISTORY_URL is set, else
from the snapshot `python -m ci history pull` saved (`SNAPSHOT_FILE`). No baseline: one
line, and no verdict, since every failure would read as unknown.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from ci.errors import StoreError, UsageError
from ci.history.store import HISTORY_ENV, HISTORY_FILE, AttemptRow, open_store

SNAPSHOT_FILE = ".ci-cache/history-trusted.sqlite"  # where `history pull` puts main's snapshot


def local_url(cli: str | None, root: Path) -> str:
    """The store the local run is in: --history, else this checkout's file (never the shared one)."""
    if cli is not None and cli.strip():
        return cli.strip()
    return f"sqlite:///{root / HISTORY_FILE}"


def baseline_url(env: Mapping[str, str], root: Path) -> tuple[str, str] | None:
    """(the trusted baseline's URL, what it is), or None when there is none here."""
    shared = env.get(HISTORY_ENV, "").strip()
    if shared:
        return shared, f"the shared store ({HISTORY_ENV})"
    snap = root / SNAPSHOT_FILE
    if snap.is_file():
        return f"sqlite:///{snap}", f"the snapshot {SNAPSHOT_FILE}"
    return None


def read_last(local: str, baseline: str, *, last_runs: int) -> tuple[list[AttemptRow], list[AttemptRow]]:
    """(the last local run's rows, their suites' newest `last_runs` trusted runs in the baseline)."""
    try:
        store = open_store(local, create=False)
    except StoreError:
        raise UsageError(f"no local run recorded here ({local}); run a suite first, e.g. "
                         "`nox -s cpu_unit`") from None
    with store:
        judged = store.attempts(last_runs=1)
    if not judged:
        raise UsageError("no local run recorded here yet; run a suite first, e.g. `nox -s cpu_unit`")
    names = sorted({r.suite for r in judged})
    with open_store(baseline, create=False) as base:
        history = [r for s in names for r in base.attempts(suite=s, trusted_only=True, last_runs=last_runs)]
    return judged, history
