"""Batched sampling with a KV cache: left-padded prompts, one HF forward per new token.

Log-probs are those of the *unmodified* model distribution (temperature 1, no top-p/top-k),
`log_softmax(logits)[token]`, whatever sampling parameters chose the token: the quantity the
trainer recomputes. Each request draws its randomness from its own `torch.Generator` seeded
with its `seed`, so a request's tokens do not depend on which other requests share its batch.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from slime.backends.engine.wire import SamplingParams

__all__ = ["NO_REPORT", "Generation", "Report", "SamplingParams", "generate", "left_pad"]


# What an answer reports beyond the draw, per sequence: prompt log-probs from this position
# (-1: none) and the top-N alternatives of every reported position (0: none).
Report = tuple[int, int]
NO_REPORT: Report = (-1, 0)

TopLogprobs = tuple[tuple[float, int], ...]
PromptReport = tuple[tuple[float | None, ...], tuple[TopLogprobs | None, ...]]


@dataclass(frozen=True, kw_only=True)
class Generation:
    """One request's output: the new tokens (a matched stop token included) and their log-probs."""

    output_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    # {"type": "stop", "matched": id | str} | {"type": "length", "length": n}
    finish_reason: dict[str, object]
    output_top: tuple[TopLogprobs, ...] = ()  # per output token, when top_logprobs_num > 0
    input_logprobs: tuple[float | None, ...] = ()  # from logprob_start_len; the first prompt token has none
    input_top: tuple[TopLogprobs | None, ...] = ()


def _filter_logits(logits: torch.Tensor, temperature: float, top_p: float, top_k: int,
                   min_p: float = 0.0) -> torch.Tensor:
    """Tempered logits with everything outside top-k / the top-p nucleus / min-p set to -inf (one row)."""
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
    if min_p > 0.0:
        probs = torch.softmax(scaled, dim=-1)
        scaled = scaled.masked_fill(probs < min_p * probs.max(), float("-inf"))
    return scaled


def _adjust(logits: torch.Tensor, params: SamplingParams, generated: Sequence[int],
            stop_ids: set[int]) -> torch.Tensor:
    """Logit bias, penalties and the min-new-tokens stop mask applied to one row."""
    out = logits
    if params.logit_bias:
        out = out.clone()
        for token, bias in params.logit_bias:
            out[token] += bias
    penalised = params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty
    if generated and penalised:
        ids = torch.tensor(sorted(set(generated)), device=out.device)
        counts = torch.tensor([generated.count(int(t)) for t in ids], dtype=out.dtype, device=out.device)
        seen = out[ids]
        if params.repetition_penalty != 1.0:
            # CTRL's penalty: a seen token's logit moves toward less likely, whatever its sign.
            seen = torch.where(seen > 0, seen / params.repetition_penalty, seen * params.repetition_penalty)
        seen = seen - params.frequency_penalty * counts - params.presence_penalty
        out = out.clone() if out is logits else out
        out[ids] = seen
    if len(generated) < params.min_new_tokens and stop_ids:
        out = out.clone() if out is logits else out
        out[list(stop_ids)] = float("-inf")
    return out


