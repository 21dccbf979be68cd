"""What the HUD reads from the history store: attempts (through the store's own query), the
bisect answers, the GPU attempts with their host, the gated metrics, and the pull requests'
waits (their runs' slowest hosted jobs, from the jobs' times the ingest job records).

The store's `attempts()` is the one read of attempts; the query here reads what it does
not carry (a run's host and an attempt's devices), and only reads. The bisect answers and
the jobs' times are the queries of ci/history/bisects.py and ci/history/job_times.py.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ci.errors import StoreError
from ci.history.bisects import BisectRow, bisects
from ci.history.job_times import Wait, job_times, waits
from ci.history.store import AttemptRow, HistoryStore, MetricRow


@dataclass(frozen=True, kw_only=True)
class GpuAttempt:
    """One attempt that held GPUs: where, how many, which, for how long."""

    host: str
    run_uid: str
    started_at: float  # its run's start (attempts keep no start of their own)
    ended_at: float  # its run's end
    num_gpus: int
    devices: str
    seconds: float


@dataclass(frozen=True, kw_only=True)
class History:
    """Everything one build of the site reads, once."""

    main: tuple[AttemptRow, ...]  # trusted runs on the branch, oldest first
    prs: tuple[AttemptRow, ...] = ()  # runs of pull requests (with --include-prs), oldest first
    bisects: tuple[BisectRow, ...] = ()
    gpu: tuple[GpuAttempt, ...] = ()
    metrics: Mapping[tuple[str, str], tuple[MetricRow, ...]] = field(default_factory=dict)
    waits: tuple[Wait, ...] = ()  # pull requests' runs, oldest first


def gpu_attempts(store: HistoryStore, *, since: float) -> list[GpuAttempt]:
    """Attempts that held at least one GPU in trusted runs started at or after `since`."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from ci.history import schema

    r, a = schema.runs, schema.attempts
    query = (select(r.c.host, r.c.uid, r.c.started_at, r.c.ended_at, a.c.num_gpus, a.c.devices,
                    a.c.seconds)
             .join(a, a.c.run_id == r.c.id)
             .where(a.c.num_gpus > 0, r.c.started_at >= since, r.c.trusted.is_(True))
             .order_by(r.c.started_at, r.c.id, a.c.entry_id, a.c.attempt))
    try:
        with store.engine.connect() as conn:
            return [GpuAttempt(host=h, run_uid=u, started_at=s, ended_at=e, num_gpus=n, devices=d,
                               seconds=sec)
                    for h, u, s, e, n, d, sec in conn.execute(query).tuples()]
    except SQLAlchemyError as exc:
        raise StoreError(f"history store: cannot read its GPU attempts: {str(exc).splitlines()[0]}") from None


def read(store: HistoryStore, *, branch: str, last_runs: int, include_prs: bool,
         gated: Mapping[str, Sequence[str]]) -> History:
    """One read of the store for the whole site; `gated`: entry -> the metrics its gates watch."""
    rows = store.attempts(branch=branch, last_runs=last_runs, trusted_only=True)
    prs: list[AttemptRow] = []
    if include_prs:
        prs = [r for r in store.attempts(last_runs=last_runs) if r.pr is not None and not r.trusted]
    since = rows[0].started_at if rows else 0.0
    metrics: dict[tuple[str, str], tuple[MetricRow, ...]] = {}
    hardware = {r.entry_id: r.hardware for r in rows}  # the newest run's kind, per entry
    for entry, names in gated.items():
        if entry in hardware and names:
            series = store.metric_series(entry, hardware=hardware[entry], names=list(names), last_runs=30)
            for name in names:
                metrics[(entry, name)] = tuple(m for m in series if m.name == name)
    return History(main=tuple(rows), prs=tuple(prs), bisects=tuple(bisects(store)),
                   gpu=tuple(gpu_attempts(store, since=since)), metrics=metrics,
                   waits=tuple(waits(job_times(store, event="pull_request"))))
