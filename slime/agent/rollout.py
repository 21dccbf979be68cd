"""An agent rollout: run each task's agent in a sandbox against the adapter, collect samples.

Per episode: open a session, start the agent with its SDKs pointed at the
adapter (the session id is the API key), wait for its done marker within the
budget, score it, and turn every leaf of its turn tree into a sample carrying
that reward. An agent that ran out of budget, or exited non-zero, scores 0 and
its samples are marked aborted so training can drop them.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from slime.agent.sandbox import ExecResult, Sandbox, SpawnGate, exec_and_wait
from slime.agent.tokenizer import Tokenizer
from slime.agent.trajectory import TrajectoryManager, TrajectorySample, Turn
from slime.utils.types import Sample


@dataclass(frozen=True, kw_only=True)
class AgentTask:
    """One task: the prompt the agent receives and the reference answer the reward checks."""

    prompt: str
    label: str


@dataclass(frozen=True, kw_only=True)
class Episode:
    """One agent run and the samples it produced."""

    task: AgentTask
    session_id: str
    result: ExecResult
    reward: float
    samples: tuple[TrajectorySample, ...]
    drifts: int


RewardFn = Callable[[AgentTask, ExecResult, Sequence[Turn]], float]
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def final_number_reward(task: AgentTask, result: ExecResult, turns: Sequence[Turn]) -> float:
    """1.0 when the last number of the policy's last reply equals the label, else 0.0."""
    if not turns:
        return 0.0
    numbers = _NUMBER.findall(turns[-1].response.content)
    return 1.0 if numbers and numbers[-1] == task.label.strip() else 0.0


def agent_env(
    base: Mapping[str, str], *, adapter_url: str, session_id: str, task: AgentTask
) -> dict[str, str]:
    """The environment an unmodified OpenAI/Anthropic SDK agent needs to reach the adapter."""
    return {
        **base,
        "OPENAI_BASE_URL": f"{adapter_url}/v1",
        "OPENAI_API_KEY": session_id,
        "ANTHROPIC_BASE_URL": adapter_url,
        "ANTHROPIC_API_KEY": session_id,
        "OPENAI_AGENTS_DISABLE_TRACING": "1",
        "SLIME_AGENT_TASK": task.prompt,
    }


@dataclass(frozen=True, kw_only=True)
class Harness:
    """Where and how agents run: the adapter they talk to, their sandbox, command and budget."""

    manager: TrajectoryManager
    adapter_url: str
    sandbox: Sandbox
    command: str
    gate: SpawnGate
    budget_s: float
    env: Mapping[str, str]
    reward_fn: RewardFn = final_number_reward


async def run_episode(task: AgentTask, harness: Harness) -> Episode:
    """Run one agent on one task and score its trajectory."""
    h = harness
    sid = h.manager.open_session(task=task.prompt, label=task.label)
    try:
        result = await exec_and_wait(
            h.sandbox,
            h.command,
            env=agent_env(h.env, adapter_url=h.adapter_url, session_id=sid, task=task),
            budget_s=h.budget_s,
            gate=h.gate,
        )
        turns = h.manager.turns(sid)
        ok = result.done and result.returncode == 0
        reward = h.reward_fn(task, result, turns) if ok else 0.0
        samples = h.manager.samples(sid, reward=reward)
        if not ok:
            samples = [dataclasses.replace(s, status="aborted") for s in samples]
        drifts = len(h.manager.drifts(sid))
    finally:
        h.manager.close_session(sid)
    return Episode(
        task=task, session_id=sid, result=result, reward=reward, samples=tuple(samples), drifts=drifts
    )


async def generate_rollout(
    tasks: Sequence[AgentTask], *, n_samples_per_task: int, harness: Harness
) -> list[list[Episode]]:
    """Every task `n_samples_per_task` times, concurrently; one group of episodes per task."""
    runs = [run_episode(task, harness) for task in tasks for _ in range(n_samples_per_task)]
    episodes = await asyncio.gather(*runs)
    return [list(episodes[i : i + n_samples_per_task]) for i in range(0, len(episodes), n_samples_per_task)]


def training_samples(groups: Sequence[Sequence[Episode]], tokenizer: Tokenizer) -> list[list[Sample]]:
    """Rollout groups as slime `Sample`s: one group per task, every leaf of every episode."""
    out: list[list[Sample]] = []
    index = 0
    for g, group in enumerate(groups):
        samples: list[Sample] = []
        for episode in group:
            for leaf in episode.samples:
                samples.append(
                    leaf.to_sample(tokenizer, group_index=g, index=index, label=episode.task.label)
                )
                index += 1
        out.append(samples)
    return out
