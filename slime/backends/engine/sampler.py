"""Batched sampling with a KV cache: left-padded prompts, one HF forward per new token.

Log-probs are those of the *unmodified* model distribution (temperature 1, no top-p/top-k),
`log_softmax(logits)[token]`, whatever sampling parameters chose the token: the quantity the
trainer recomputes. Each request draws its randomness from its own `torch.Generator` seeded
with its `seed`, so a request's tokens do not depend on which other requests share its batch.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """SGLang's sampling parameters (the subset supported); temperature 0 means greedy."""

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None  # `sampling_seed` on the wire, as SGLang names it


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One request's output: the new tokens (a matched stop token included) and their log-probs."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: dict[str, object]  # {"type": "stop", "matched": id} | {"type": "length", "length": n}


def _filter_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int) -> torch.Tensor:
    """Tempered logits with everything outside top-k / the top-p nucleus set to -inf (one row)."""
    scaled = logits / temperature
    if 0 < top_k < scaled.numel():
        kth = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the mass before it already reaches top_p; the top token always stays.
        drop = (torch.cumsum(probs, dim=-1) - probs) >= top_p
        drop[0] = False
        scaled = scaled.scatter(0, order, sorted_logits.masked_fill(drop, float("-inf")))
    return scaled


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    filtered = _filter_logits(logits, params.temperature, params.top_p, params.top_k)
    probs = torch.softmax(filtered, dim=-1)
    # Exponential race: argmax p_i / E_i, E_i ~ Exp(1), picks i with probability p_i.
    noise = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=generator)
    return int(torch.argmax(probs.cpu() / noise))


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask), both [batch, longest prompt], prompts aligned to the right."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, width - len(prompt):] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt):] = 1
    return ids, mask


@torch.no_grad()
def generate(model: torch.nn.Module, prompts: Sequence[Sequence[int]], params: Sequence[SamplingParams],
             *, eos_token_id: int | None, pad_token_id: int, seeds: Sequence[int]) -> list[Generation]:
    """Sample every prompt to its stop token or its own `max_new_tokens`, in one batch."""
    from transformers import DynamicCache

    if not prompts:
        return []
    if not (len(prompts) == len(params) == len(seeds)):
        raise ValueError("prompts, params and seeds must have the same length")
    device = next(model.parameters()).device
    generators = [torch.Generator().manual_seed(int(s)) for s in seeds]
    stops = [set(p.stop_token_ids) | (set() if p.ignore_eos or eos_token_id is None else {eos_token_id})
             for p in params]
    ids, mask = left_pad(prompts, pad_token_id)
    ids, mask = ids.to(device), mask.to(device)
    # Positions count real tokens only, so a left-padded row sees the positions it would alone.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    # The cache object is filled in place; transformers 5 calls the argument `cache`, 4 `past_key_values`.
    cache = DynamicCache()
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                **{cache_arg: cache})
    logits = out.logits[:, -1, :].float()
    tokens: list[list[int]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    reasons: list[dict[str, object] | None] = [None] * len(prompts)
    for row, p in enumerate(params):
        if p.max_new_tokens == 0:
            reasons[row] = {"type": "length", "length": 0}
    last_pos = positions[:, -1]
    while any(r is None for r in reasons):
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
        step = []
        for row, p in enumerate(params):
            if reasons[row] is not None:
                step.append(pad_token_id)
                continue
            token = _draw(logits[row], p, generators[row])
            tokens[row].append(token)
            logps[row].append(float(logprobs[row, token]))
            if token in stops[row]:
                reasons[row] = {"type": "stop", "matched": token}
            elif len(tokens[row]) >= p.max_new_tokens:
                reasons[row] = {"type": "length", "length": p.max_new_tokens}
            step.append(token)
        if all(r is not None for r in reasons):
            break
        mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=mask.dtype, device=device)], dim=1)
        last_pos = last_pos + 1
        out = model(input_ids=torch.tensor(step, device=device).unsqueeze(1), attention_mask=mask,
                    position_ids=last_pos.unsqueeze(1), use_cache=True, **{cache_arg: cache})
        logits = out.logits[:, -1, :].float()
    return [Generation(output_ids=tuple(t), logprobs=tuple(lp), finish_reason=r or {})
            for t, lp, r in zip(tokens, logps, reasons, strict=True)]
