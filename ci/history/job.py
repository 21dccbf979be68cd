"""A CI job's side of the history: merge its shards' stores before the run, record after it.

`python -m ci history merge` and `python -m ci history record` (ci/history/queries.py) call these;
the generated workflow (ci/github/workflow.py) runs them as steps of every suite job. Neither ever
fails the job for a store it cannot reach: it says so in one line and keeps the record spooled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from ci.durations import DurationStore
from ci.errors import StoreError, UsageError
from ci.history.record import JOURNAL, hardware_kind, new_uid, replay, run_context, write_after
from ci.history.rows import RunRecord, gh_run_attempt, gh_run_id
from ci.history.store import HistoryStore, RecordRefused, open_store

JobStatus = Literal["success", "failure", "cancelled"]
STATUSES: tuple[JobStatus, ...] = ("success", "failure", "cancelled")
# The exit code recorded for a job whose session recorded nothing: a failure, or interrupted.
_EXIT = {"failure": 1, "cancelled": 130}
Warn = Callable[[str], None]


def journal(root: Path) -> list[dict[str, str]]:
    """The runs this checkout recorded or spooled since the journal was last consumed."""
    path = root / JOURNAL
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict):
            out.append({str(k): str(v) for k, v in item.items()})
    return out


def merge_stores(store: HistoryStore, sources: Sequence[Path], warn: Warn) -> int:
    """Every run of the SQLite files `sources` into `store`, each once (runs are keyed by uid)."""
    added = 0
    for path in sources:
        try:
            with open_store(f"sqlite:///{path}") as other:
                runs = other.runs()
        except StoreError as exc:
            warn(f"history: {path} left out of the merge ({exc})")
            continue
        for run in runs:
            try:
                added += store.record(run)
            except RecordRefused as exc:
                warn(f"history: a run of {path} left out of the merge ({exc})")
    return added


def merge_durations(target: Path, sources: Sequence[Path]) -> int:
    """The shards' durations in one file: for an entry several shards know, the longest.

    Only a fallback (the merged history's p90 comes first), and the same for every shard
    whatever order the files come in, so all shards plan the same partition.
    """
    merged: dict[str, float] = dict(DurationStore(target).load())
    for path in sources:
        for key, value in DurationStore(path).load().items():
            merged[key] = max(value, merged.get(key, 0.0))
    if merged:
        DurationStore(target).update(merged)
    return len(merged)


def record_job(root: Path, url: str | None, *, suite: str, needs_gpus: bool, status: str,
               env: Mapping[str, str], warn: Warn, note: Warn) -> list[str]:
    """The job's last step: write spooled records, and record a job whose session recorded nothing.

    Returns the uids of the runs this job recorded (its own, for `--export`)."""
    if status not in STATUSES:
        raise UsageError(f"--status {status!r}: expected one of {', '.join(STATUSES)} (job.status)")
    if url is None:
        note("history: off; nothing recorded")
        return []
    try:
        with open_store(url) as store:
            replayed = replay(store, root, warn)
        if replayed:
            note(f"history: wrote {replayed} spooled run(s)")
    except StoreError as exc:
        warn(f"history: spooled runs stay spooled ({exc})")
    seen = journal(root)
    uids = [x["uid"] for x in seen if x.get("uid")]
    if seen:
        note(f"history: this job recorded {len(seen)} run(s): "
             + ", ".join(f"{x.get('suite', '?')} {x.get('uid', '')[:8]} ({x.get('where', '?')})"
                         for x in seen))
    elif status == "success":
        note("history: the job passed but its session recorded no run (is history off?)")
    else:
        # The session never reached its end (an install failed, the job timed out or was
        # cancelled): the run is recorded anyway, without attempts, so the history shows it.
        now = time.time()
        context = run_context(root, env)
        stub = RunRecord(uid=new_uid(), suite=suite, commit=context["commit"], branch=context["branch"],
                         event=context["event"], host=context["host"], runner=context["runner"],
                         backend="workflow (the session recorded nothing)",
                         hardware=hardware_kind(needs_gpus=needs_gpus, emulated=False, env=env),
                         started_at=now, ended_at=now, exit_code=_EXIT[status],
                         gh_run_id=gh_run_id(context["gh_run_id"]),
                         gh_run_attempt=gh_run_attempt(context["gh_run_attempt"]),
                         gh_job=context["gh_job"][:128])
        write_after(url, stub, root=root, durations={}, warn=warn, note=note)
        uids.append(stub.uid)
    (root / JOURNAL).unlink(missing_ok=True)
    return uids
