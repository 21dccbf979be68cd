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


def generate_groups(clients: Sequence[Any], tokenizer: Any, prompts: Sequence[Prompt], spec: RolloutSpec,
                    *, rollout_id: int, recover: Callable[..., Any] | None = None,
                    ) -> tuple[list[list[Sample]], str]:
    """Sample `n_samples_per_prompt` responses per prompt, grade them; returns (groups, weight version).

    Every answer must report the same weight version: a rollout mixing versions would be
    trained as if it came from one policy. With `recover(client, requests=n)` (fault
    tolerance), an engine that stops answering is replaced by the client it returns and its
    requests are sent again; their seeds make the retried samples the ones it would have given.
    """
    from slime.backends.engine.client import EngineUnavailable

    if not clients:
        raise ValueError("no rollout engines to generate with")
    prompt_ids = [list(tokenizer(p.text)["input_ids"]) for p in prompts]
    jobs = [(g, k) for g in range(len(prompts)) for k in range(spec.n_samples_per_prompt)]
    params = [{"max_new_tokens": spec.max_new_tokens, "temperature": spec.temperature,
               "top_p": spec.top_p, "stop_token_ids": list(spec.stop_token_ids),
               "sampling_seed": sample_seed(spec.seed, rollout_id, pos)} for pos in range(len(jobs))]
    shares = _split(len(jobs), len(clients))

    def call(engine: int) -> list[Any]:
        mine = shares[engine]
        if not mine:
            return []
        client = clients[engine]
        for attempt in range(MAX_RETRIES + 1):
            try:
                out = client.generate([prompt_ids[jobs[j][0]] for j in mine], [params[j] for j in mine],
                                      return_logprob=True)
                return list(out)
            except EngineUnavailable:
                if recover is None or attempt == MAX_RETRIES:
                    raise
                client = recover(client, requests=len(mine))
        raise AssertionError("unreachable")

    with ThreadPoolExecutor(max_workers=len(clients)) as pool:
        answers = list(pool.map(call, range(len(clients))))
    results: dict[int, Any] = {}
    for engine, mine in enumerate(shares):
        results.update(zip(mine, answers[engine], strict=True))
    versions = {str(results[j]["meta_info"]["weight_version"]) for j in range(len(jobs))}
    if len(versions) != 1:
        raise RuntimeError(f"rollout {rollout_id} mixes engine weight versions {sorted(versions)}")
    groups: list[list[Sample]] = [[] for _ in prompts]
    for j, (g, _k) in enumerate(jobs):
        answer = results[j]
        out_ids = [int(t) for t in answer["output_ids"]]
        logprobs = [float(x[0]) for x in answer["meta_info"]["output_token_logprobs"]]
        text = tokenizer.decode(out_ids, skip_special_tokens=True)
        sample = Sample(group_index=g, index=j, prompt=prompts[g].text, tokens=prompt_ids[g] + out_ids,
                        response=text, response_length=len(out_ids), label=prompts[g].label,
                        loss_mask=[1] * len(out_ids), rollout_log_probs=logprobs,
                        weight_versions=[str(answer["meta_info"]["weight_version"])])
        sample.apply_finish_reason(answer["meta_info"]["finish_reason"])
        sample.reward = grade(spec.rm_type, text, prompts[g].label)
        groups[g].append(sample)
    return groups, versions.pop()
