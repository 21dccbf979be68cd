"""The learning checks of the RL e2e entries: what each one measures, its threshold, its breaks.

One place for what an entry calls "it learned", so the entry (`check()`) and
`benchmarks/learning.py` (the separation table across seeds, CPU capabilities and planted
breaks) judge with the same function. Importing this module has no side effects.

The thresholds were chosen from that table (`python benchmarks/learning.py`), not from one
run: every healthy run clears them, every broken run misses, with a stated gap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Quantity:
    """One checked number of a run and the bound it must clear."""

    name: str
    read: Callable[[Sequence[Mapping[str, Any]], Mapping[str, float]], float]
    bound: float
    higher_is_better: bool = True

    def passes(self, value: float) -> bool:
        return value >= self.bound if self.higher_is_better else value <= self.bound


def paired_gain(rows: Sequence[Mapping[str, Any]], paired: Mapping[str, float]) -> float:
    """Reward after training minus before, same prompts and seeds."""
    del rows
    return float(paired["paired/gain"])


def value_loss_ratio(rows: Sequence[Mapping[str, Any]], paired: Mapping[str, float], window: int = 5) -> float:
    """Mean value loss of the last `window` steps over that of the first `window`."""
    del paired
    values = [float(r["train/value_loss"]) for r in rows]
    first, last = values[:window], values[-window:]
    return (sum(last) / len(last)) / (sum(first) / len(first))


# Measured (benchmarks/learning.py over benchmarks/learning.jsonl: 5 seeds x default/avx2 for
# every variant, 60 runs, in-process loop at the entry's arguments, which train under warm-up,
# cosine decay to --min-lr and weight decay): healthy GRPO gains +0.068 to +0.162; sign-flipped
# advantages -0.53 to -0.42, zeroed advantages -0.04 to +0.005. The bound sits between the worst
# healthy run and a policy that stalled, about 1.5 paired standard errors (~0.02) from each.
GRPO_GAIN = Quantity(name="paired reward gain", read=paired_gain, bound=0.04)
# PPO's healthy gains measured +0.091 to +0.191, sign-flipped -0.54 to -0.46; its reward bound
# is one paired standard error above a stall. The critic's own check carries PPO: healthy
# value-loss ratios 0.44 to 0.59, while a critic whose step is dropped keeps its zero head, so
# its loss follows the returns (ratios 1.17 to 1.35; its policy still learns, gains +0.09 to +0.18).
PPO_GAIN = Quantity(name="paired reward gain", read=paired_gain, bound=0.02)
PPO_VALUE = Quantity(name="value loss last/first", read=value_loss_ratio, bound=0.8, higher_is_better=False)


def failures(quantities: Sequence[Quantity], rows: Sequence[Mapping[str, Any]],
             paired: Mapping[str, float]) -> list[str]:
    """One line per quantity that misses its bound (empty: the run learned)."""
    out = []
    for q in quantities:
        value = q.read(rows, paired)
        if not q.passes(value):
            op = ">=" if q.higher_is_better else "<="
            out.append(f"{q.name} {value:+.4f}, needs {op} {q.bound:+.4f}")
    return out
