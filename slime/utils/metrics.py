"""Metric reports: each rank records values; reports merge into one across ranks.

A mean is carried as (sum, count) so that merging weights each rank by how
many values it saw — averaging per-rank means would overweight small ranks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

Reduce = Literal["mean", "sum", "max", "min"]


@dataclass(frozen=True, kw_only=True)
class Metric:
    """One metric's running state: `value` is a sum for means and sums."""

    reduce: Reduce
    value: float
    count: int

    def merge(self, other: Metric) -> Metric:
        """Combine two partial states of the same metric."""
        if other.reduce != self.reduce:
            raise ValueError(f"cannot merge a {self.reduce} metric with a {other.reduce} metric")
        if self.reduce in ("mean", "sum"):
            value = self.value + other.value
        elif self.count == 0 or other.count == 0:
            value = self.value if other.count == 0 else other.value
        elif self.reduce == "max":
            value = max(self.value, other.value)
        else:
            value = min(self.value, other.value)
        return Metric(reduce=self.reduce, value=value, count=self.count + other.count)

    @property
    def result(self) -> float:
        """The reduced value (a mean over no values is NaN)."""
        if self.reduce == "mean":
            return self.value / self.count if self.count else float("nan")
        return self.value


@dataclass
class MetricReport:
    """Metrics recorded on one rank."""

    metrics: dict[str, Metric] = field(default_factory=dict)

    def add(self, name: str, value: float, *, reduce: Reduce = "mean", count: int = 1) -> None:
        """Record `value`; for a mean, `value` is the mean of `count` observations."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        total = value * count if reduce == "mean" else value
        incoming = Metric(reduce=reduce, value=float(total), count=count)
        current = self.metrics.get(name)
        self.metrics[name] = incoming if current is None else current.merge(incoming)

    def merge(self, other: MetricReport) -> MetricReport:
        """A new report holding both reports' observations."""
        out = dict(self.metrics)
        for name, metric in other.metrics.items():
            out[name] = metric if name not in out else out[name].merge(metric)
        return MetricReport(metrics=out)

    def results(self) -> dict[str, float]:
        """Name → reduced value, sorted by name."""
        return {name: self.metrics[name].result for name in sorted(self.metrics)}


def aggregate(reports: Iterable[MetricReport]) -> MetricReport:
    """Merge per-rank reports (a metric may be missing on some ranks)."""
    out = MetricReport()
    for report in reports:
        out = out.merge(report)
    return out


def all_reduce_report(report: MetricReport, group: object | None = None) -> MetricReport:
    """Every rank of `group` gets the merge of all ranks' reports (torch.distributed)."""
    import torch.distributed as dist

    world = dist.get_world_size(group)  # type: ignore[arg-type]
    gathered: list[object] = [None] * world
    payload = {n: (m.reduce, m.value, m.count) for n, m in report.metrics.items()}
    dist.all_gather_object(gathered, payload, group=group)
    reports = [
        MetricReport(
            metrics={
                n: Metric(reduce=r, value=v, count=c)
                for n, (r, v, c) in p.items()  # type: ignore[attr-defined]
            }
        )
        for p in gathered
    ]
    return aggregate(reports)
