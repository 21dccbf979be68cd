"""The RL loop of `train.py` in one process: for measuring learning checks across many seeds.

An e2e entry runs the loop as a Ray job: engines (HTTP servers) and trainer ranks as actors,
about a minute per run. A learning check needs its healthy and broken values measured over
many seeds and CPU capabilities, which that cost does not allow. This driver runs the same
pieces in one process, without Ray or HTTP:

- the arguments are the entry's own, parsed by `slime.utils.arguments` into the same
  `TrainerConfig` and `RolloutSpec`;
- rollouts go through `slime.rollout.generate.generate_groups`, with one in-process client per
  engine the entry starts (each serves its share of the requests in one batch, as an engine
  does), sampling with the engine's sampler;
- rewards, the dynamic filter and GRPO normalisation through `batch_from_groups`;
- each step is `TrainRank.train` (FSDP2, ppo_utils losses, Adam), then the policy's full state
  dict is loaded into the engines' model (the tensor refit).

What differs: one trainer rank instead of the entry's data-parallel ranks (the step is the
same global loss; the float rounding is not), and no sleep/wake. Learning is judged by
`slime.rollout.paired` on the policy before and after, exactly as the entries judge it.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime.rollout.paired import PairedGain, prompt_rewards


class _Client:
    """What `generate_groups` needs of an engine client, served by a model in this process."""

    def __init__(self, model: Any, tokenizer: Any, version: list[int]) -> None:
        self.model, self.tokenizer, self.version = model, tokenizer, version

    def generate(self, input_ids: Sequence[Sequence[int]], params: Sequence[dict[str, Any]],
                 return_logprob: bool = False) -> list[dict[str, Any]]:
        from slime.backends.engine.sampler import SamplingParams, generate

        sp = [SamplingParams(max_new_tokens=p["max_new_tokens"], temperature=p["temperature"],
                             top_p=p.get("top_p", 1.0), stop_token_ids=tuple(p.get("stop_token_ids", ())))
              for p in params]
        gens = generate(self.model, input_ids, sp, eos_token_id=self.tokenizer.eos_token_id,
                        pad_token_id=self.tokenizer.pad_token_id, seeds=[p["sampling_seed"] for p in params])
        return [{"text": self.tokenizer.decode(list(g.output_ids)), "output_ids": list(g.output_ids),
                 "meta_info": {"weight_version": str(self.version[0]), "finish_reason": g.finish_reason,
                               "output_token_logprobs": [[lp, t] for lp, t in zip(g.logprobs, g.output_ids,
                                                                                   strict=True)]}}
                for g in gens]


@dataclass(frozen=True, kw_only=True)
class InprocRun:
    """One run's per-step metrics and its paired evaluation (None without one)."""

    rows: list[dict[str, Any]]
    paired: PairedGain | None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_loop(argv: Sequence[str], *, model_dir: Path, num_engines: int,
             patch: Callable[[Any], None] | None = None) -> InprocRun:
    """Run the loop for `argv` (the entry's training arguments, paths filled in)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slime.backends.fsdp.config import TrainerConfig
    from slime.backends.fsdp.rank import TrainRank
    from slime.loop import _spec
    from slime.rollout.batch import batch_from_groups
    from slime.rollout.filter import dynamic_filter, trim_to_multiple
    from slime.rollout.generate import generate_groups
    from slime.rollout.source import PromptSource, read_prompts
    from slime.utils.arguments import build_parser

    torch.set_num_threads(1)
    args = build_parser().parse_args(list(argv))
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    args.eos_token_id = tokenizer.eos_token_id
    source = PromptSource(read_prompts(args.prompt_data, prompt_key=args.input_key, label_key=args.label_key),
                          shuffle=args.rollout_shuffle, seed=args.seed)
    rank = TrainRank(rank=0, world_size=1, master_addr="127.0.0.1", master_port=_free_port(),
                     config=TrainerConfig.from_args(args), device="cpu")
    if patch is not None:
        patch(rank)  # a planted break, for the separation table
    engine = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    version = [0]
    clients = [_Client(engine, tokenizer, version) for _ in range(num_engines)]
    k = args.ci_paired_eval_samples
    paired_spec = _spec(args, n=k, temperature=1.0)
    before = prompt_rewards(clients, tokenizer, source.prompts, paired_spec) if k else None
    rows = []
    try:
        for step in range(args.num_rollout):
            groups, weight_version = generate_groups(clients, tokenizer, source.next_batch(args.rollout_batch_size),
                                                     _spec(args, n=args.n_samples_per_prompt), rollout_id=step)
            rewards = [float(s.reward) for g in groups for s in g]  # type: ignore[arg-type]
            if args.dynamic_sampling_filter:
                groups = dynamic_filter(groups).kept
            groups = trim_to_multiple(groups, num_engines)
            batch = batch_from_groups(groups, rollout_id=step, advantage_estimator=args.advantage_estimator,
                                      weight_version=int(weight_version))
            row: dict[str, Any] = dict(rank.train(batch))
            row.update({"step": step, "rollout/reward_all": sum(rewards) / len(rewards)})
            rows.append(row)
            state = rank.full_state_dict()
            assert state is not None
            engine.load_state_dict(state)
            version[0] = rank.get_version()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    paired = None
    if before is not None:
        after = prompt_rewards(clients, tokenizer, source.prompts, paired_spec)
        paired = PairedGain.of(before, after, k)
    return InprocRun(rows=rows, paired=paired)
