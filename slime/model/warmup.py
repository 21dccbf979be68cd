"""A short supervised warm-up, so the RL run starts from a policy that is right some of the time.

A randomly initialised model never answers the task (reward 0: nothing for RL to reinforce); a
fully trained one always does (reward 1: nothing to improve). A few steps of cross entropy on
the answers land in between. Single process, CPU, deterministic for a seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from slime.model.arith_data import read_jsonl


@dataclass(frozen=True, kw_only=True)
class WarmUpResult:
    """What the warm-up did: where it saved the model and the loss before and after."""

    model_dir: Path
    steps: int
    first_loss: float
    last_loss: float


def _records(data: str | Path | Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return read_jsonl(data) if isinstance(data, (str, Path)) else list(data)


def _encode(tokenizer: Any, rec: dict[str, Any]) -> tuple[list[int], list[int]]:
    """`<bos> prompt answer <eos>` and its labels: -100 except on the answer and `<eos>`."""
    prompt = list(tokenizer(rec["prompt"]).input_ids)
    answer = [*tokenizer(str(rec["label"]), add_special_tokens=False).input_ids, tokenizer.eos_token_id]
    return prompt + answer, [-100] * len(prompt) + answer


def _batch(tokenizer: Any, encoded: Sequence[tuple[list[int], list[int]]]) -> tuple[
        torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded rows, labels, attention mask and position ids."""
    rows, labels = [r for r, _ in encoded], [lb for _, lb in encoded]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, :len(r)] = torch.tensor(r)
        lab[i, :len(lb)] = torch.tensor(lb)
        mask[i, :len(r)] = 1
    return ids, mask, lab, mask.cumsum(-1) - 1


def warm_up(model_dir: str | Path, data: str | Path | Sequence[dict[str, Any]], *, steps: int, seed: int,
            lr: float = 3e-3, batch_size: int = 32, out_dir: str | Path | None = None) -> WarmUpResult:
    """Train `steps` Adam steps on the answers of `data` (JSONL path or records); save to `out_dir`.

    `out_dir` defaults to `model_dir` (overwritten in place, tokenizer included).
    """
    records = _records(data)
    if not records:
        raise ValueError("warm_up needs at least one record")
    with _one_thread():
        return _warm_up(model_dir, records, steps=steps, seed=seed, lr=lr, batch_size=batch_size,
                        out_dir=out_dir)


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    # A model this small gains nothing from intra-op threads, and on a busy 2-core machine two
    # threads spinning on each other make a step 20x slower than one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _warm_up(model_dir: str | Path, records: list[dict[str, Any]], *, steps: int, seed: int, lr: float,
             batch_size: int, out_dir: str | Path | None) -> WarmUpResult:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    encoded = [_encode(tokenizer, rec) for rec in records]
    losses = []
    for _ in range(steps):
        pick = torch.randint(len(records), (min(batch_size, len(records)),), generator=gen).tolist()
        ids, mask, labels, positions = _batch(tokenizer, [encoded[i] for i in pick])
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions.clamp(min=0)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    out = Path(out_dir) if out_dir is not None else Path(model_dir)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    if out != Path(model_dir):
        tokenizer.save_pretrained(out)
    return WarmUpResult(model_dir=out, steps=steps, first_loss=losses[0] if losses else float("nan"),
                        last_loss=losses[-1] if losses else float("nan"))


def measure_reward(model_dir: str | Path, data: str | Path | Sequence[dict[str, Any]], *,
                   samples_per_prompt: int = 4, temperature: float = 1.0, max_new_tokens: int = 4,
                   seed: int = 0) -> float:
    """Mean `arith` reward of sampled answers (the engine's sampler, no server) over `data`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    records = _records(data)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with _one_thread():
        return _mean_reward(model, tokenizer, records, samples_per_prompt=samples_per_prompt,
                            temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)


def _mean_reward(model: Any, tokenizer: Any, records: list[dict[str, Any]], *, samples_per_prompt: int,
                 temperature: float, max_new_tokens: int, seed: int) -> float:
    from slime.backends.engine.sampler import SamplingParams, generate
    from slime.rollout.rm_hub import grade

    prompts = [list(tokenizer(r["prompt"]).input_ids) for r in records for _ in range(samples_per_prompt)]
    labels = [r["label"] for r in records for _ in range(samples_per_prompt)]
    params = [SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)] * len(prompts)
    seeds = [seed * 100_003 + i for i in range(len(prompts))]
    gens = generate(model, prompts, params, eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id, seeds=seeds)
    rewards = [grade("arith", tokenizer.decode(list(g.output_ids), skip_special_tokens=True), label)
               for g, label in zip(gens, labels, strict=True)]
    return sum(rewards) / len(rewards)
