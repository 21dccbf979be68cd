"""Each job's wall time per workflow run, as GitHub reports it: what a PR's author waits for.

The ingest job (ci/github/ingest_workflow.py) asks GitHub for the finished run's jobs, one
JSON object a line (`gh api --paginate …/runs/N/attempts/A/jobs --jq '.jobs[] | {…}'`), and
`python -m ci history ingest --jobs FILE` records them (table `job_times`, schema 8) with the
event, pull request and trust that the workflow_run event states, never the file. Hosted
jobs run side by side, so a run's wait is its slowest hosted job, set-up included (a job's
time is GitHub's: from its start on a runner to its end). `python -m ci history waits` and
the HUD's index show it over time. Pure, but for the reading of the file and the table's
two queries (`record_job_times`, `job_times`), which take an open store as ci/hud/read.py's do.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from ci.errors import StoreError, UsageError

if TYPE_CHECKING:  # store.py imports nothing of this module: no circle
    from ci.history.store import HistoryStore

MAX_JOBS = 1_000  # one run's jobs: a matrix of shards times the suites stays far below
MAX_BYTES = 4 << 20
NAME_LIMIT = 256
# The fields the ingest job keeps of each of GitHub's job objects, one compact JSON a line.
JQ = ".jobs[] | {name, started_at, completed_at, conclusion, labels} | tojson"


@dataclass(frozen=True, kw_only=True)
class JobTime:
    """One job of one attempt of a workflow run: when it ran, on what kind of runner, how it ended."""

    gh_run_id: str
    gh_run_attempt: int
    job: str  # its name as GitHub shows it ("toolkit (shard 1/3)")
    event: str
    commit: str
    pr: int | None
    trusted: bool
    hosted: bool  # a GitHub-hosted runner: its labels do not name `self-hosted`
    conclusion: str  # success, failure, cancelled, …; "" while GitHub had none
    started_at: float
    completed_at: float

    @property
    def seconds(self) -> float:
        return self.completed_at - self.started_at


@dataclass(frozen=True, kw_only=True)
class Wait:
    """One workflow run's wait: its slowest hosted job."""

    gh_run_id: str
    gh_run_attempt: int
    event: str
    commit: str
    pr: int | None
    started_at: float  # its first hosted job's start
    slowest: str  # that job's name
    seconds: float
    jobs: int  # its hosted jobs


def _time(value: object, where: str) -> float | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > 40:
        raise ValueError(f"{where}: not an ISO 8601 time")
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        raise ValueError(f"{where}: not an ISO 8601 time") from None


def parse_jobs(text: str, *, run_id: str, attempt: int, event: str, commit: str, pr: int | None,
               trusted: bool) -> list[JobTime]:
    """The jobs of one run attempt from the ingest job's file; ValueError names the bad line.
    A job that never ran on a runner (skipped, or no start or end) is left out."""
    out: list[JobTime] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            item = json.loads(line)
        except ValueError:
            raise ValueError(f"{where}: not JSON") from None
        if not isinstance(item, dict):
            raise ValueError(f"{where}: not a JSON object")
        name, labels, conclusion = item.get("name"), item.get("labels", []), item.get("conclusion")
        if not isinstance(name, str) or not name or len(name) > NAME_LIMIT:
            raise ValueError(f"{where}: `name` is not a job name of at most {NAME_LIMIT} characters")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise ValueError(f"{where}: `labels` is not a list of strings")
        if conclusion is not None and (not isinstance(conclusion, str) or len(conclusion) > 32):
            raise ValueError(f"{where}: `conclusion` is not a word")
        start = _time(item.get("started_at"), f"{where} `started_at`")
        end = _time(item.get("completed_at"), f"{where} `completed_at`")
        if conclusion == "skipped" or start is None or end is None:
            continue
        if end < start:
            raise ValueError(f"{where}: job {name!r} ends before it starts")
        if name in seen:
            raise ValueError(f"{where}: job {name!r} is listed twice")
        seen.add(name)
        hosted = not any(x.casefold() == "self-hosted" for x in labels)
        out.append(JobTime(gh_run_id=run_id, gh_run_attempt=attempt, job=name, event=event, commit=commit,
                           pr=pr, trusted=trusted, hosted=hosted, conclusion=conclusion or "",
                           started_at=start, completed_at=end))
        if len(out) > MAX_JOBS:
            raise ValueError(f"more than {MAX_JOBS} jobs in one run")
    return out


