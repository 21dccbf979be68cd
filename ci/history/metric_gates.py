"""Metric gates: an e2e entry's metrics judged against its trusted history on the same hardware.

Pure: the run's points and the history's rows in, one verdict per gate out. A gate with
too little history is inactive and says so; a regression is one line naming the metric,
the step, the value and the baseline (mean ± σ, n).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ci.history.store import MetricRow
from ci.registry.loader import REGISTRY
from ci.registry.model import MetricGate
from ci.results import MetricPoint

Status = Literal["pass", "fail", "inactive", "error"]


@dataclass(frozen=True, kw_only=True)
class Verdict:
    gate: MetricGate
    status: Status
    line: str


def _steps(gate: MetricGate, present: Sequence[int]) -> list[int]:
    if gate.steps == "last":
        return [max(present)]
    if gate.steps == "all":
        return sorted(present)
    return list(gate.steps)


def _allowed(gate: MetricGate, mean: float, sd: float) -> float:
    if gate.rule == "sigma":
        return max(gate.k * sd, gate.floor)
    return gate.tolerance * abs(mean)


def judge(entry_id: str, gate: MetricGate, points: Iterable[MetricPoint], history: Iterable[MetricRow],
          *, hardware: str, registry: str = REGISTRY) -> Verdict:
    """One gate on one run of one entry (`registry`: the file that declares the gate)."""
    mine = {p.step: p.value for p in points if p.name == gate.metric}
    if not mine:
        return Verdict(gate=gate, status="error", line=(
            f"metric gate: {entry_id} wrote no metric {gate.metric!r}; fix its gate in {registry}"))
    steps = _steps(gate, sorted(mine))
    missing = [s for s in steps if s not in mine]
    if missing:
        return Verdict(gate=gate, status="error", line=(
            f"metric gate: {entry_id} wrote {gate.metric!r} but not at step(s) "
            f"{', '.join(map(str, missing))} (steps {min(mine)}..{max(mine)}); fix its gate in {registry}"))
    if gate.rule == "absolute":
        for s in steps:
            v = mine[s]
            if (gate.low is not None and v < gate.low) or (gate.high is not None and v > gate.high):
                return Verdict(gate=gate, status="fail", line=(
                    f"metric gate: {gate.metric} at step {s} = {v:.6g}, outside "
                    f"[{gate.low if gate.low is not None else '-inf'}, "
                    f"{gate.high if gate.high is not None else 'inf'}]"))
        return Verdict(gate=gate, status="pass", line=f"metric gate {gate.metric}: within bounds")
    base: dict[int, dict[str, float]] = defaultdict(dict)
    for row in history:
        if row.name == gate.metric:
            base[row.step][row.run_uid] = row.value
    n = min((len(base.get(s, {})) for s in steps), default=0)
    if n < gate.min_history:
        return Verdict(gate=gate, status="inactive", line=(
            f"metric gate {gate.metric} ({entry_id}): inactive, {n} trusted run(s) on {hardware} "
            f"(needs {gate.min_history})"))
    worst: tuple[float, str] | None = None
    for s in steps:
        values = list(base[s].values())
        mean = statistics.fmean(values)
        sd = statistics.stdev(values) if len(values) > 1 else 0.0
        v = mine[s]
        allowed = _allowed(gate, mean, sd)
        if not math.isfinite(v) or abs(v - mean) > allowed:
            excess = abs(v - mean) - allowed if math.isfinite(v) else math.inf
            rule = (f"{gate.k:g}σ" + (f", floor {gate.floor:g}" if gate.floor else "")
                    if gate.rule == "sigma" else f"±{gate.tolerance:.0%}")
            line = (f"metric gate: {gate.metric} at step {s} = {v:.6g}, baseline {mean:.6g} ± {sd:.3g} "
                    f"(n={len(values)}, {hardware}; allowed {rule})")
            if worst is None or excess > worst[0]:
                worst = (excess, line)
    if worst is not None:
        return Verdict(gate=gate, status="fail", line=worst[1])
    return Verdict(gate=gate, status="pass", line=f"metric gate {gate.metric}: within baseline (n={n})")