def _draw(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    if params.temperature == 0.0:
        return int(torch.argmax(logits))
    filtered = _filter_logits(logits, params.temperature, params.top_p, params.top_k, params.min_p)
    probs = torch.softmax(filtered, dim=-1)
    # Exponential race: argmax p_i / E_i, E_i ~ Exp(1), picks i with probability p_i.
    noise = torch.empty(probs.shape, dtype=torch.float32).exponential_(generator=generator)
    return int(torch.argmax(probs.cpu() / noise))


def _plain(params: SamplingParams, generated: Sequence[int], stop_ids: set[int], vocab: int) -> bool:
    """True when a row's draw is its tempered distribution alone: `_adjust` and
    `_filter_logits` would leave it as it is (no bias, penalty, stop mask or truncation)."""
    return (not params.logit_bias and params.repetition_penalty == 1.0 and not params.frequency_penalty
            and not params.presence_penalty and not (len(generated) < params.min_new_tokens and stop_ids)
            and not 0 < params.top_k < vocab and params.top_p >= 1.0 and params.min_p <= 0.0)


def _draw_plain(logits: torch.Tensor, rows: Sequence[int], params: Sequence[SamplingParams],
                generators: Sequence[torch.Generator]) -> dict[int, int]:
    """Row -> the token `_draw` picks, for `_plain` rows, in a few batched ops instead of a
    handful per row (per-row ops were most of a batch's CPU time).

    The same operations on the same values as `_draw`: each row's softmax and argmax are
    computed alone even inside a 2-D tensor, and each row's noise comes from its own
    generator, so a row draws exactly what it draws alone.
    """
    drawn: dict[int, int] = {}
    greedy = [r for r in rows if params[r].temperature == 0.0]
    if greedy:
        drawn.update(zip(greedy, torch.argmax(logits[greedy], dim=-1).tolist(), strict=True))
    sampled = [r for r in rows if params[r].temperature != 0.0]
    if sampled:
        scaled = logits[sampled]
        temps = torch.tensor([params[r].temperature for r in sampled], dtype=scaled.dtype,
                             device=scaled.device)
        probs = torch.softmax(scaled / temps.unsqueeze(1), dim=-1).cpu()
        noise = torch.empty(probs.shape, dtype=torch.float32)
        for i, r in enumerate(sampled):
            noise[i].exponential_(generator=generators[r])
        drawn.update(zip(sampled, torch.argmax(probs / noise, dim=-1).tolist(), strict=True))
    return drawn


def _top(row: torch.Tensor, n: int) -> TopLogprobs:
    values, ids = torch.topk(row, min(n, row.numel()))
    return tuple((float(v), int(i)) for v, i in zip(values, ids, strict=True))


def _stop_string(text: str, stops: Sequence[str]) -> str | None:
    return next((s for s in stops if s and s in text), None)


@functools.cache
def _cache_arg(model_class: type) -> str:
    # inspect.signature of a transformers forward (wrapped in several decorators) cost a
    # couple of milliseconds per batch; the answer depends on the class alone.
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


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
             *, eos_token_id: int | None, pad_token_id: int, seeds: Sequence[int],
             decode: Callable[[Sequence[int]], str] | None = None,
             reports: Sequence[Report] | None = None) -> list[Generation]:
    """Sample every prompt to its stop token or string or its own `max_new_tokens`, in one batch.

    `decode` (ids to text, special tokens kept) is needed only for stop strings; `reports`
    (default: none) says which log-probs beyond the sampled tokens' each sequence reports.
    """
    from transformers import DynamicCache

    if not prompts:
        return []
    reports = [NO_REPORT] * len(prompts) if reports is None else list(reports)
    if not (len(prompts) == len(params) == len(seeds) == len(reports)):
        raise ValueError("prompts, params, seeds and reports must have the same length")
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
    cache_arg = _cache_arg(type(model))
    out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                **{cache_arg: cache})
    logits = out.logits[:, -1, :].float()
    prompt_report = _prompt_logprobs(out.logits, prompts, reports)
    tokens: list[list[int]] = [[] for _ in prompts]
    tops: list[list[TopLogprobs]] = [[] for _ in prompts]
    logps: list[list[float]] = [[] for _ in prompts]
    reasons: list[dict[str, object] | None] = [None] * len(prompts)
    for row, p in enumerate(params):
        if p.max_new_tokens == 0:
            reasons[row] = {"type": "length", "length": 0}
    last_pos = positions[:, -1]
    vocab = logits.shape[-1]
    while any(r is None for r in reasons):
        logprobs = torch.log_softmax(logits, dim=-1).cpu()
        live = [row for row, r in enumerate(reasons) if r is None]
        plain = [row for row in live if _plain(params[row], tokens[row], stops[row], vocab)]
        drawn = _draw_plain(logits, plain, params, generators)
        for row in live:
            if row not in drawn:
                drawn[row] = _draw(_adjust(logits[row], params[row], tokens[row], stops[row]), params[row],
                                   generators[row])
        chosen = [drawn[row] for row in live]
        picked = dict(zip(live, logprobs[live, chosen].tolist(), strict=True))
        step = []
        for row, p in enumerate(params):
            if reasons[row] is not None:
                step.append(pad_token_id)
                continue
            token = drawn[row]
            tokens[row].append(token)
            logps[row].append(picked[row])
            if reports[row][1] > 0:
                tops[row].append(_top(logprobs[row], reports[row][1]))
            matched = _stop_string(decode(tokens[row]), p.stop) if p.stop and decode is not None else None
            if token in stops[row]:
                reasons[row] = {"type": "stop", "matched": token}
            elif matched is not None:
                reasons[row] = {"type": "stop", "matched": matched}
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
    return [Generation(output_ids=tuple(t), logprobs=tuple(lp), finish_reason=r or {}, output_top=tuple(top),
                       input_logprobs=inp[0], input_top=inp[1])
            for t, lp, r, top, inp in zip(tokens, logps, reasons, tops, prompt_report, strict=True)]


def _prompt_logprobs(all_logits: torch.Tensor, prompts: Sequence[Sequence[int]],
                     reports: Sequence[Report]) -> list[PromptReport]:
    """Per row, the log-probs of its prompt tokens from `logprob_start_len` (first token: None)."""
    width = all_logits.shape[1]
    out: list[PromptReport] = []
    for row, (prompt, (start_len, top_n)) in enumerate(zip(prompts, reports, strict=True)):
        if start_len < 0:
            out.append(((), ()))
            continue
        offset = width - len(prompt)  # left padding
        lps: list[float | None] = []
        tops: list[TopLogprobs | None] = []
        for k in range(min(start_len, len(prompt)), len(prompt)):
            if k == 0:
                lps.append(None)
                tops.append(None)
                continue
            # Position k-1 predicts token k.
            row_lp = torch.log_softmax(all_logits[row, offset + k - 1].float(), dim=-1).cpu()
            lps.append(float(row_lp[prompt[k]]))
            tops.append(_top(row_lp, top_n) if top_n > 0 else None)
        out.append((tuple(lps), tuple(tops)))
    return out
