"""Dynamic sampling filter: a group whose rewards are all equal has zero advantage everywhere.

GRPO normalises rewards within a group, so such a group adds nothing but cost to a step;
it is dropped, and the counts are reported so a run can see how much it filtered.
"""

from __future__ import annotations

from dataclasses import dataclass

from slime.utils.types import Sample


@dataclass(frozen=True, kw_only=True)
class FilterResult:
    """Groups kept, and how many groups and samples were dropped."""

    kept: list[list[Sample]]
    dropped_groups: int
    dropped_samples: int

    def stats(self) -> dict[str, float]:
        """Counts for the step's metrics."""
        total = len(self.kept) + self.dropped_groups
        return {
            "filter/kept_groups": float(len(self.kept)),
            "filter/dropped_groups": float(self.dropped_groups),
            "filter/dropped_samples": float(self.dropped_samples),
            "filter/dropped_fraction": self.dropped_groups / total if total else 0.0,
        }


def _reward(sample: Sample) -> float:
    if not isinstance(sample.reward, (int, float)):
        raise ValueError(f"sample {sample.index} has reward {sample.reward!r}; grade it before filtering")
    return float(sample.reward)


def keep_group(group: list[Sample]) -> bool:
    """Whether the group's rewards differ (so it carries a learning signal)."""
    rewards = [_reward(s) for s in group]
    return max(rewards) > min(rewards)


def dynamic_filter(groups: list[list[Sample]]) -> FilterResult:
    """Drop every group whose rewards are all equal."""
    kept = [g for g in groups if keep_group(g)]
    dropped = [g for g in groups if not keep_group(g)]
    return FilterResult(kept=kept, dropped_groups=len(dropped),
                        dropped_samples=sum(len(g) for g in dropped))


def trim_to_multiple(groups: list[list[Sample]], dp_size: int) -> list[list[Sample]]:
    """The longest prefix of whole groups whose sample count splits evenly over `dp_size` ranks."""
    for k in range(len(groups), 0, -1):
        if sum(len(g) for g in groups[:k]) % dp_size == 0:
            return groups[:k]
    return []
