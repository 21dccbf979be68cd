"""The GPU page: per host and day, how busy its GPUs were. Pure.

What the history holds of GPU use: each attempt's host (its run's), GPU count, devices and
seconds, and its run's start. A host's GPUs are those its attempts were ever given (the
highest device index seen, plus one); a day's busy fraction is the GPU-seconds its attempts
held over that many GPUs for the whole day (a run is counted on the day it started).

What it does not hold, and the page says so: when an attempt started waiting and when it
got its GPUs (the run's timeline page shows that for one run), and which waiter the
allocator let start ahead of which (backfilling; `gpu-status` shows the live queue).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from ci.hud.read import GpuAttempt

DAY = 86_400.0
NOT_RECORDED = ("Queue waits (p50/p90) and backfills are not in the history store: an attempt's "
                "wait for its GPUs is drawn on its run's timeline page (the run's directory), and "
                "who started ahead of whom is the allocator's live state (`python -m ci gpu-status`). "
                "This page shows what the store holds: GPU-seconds per host and day.")


@dataclass(frozen=True, kw_only=True)
class HostDay:
    host: str
    day: str  # YYYY-MM-DD (UTC)
    gpus: int  # GPUs of the host, as seen in its attempts' devices
    gpu_seconds: float
    attempts: int
    runs: int

    @property
    def busy(self) -> float:
        return min(1.0, self.gpu_seconds / (self.gpus * DAY)) if self.gpus else 0.0


def _devices(text: str) -> list[int]:
    return [int(p) for p in (x.strip() for x in text.split(",")) if p.isdigit()]


def per_host_day(rows: Sequence[GpuAttempt]) -> list[HostDay]:
    """One row per host and day that ran GPU attempts, hosts sorted, days newest first."""
    gpus: dict[str, int] = defaultdict(int)
    busy: dict[tuple[str, str], float] = defaultdict(float)
    count: dict[tuple[str, str], int] = defaultdict(int)
    runs: dict[tuple[str, str], set[str]] = defaultdict(set)
    for a in rows:
        host = a.host or "(unknown host)"
        seen = _devices(a.devices)
        gpus[host] = max(gpus[host], (max(seen) + 1) if seen else a.num_gpus)
        day = time.strftime("%Y-%m-%d", time.gmtime(a.started_at))
        busy[(host, day)] += a.seconds * a.num_gpus
        count[(host, day)] += 1
        runs[(host, day)].add(a.run_uid)
    keys = sorted(sorted(busy, key=lambda k: k[1], reverse=True), key=lambda k: k[0])
    return [HostDay(host=h, day=d, gpus=gpus[h], gpu_seconds=busy[(h, d)], attempts=count[(h, d)],
                    runs=len(runs[(h, d)])) for h, d in keys]