def read_jobs(path: Path, **trigger: object) -> list[JobTime]:
    """`parse_jobs` of a file (the keywords as there); a UsageError for a file it cannot take."""
    try:
        if path.stat().st_size > MAX_BYTES:
            raise UsageError(f"--jobs {path}: larger than {MAX_BYTES >> 20} MiB; no job time recorded")
        return parse_jobs(path.read_text(encoding="utf-8"), **trigger)  # type: ignore[arg-type]
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--jobs {path}: cannot read it ({exc.__class__.__name__}); no job time "
                         "recorded") from None
    except ValueError as exc:
        raise UsageError(f"--jobs {path}: {exc}; no job time recorded") from None


def record_job_times(store: HistoryStore, rows: Sequence[JobTime]) -> int:
    """Write jobs' wall times (table `job_times`) in one transaction; how many were new: a job
    ingested twice (a rerun ingest job) is kept once."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    t = schema.job_times
    try:
        with store.engine.begin() as conn:
            added = 0
            for row in rows:
                key = (t.c.gh_run_id == row.gh_run_id, t.c.gh_run_attempt == row.gh_run_attempt,
                       t.c.job == row.job)
                if conn.execute(select(t.c.id).where(*key)).first() is None:
                    conn.execute(t.insert().values(**asdict(row)))
                    added += 1
            return added
    except SQLAlchemyError as exc:
        raise store._fail(exc, "record the jobs' times") from None  # the store's own wording


def job_times(store: HistoryStore, *, event: str | None = None, since: float = 0.0) -> list[JobTime]:
    """Jobs' wall times (table `job_times`) of runs started at or after `since`, oldest first."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    t = schema.job_times
    fields = [f for f in JobTime.__dataclass_fields__]
    query = select(*(t.c[f] for f in fields)).where(t.c.started_at >= since)
    if event is not None:
        query = query.where(t.c.event == event)
    try:
        with store.engine.connect() as conn:
            return [JobTime(**dict(zip(fields, row, strict=True)))
                    for row in conn.execute(query.order_by(t.c.started_at, t.c.id)).tuples()]
    except SQLAlchemyError as exc:
        raise StoreError("history store: cannot read its jobs' times: "
                         f"{str(exc).splitlines()[0]}") from None


def waits(rows: Sequence[JobTime], *, event: str = "pull_request") -> list[Wait]:
    """Each run attempt of `event` with its slowest hosted job, oldest first."""
    runs: dict[tuple[str, int], list[JobTime]] = {}
    for r in rows:
        if r.event == event and r.hosted:
            runs.setdefault((r.gh_run_id, r.gh_run_attempt), []).append(r)
    out = []
    for (run_id, attempt), jobs in runs.items():
        slowest = max(jobs, key=lambda j: (j.seconds, j.job))
        first = jobs[0]
        out.append(Wait(gh_run_id=run_id, gh_run_attempt=attempt, event=event, commit=first.commit,
                        pr=first.pr, started_at=min(j.started_at for j in jobs), slowest=slowest.job,
                        seconds=slowest.seconds, jobs=len(jobs)))
    return sorted(out, key=lambda w: (w.started_at, w.gh_run_id, w.gh_run_attempt))


def quantile(values: Sequence[float], q: float) -> float:
    """The q-quantile (0 < q <= 1) by nearest rank: a value that was seen; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def summary(found: Sequence[Wait], *, last: int) -> str:
    """One line: median, p90 and the worst of the last `last` waits, and the job most often slowest."""
    recent = list(found)[-last:]
    if not recent:
        return "no run recorded its jobs' times yet (the ingest job records them)"
    secs = [w.seconds for w in recent]
    slowest = statistics.mode(w.slowest for w in recent)
    return (f"wait of the last {len(recent)} {recent[0].event} run(s): median "
            f"{statistics.median(secs) / 60:.1f} min, p90 {quantile(secs, 0.9) / 60:.1f} min, worst "
            f"{max(secs) / 60:.1f} min; slowest most often: {slowest}")
