"""Per-rollout metrics: rewards, lengths, truncation, and how many groups carry a learning signal."""

from __future__ import annotations

from slime.utils.metrics import MetricReport
from slime.utils.types import Sample, Status


def rollout_metrics(groups: list[list[Sample]], *, correct_reward: float = 1.0) -> MetricReport:
    """Metrics of one rollout; merge reports across ranks with `slime.utils.metrics.aggregate`.

    `rollout/zero_std_groups` counts groups whose rewards are all equal: under
    GRPO their advantages are zero and they teach nothing.
    """
    report = MetricReport()
    samples = [s for g in groups for s in g]
    if not samples:
        return report
    rewards = [float(s.reward) for s in samples if isinstance(s.reward, (int, float))]
    if rewards:
        report.add("rollout/reward", sum(rewards) / len(rewards), count=len(rewards))
    lengths = [s.response_length for s in samples]
    report.add("rollout/response_len", sum(lengths) / len(lengths), count=len(lengths))
    report.add("rollout/response_len_max", float(max(lengths)), reduce="max")
    for status in (Status.TRUNCATED, Status.ABORTED):
        hits = sum(s.status == status for s in samples)
        report.add(f"rollout/{status.value}_frac", hits / len(samples), count=len(samples))
    zero_std = 0
    solved = 0
    for g in groups:
        # Rewards may be dicts (unhashable): compare, do not build a set.
        zero_std += all(s.reward == g[0].reward for s in g)
        solved += any(s.reward == correct_reward for s in g)
    report.add("rollout/zero_std_groups", float(zero_std), reduce="sum")
    report.add("rollout/groups", float(len(groups)), reduce="sum")
    report.add("rollout/pass_at_n", solved / len(groups), count=len(groups))
    return report
