"""An agent rollout on the CPU, end to end: SDK agents in a sandbox → adapter → samples → reward."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from _checks import assert_sample_is_chain
from _engine import calculator_policy
from _servers import Stack, running_stack

from slime.agent.rollout import (
    AgentTask,
    Episode,
    Harness,
    generate_rollout,
    run_episode,
    training_samples,
)
from slime.agent.sandbox import LocalSandbox, SpawnGate
from slime.utils.types import Sample, Status

NUM_GPUS = 0
AGENT = Path(__file__).with_name("_calc_agent.py")
REPO = Path(__file__).resolve().parents[2]


def agent_command() -> str:
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(AGENT))}"


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "SYSTEMROOT", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    # The agent must reach only the loopback adapter.
    env |= {"NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost", "PYTHONPATH": str(REPO)}
    return env


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with running_stack(calculator_policy) as s:
        yield s


def test_rollout_groups_samples_and_rewards(stack: Stack, tmp_path: Path) -> None:
    tasks = [
        AgentTask(prompt="Please compute 17*23 exactly.", label="391"),
        # The policy answers 7*8 correctly; the reference says otherwise, so it scores 0.
        AgentTask(prompt="Please compute 7*8 for the table.", label="54"),
    ]
    before = len(stack.engine.calls)
    groups = stack.run(
        generate_rollout(
            tasks,
            n_samples_per_task=2,
            harness=Harness(
                manager=stack.manager,
                adapter_url=stack.adapter_url,
                sandbox=LocalSandbox(tmp_path),
                command=agent_command(),
                gate=SpawnGate(limit=2),
                budget_s=60,
                env=base_env(),
            ),
        ),
        timeout=90,
    )
    assert [[e.task for e in g] for g in groups] == [[tasks[0]] * 2, [tasks[1]] * 2]
    for group, answer, reward in zip(groups, ["391", "56"], [1.0, 0.0], strict=True):
        for episode in group:
            assert episode.result.done and episode.result.returncode == 0, episode.result.stderr
            assert episode.result.stdout.strip() == f"The answer is {answer}."
            assert episode.reward == reward
            assert episode.drifts == 0
            (sample,) = episode.samples
            assert sample.reward == reward
            assert sample.status == "completed"
            assert sample.metadata["label"] == episode.task.label
            assert not stack.manager.has_session(episode.session_id)  # closed after collection
    # Every engine call belongs to exactly one sample's chain, each as generated.
    calls = stack.engine.calls[before:]
    assert len(calls) == 8
    samples = [s for g in groups for e in g for s in e.samples]
    # The policy is deterministic: both episodes of a task made the same two calls.
    distinct = {(c.prompt_ids, c.output_ids): c for c in calls}
    assert len(distinct) == 4
    for sample in samples:
        chain = [c for (p, o), c in distinct.items() if sample.tokens[: len(p) + len(o)] == (*p, *o)]
        assert len(chain) == 2
        assert_sample_is_chain(sample, sorted(chain, key=lambda c: len(c.prompt_ids)))
    # What training receives: slime Samples, grouped per task, rewards attached.
    batch = training_samples(groups, stack.engine.tokenizer)
    assert [[s.group_index for s in g] for g in batch] == [[0, 0], [1, 1]]
    assert [s.index for g in batch for s in g] == [0, 1, 2, 3]
    assert [[s.reward for s in g] for g in batch] == [[1.0, 1.0], [0.0, 0.0]]
    first = batch[0][0]
    assert first.status is Status.COMPLETED
    assert first.label == "391"
    assert first.tokens == list(samples[0].tokens)
    assert first.loss_mask == list(samples[0].loss_mask)
    assert first.rollout_log_probs == list(samples[0].rollout_log_probs)
    assert first.prompt_length == samples[0].prompt_length
    assert first.response.endswith("The answer is 391.<|im_end|>")
    assert "<tool_response>\n391\n</tool_response>" in first.response
    assert Sample.from_dict(first.to_dict()) == first


# One chat turn with nothing but bash (its /dev/tcp), so the agent starts in milliseconds
# and the turn lands well inside a short budget even on a loaded machine.
BASH_TURN = r"""
hp=${OPENAI_BASE_URL#http://}; hp=${hp%%/*}
body='{"messages": [{"role": "user", "content": "hello"}]}'
exec 3<>"/dev/tcp/${hp%:*}/${hp#*:}"
printf 'POST /v1/chat/completions HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s' \
  "$hp" "$OPENAI_API_KEY" "${#body}" "$body" >&3
head -c 12 <&3 | grep -q ' 200'
"""


def run_shell_episode(stack: Stack, tmp_path: Path, command: str, budget_s: float) -> Episode:
    return stack.run(
        run_episode(
            AgentTask(prompt="Please compute 1+1.", label="2"),
            Harness(
                manager=stack.manager,
                adapter_url=stack.adapter_url,
                sandbox=LocalSandbox(tmp_path),
                command=command,
                gate=SpawnGate(),
                budget_s=budget_s,
                env=base_env(),
            ),
        ),
        timeout=30,
    )


def test_agent_over_budget_scores_zero_and_is_aborted(stack: Stack, tmp_path: Path) -> None:
    # One real turn through the adapter, then the agent hangs past its budget.
    episode = run_shell_episode(stack, tmp_path, f"{BASH_TURN.strip()} && sleep 30", budget_s=2)
    assert episode.result.timed_out and not episode.result.done
    assert episode.reward == 0.0
    (sample,) = episode.samples
    assert sample.status == "aborted"
    assert sample.reward == 0.0


def test_failing_agent_scores_zero(stack: Stack, tmp_path: Path) -> None:
    episode = run_shell_episode(stack, tmp_path, "echo cannot start >&2; exit 4", budget_s=10)
    assert episode.result.done and episode.result.returncode == 4
    assert episode.result.stderr == "cannot start\n"
    assert episode.reward == 0.0
    assert episode.samples == ()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
