"""The runner's side of the history: what a run reads before it plans and writes when it ends.

A store that cannot be used never fails a test run: the run says so in one line, keeps
its JUnit and durations as before, and spools its record to `.ci-cache/history-pending/`;
the next run that reaches the store writes the spooled records first, so nothing is lost.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ci.errors import StoreError
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.stats import after_lifts, auto_quarantine, estimates, failed_on_branch, flakiness, recovered
from ci.history.store import HistoryStore, RecordRefused, describe, open_store
from ci.registry.model import AUTO_QUARANTINE_CLEAN_RUNS
from ci.select import executed

PENDING_DIR = ".ci-cache/history-pending"
# A spooled record the store refuses (a value no column holds) is renamed with this suffix:
# kept for a look, never replayed again.
REFUSED_SUFFIX = ".refused"
# One line per run this checkout recorded or spooled, so a CI job's last step
# (`history record`, ci/history/job.py) can tell a session that recorded its run from one
# that never got that far; that step consumes it.
JOURNAL = ".ci-cache/history-journal"
HARDWARE_ENV = "SLIME_CI_HARDWARE"
Warn = Callable[[str], None]


def hardware_kind(*, needs_gpus: bool, emulated: bool, env: Mapping[str, str]) -> str:
    """The kind of hardware a run is judged on: CUDA and emulated GPUs never share a baseline."""
    chosen = env.get(HARDWARE_ENV, "").strip()
    if chosen:
        return chosen[:64]
    if needs_gpus:
        return "emulated" if emulated else "cuda"
    return "cpu"


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                             timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def run_context(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """Commit, branch, event, runner and host: from GitHub Actions when there, else from git."""
    branch = env.get("GITHUB_HEAD_REF") or env.get("GITHUB_REF_NAME") or ""
    if not branch:
        branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
        branch = "" if branch == "HEAD" else branch
    return {
        "commit": env.get("GITHUB_SHA") or _git(root, "rev-parse", "HEAD"),
        "branch": branch,
        "event": env.get("GITHUB_EVENT_NAME") or "local",
        "runner": env.get("RUNNER_NAME", ""),
        "host": socket.gethostname(),
        # The Actions run and job, for links to the evidence (the ingest takes the run from
        # GitHub's event where it has one).
        "gh_run_id": env.get("GITHUB_RUN_ID", ""),
        "gh_run_attempt": env.get("GITHUB_RUN_ATTEMPT", ""),
        "gh_job": env.get("GITHUB_JOB", ""),
    }


def new_uid() -> str:
    return uuid.uuid4().hex


@dataclass(frozen=True, kw_only=True)
class Before:
    """What the history tells a run before it starts."""

    estimates: Mapping[str, float] = field(default_factory=dict)
    failed_here: frozenset[str] = frozenset()  # entries that failed last time on this branch
    quarantined: Mapping[str, str] = field(default_factory=dict)  # auto-quarantined entry → why
    available: bool = False
    error: str = ""  # why the store could not be read (said once, at planning)


def read_before(url: str | None, *, suite: str, hardware: str, branch: str,
                quarantine_rate: float | None, min_runs: int, warn: Warn,
                clean_runs: int = AUTO_QUARANTINE_CLEAN_RUNS) -> Before:
    """Estimates (same hardware), failures on this branch and flake quarantine; {} when unreachable.

    Estimates and quarantine read trusted runs only: a pull request's runs never lift or
    impose a quarantine, nor skew the plan. A branch's own failures come from its own runs,
    trusted or not (they only move those entries to the front).
    """
    if url is None:
        return Before()
    try:
        with open_store(url) as store:
            rows = store.attempts(suite=suite, hardware=hardware, last_runs=300, trusted_only=True)
            mine = (store.attempts(suite=suite, hardware=hardware, branch=branch, last_runs=50)
                    if branch else [])
            lifted = store.lifts(suite)
    except StoreError as exc:
        warn(f"history: unavailable ({exc}); planning from durations.json")
        return Before(error=str(exc))
    # A PR's own flakes never hold an entry, nor flakes before its issue was closed by hand.
    trusted = after_lifts([r for r in rows if r.trusted], lifted)
    auto = (auto_quarantine(flakiness(trusted), rate=quarantine_rate, min_runs=min_runs)
            if quarantine_rate is not None else {})
    auto = recovered(auto, trusted, clean_runs=clean_runs)
    return Before(estimates=estimates(rows),
                  failed_here=frozenset(failed_on_branch(mine, branch)) if branch else frozenset(),
                  quarantined=auto, available=True)


def executed_records(url: str | None, root: Path, warn: Warn) -> dict[str, executed.Record]:
    """What each entry executed, as selection reads it: the store's newest record per entry
    from a trusted run (`HistoryStore.executed`); an entry the store has none of takes the
    checkout's records file (`run --record-executed` without a store, or before its first
    ingest). A store that cannot be read is said in one line, and the file decides."""
    local = executed.load(root / executed.RECORDS_FILE)
    if url is None or (url.startswith("sqlite:///") and not Path(url.split(":///", 1)[1]).is_file()):
        return local
    try:
        with open_store(url, create=False) as store:
            rows = store.executed()
    except StoreError as exc:
        warn(f"history: what entries executed is unavailable ({exc}); selecting from "
             f"{executed.RECORDS_FILE}")
        return local
    stored = {e: executed.Record(entry=e, commit=r.commit, recorded_at=r.started_at, files=r.files,
                                 lines={f: spans for f, (_, spans) in r.lines.items()},
                                 blobs={f: blob for f, (blob, _) in r.lines.items()})
              for e, r in rows.items()}
    return {**local, **stored}


def spool(run: RunRecord, root: Path) -> Path:
    """Keep a record the store could not take; written atomically."""
    folder = root / PENDING_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{run.uid}.json"
    tmp = folder / f".{run.uid}.{os.getpid()}.tmp"
    tmp.write_text(run.to_json(), encoding="utf-8")
    tmp.replace(path)
    return path


def replay(store: HistoryStore, root: Path, warn: Warn) -> int:
    """Write every spooled record; each file goes once its run is in the store."""
    folder = root / PENDING_DIR
    written = 0
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else ():
        try:
            run = RunRecord.from_json(path.read_text(encoding="utf-8"))
        except (OSError, ValueError, TypeError) as exc:
            warn(f"history: spooled record {path} is unreadable ({exc}); left there")
            continue
        try:
            written += store.record(run)
        except RecordRefused as exc:
            kept = path.with_name(path.name + REFUSED_SUFFIX)
            path.replace(kept)
            warn(f"history: spooled record refused ({exc}); moved to {kept}, never replayed")
            continue
        path.unlink(missing_ok=True)
    return written


def import_durations(store: HistoryStore, durations: Mapping[str, float], *, hardware: str,
                     suite: str = "") -> bool:
    """`durations.json` as one imported run, so estimates keep what it measured.

    The uid is the content's digest: importing the same file twice adds nothing.
    """
    if not durations:
        return False
    digest = hashlib.sha256(json.dumps(dict(sorted(durations.items()))).encode()).hexdigest()[:32]
    now = 0.0  # older than any real run: a real measurement always counts as newer
    attempts = tuple(AttemptRecord(entry_id=k, path=k.split(" ", 1)[0], attempt=1, final=True,
                                   outcome="passed", seconds=float(v)) for k, v in sorted(durations.items()))
    return store.record(RunRecord(uid=f"durations-{digest}", suite=suite, event="import",
                                  hardware=hardware, started_at=now, ended_at=now, exit_code=0,
                                  attempts=attempts, backend="durations.json"))


def note_run(root: Path, run: RunRecord, where: str) -> None:
    """Append the run to the journal (best effort: the journal is a hint, the store the truth)."""
    path = root / JOURNAL
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps({"uid": run.uid, "suite": run.suite, "where": where}) + "\n")
    except OSError:
        pass


def write_after(url: str | None, run: RunRecord, *, root: Path, durations: Mapping[str, float],
                warn: Warn, note: Warn, known_error: str = "") -> bool:
    """Record the run; on any store problem warn in one line and spool it. Never raises StoreError."""
    if url is None:
        return False
    try:
        with open_store(url) as store:
            if store.counts()["runs"] == 0:
                try:
                    import_durations(store, durations, hardware=run.hardware, suite=run.suite)
                except RecordRefused as exc:  # a hand-edited durations.json never costs the run
                    warn(f"history: durations.json not imported ({exc})")
            replayed = replay(store, root, warn)
            store.record(run)
    except RecordRefused as exc:
        # The store works; this record never will: spooling it would fail every later run.
        warn(f"history: not recorded ({exc}); not spooled")
        note_run(root, run, "refused")
        return False
    except StoreError as exc:
        try:
            kept = spool(run, root)
        except OSError as err:
            warn(f"history: not recorded ({exc}); could not spool it either ({err})")
            return False
        why = "the same problem" if str(exc) == known_error else str(exc)
        warn(f"history: not recorded ({why}); kept in {kept} for the next run")
        note_run(root, run, "spooled")
        return False
    note_run(root, run, "recorded")
    extra = f" (+{replayed} spooled)" if replayed else ""
    note(f"history: recorded run {run.uid[:8]}{extra} in {describe(url)}")
    return True
