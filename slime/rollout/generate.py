"""One rollout over HTTP: prompts → `/generate` on the engines → graded `Sample` groups.

The engines speak SGLang's native API, so this works against our engine or a real SGLang
server alike. Requests are split round-robin over the engines, one batched `/generate` call
per engine, sent in parallel. Each sequence carries its own `sampling_seed`, derived from
the run seed, rollout id and position, so a rollout is reproducible whatever engine serves it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from slime.backends.engine.wire import (
    EngineReplyError,
    EngineUnavailable,
    GenerateOutput,
    SamplingParams,
    parse_outputs,
)
from slime.rollout.rm_hub import grade
from slime.rollout.source import Prompt
from slime.utils.types import Sample


@dataclass(frozen=True, kw_only=True)
class RolloutSpec:
    """How to sample one rollout."""

    n_samples_per_prompt: int
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    rm_type: str = "arith"
    seed: int = 0


def sample_seed(run_seed: int, rollout_id: int, position: int) -> int:
    """A distinct, reproducible seed per sequence of a run."""
    return (run_seed * 1_000_003 + rollout_id * 10_007 + position) % (2**31 - 1)


def _split(n: int, parts: int) -> list[list[int]]:
    return [list(range(p, n, parts)) for p in range(parts)]


# Engines one rollout may replace before it gives up (fault tolerance).
MAX_RETRIES = 2


@dataclass(frozen=True, kw_only=True)
class Job:
    """One sequence of the rollout: its prompt group and what is sent for it."""

    group: int
    input_ids: list[int]
    params: SamplingParams


def plan_jobs(tokenizer: Any, prompts: Sequence[Prompt], spec: RolloutSpec, rollout_id: int) -> list[Job]:
    """`n_samples_per_prompt` sequences per prompt, group after group, each with its own seed."""
    prompt_ids = [list(tokenizer(p.text)["input_ids"]) for p in prompts]
    groups = [g for g in range(len(prompts)) for _ in range(spec.n_samples_per_prompt)]
    return [Job(group=g, input_ids=prompt_ids[g], params=SamplingParams(
        max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, top_p=spec.top_p,
        stop_token_ids=spec.stop_token_ids, seed=sample_seed(spec.seed, rollout_id, pos)))
        for pos, g in enumerate(groups)]


def _call_engine(client: Any, jobs: Sequence[Job], recover: Callable[..., Any] | None,
                 ) -> list[GenerateOutput]:
    """One batched `/generate` of `jobs`; an engine that stops answering is replaced and asked again."""
    if not jobs:
        return []
    for attempt in range(MAX_RETRIES + 1):
        try:
            out = client.generate([j.input_ids for j in jobs], [j.params.to_json() for j in jobs],
                                  return_logprob=True)
            return parse_outputs(out, len(jobs))
        except EngineUnavailable:
            if recover is None or attempt == MAX_RETRIES:
                raise
            client = recover(client, requests=len(jobs))
    raise AssertionError("unreachable")


def sample_all(clients: Sequence[Any], jobs: Sequence[Job], recover: Callable[..., Any] | None,
               ) -> list[GenerateOutput]:
    """Every job's answer, in job order: jobs dealt round-robin, one call per engine, in parallel."""
    shares = _split(len(jobs), len(clients))
    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        answers = list(pool.map(lambda e: _call_engine(clients[e], [jobs[j] for j in shares[e]], recover),
                                range(len(clients))))
    results: dict[int, GenerateOutput] = {}
    for engine, mine in enumerate(shares):
        results.update(zip(mine, answers[engine], strict=True))
    return [results[j] for j in range(len(jobs))]


def one_weight_version(answers: Sequence[GenerateOutput], rollout_id: int) -> str:
    """The weight version every answer reports; a rollout mixing versions (or lacking one) is refused."""
    versions = {a.meta_info.weight_version for a in answers}
    if None in versions:
        raise EngineReplyError(f"rollout {rollout_id}: an engine answer has no meta_info.weight_version")
    if len(versions) != 1:
        raise RuntimeError(f"rollout {rollout_id} mixes engine weight versions {sorted(map(str, versions))}")
    return str(versions.pop())


def graded_groups(tokenizer: Any, prompts: Sequence[Prompt], jobs: Sequence[Job],
                  answers: Sequence[GenerateOutput], spec: RolloutSpec) -> list[list[Sample]]:
    """Each answer as a `Sample` of its prompt's group, rewarded by `spec.rm_type`."""
    groups: list[list[Sample]] = [[] for _ in prompts]
    for j, (job, answer) in enumerate(zip(jobs, answers, strict=True)):
        prompt = prompts[job.group]
        out_ids = list(answer.output_ids)
        text = tokenizer.decode(out_ids, skip_special_tokens=True)
        sample = Sample(group_index=job.group, index=j, prompt=prompt.text, tokens=job.input_ids + out_ids,
                        response=text, response_length=len(out_ids), label=prompt.label,
                        loss_mask=[1] * len(out_ids), rollout_log_probs=list(answer.logprobs),
                        weight_versions=[str(answer.meta_info.weight_version)])
        sample.apply_finish_reason(answer.finish_kind)
        sample.reward = grade(spec.rm_type, text, prompt.label)
        groups[job.group].append(sample)
    return groups


def generate_groups(clients: Sequence[Any], tokenizer: Any, prompts: Sequence[Prompt], spec: RolloutSpec,
                    *, rollout_id: int, recover: Callable[..., Any] | None = None,
                    ) -> tuple[list[list[Sample]], str]:
    """Sample `n_samples_per_prompt` responses per prompt, grade them; returns (groups, weight version).

    Every answer must report the same weight version: a rollout mixing versions would be
    trained as if it came from one policy. With `recover(client, requests=n)` (fault
    tolerance), an engine that stops answering is replaced by the client it returns and its
    requests are sent again; their seeds make the retried samples the ones it would have given.
    """
    if not clients:
        raise ValueError("no rollout engines to generate with")
    jobs = plan_jobs(tokenizer, prompts, spec, rollout_id)
    answers = sample_all(clients, jobs, recover)
    version = one_weight_version(answers, rollout_id)
    return graded_groups(tokenizer, prompts, jobs, answers, spec), version
