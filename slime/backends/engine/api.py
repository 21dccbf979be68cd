"""The wire format of `/generate` (SGLang's names), parsed and built by pure functions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from slime.backends.engine.sampler import Generation, SamplingParams


class RequestError(ValueError):
    """A malformed request body (HTTP 400); the message names the field and what it must be."""


_SAMPLING_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids", "ignore_eos",
                  "sampling_seed", "skip_special_tokens"}
_TOP_KEYS = {"input_ids", "text", "sampling_params", "return_logprob", "return_text_in_logprobs",
             "logprob_start_len", "top_logprobs_num", "rid", "stream"}


@dataclass(frozen=True, kw_only=True)
class ParsedRequest:
    """One sequence of a `/generate` call, validated."""

    input_ids: tuple[int, ...]
    params: SamplingParams
    return_logprob: bool
    return_text_in_logprobs: bool
    skip_special_tokens: bool
    rid: str | None


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_sampling_params(raw: Any, where: str = "sampling_params") -> tuple[SamplingParams, bool]:
    """(params, skip_special_tokens) from one sampling_params object."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = sorted(set(raw) - _SAMPLING_KEYS)
    if unknown:
        raise RequestError(f"{where}: unsupported keys {unknown}; supported: {sorted(_SAMPLING_KEYS)}")
    n = raw.get("max_new_tokens", 128)
    if not _is_int(n) or n < 0:
        raise RequestError(f"{where}.max_new_tokens must be an integer >= 0, got {n!r}")
    temp = raw.get("temperature", 1.0)
    if not _is_num(temp) or temp < 0:
        raise RequestError(f"{where}.temperature must be a number >= 0, got {temp!r}")
    top_p = raw.get("top_p", 1.0)
    if not _is_num(top_p) or not 0 < top_p <= 1:
        raise RequestError(f"{where}.top_p must be in (0, 1], got {top_p!r}")
    top_k = raw.get("top_k", -1)
    if not _is_int(top_k) or (top_k != -1 and top_k < 1):
        raise RequestError(f"{where}.top_k must be -1 (off) or an integer >= 1, got {top_k!r}")
    stops = raw.get("stop_token_ids") or []
    if not isinstance(stops, list) or not all(_is_int(t) for t in stops):
        raise RequestError(f"{where}.stop_token_ids must be a list of integers, got {stops!r}")
    ignore_eos = raw.get("ignore_eos", False)
    skip = raw.get("skip_special_tokens", True)
    for key, value in (("ignore_eos", ignore_eos), ("skip_special_tokens", skip)):
        if not isinstance(value, bool):
            raise RequestError(f"{where}.{key} must be true or false, got {value!r}")
    seed = raw.get("sampling_seed")
    if seed is not None and (not _is_int(seed) or seed < 0):
        raise RequestError(f"{where}.sampling_seed must be an integer >= 0, got {seed!r}")
    params = SamplingParams(max_new_tokens=n, temperature=float(temp), top_p=float(top_p), top_k=top_k,
                            stop_token_ids=tuple(stops), ignore_eos=ignore_eos, seed=seed)
    return params, skip


def _per_item(value: Any, count: int, batched: bool, name: str) -> list[Any]:
    # SGLang lets a batch share one value or give one per prompt.
    if batched and isinstance(value, list) and name != "input_ids":
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def parse_generate(body: Any, tokenize: Callable[[str], list[int]]) -> tuple[list[ParsedRequest], bool]:
    """(requests, batched) of a `/generate` body; `tokenize` turns `text` into ids."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    unknown = sorted(set(body) - _TOP_KEYS)
    if unknown:
        raise RequestError(f"unsupported keys {unknown}; supported: {sorted(_TOP_KEYS)}")
    if body.get("stream"):
        raise RequestError("stream is not supported; send stream=false")
    if body.get("top_logprobs_num", 0) not in (0, None):
        raise RequestError("top_logprobs_num is not supported; send 0")
    if body.get("logprob_start_len", -1) not in (-1, None):
        raise RequestError("only output log-probs are returned; send logprob_start_len=-1 or omit it")
    has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
    if has_ids == has_text:
        raise RequestError("send exactly one of input_ids and text")
    if has_text:
        text = body["text"]
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a non-empty list of strings")
        prompts = [tokenize(t) for t in texts]
    else:
        ids = body["input_ids"]
        if not isinstance(ids, list) or not ids:
            raise RequestError("input_ids must be a non-empty list of token ids or of lists of them")
        batched = isinstance(ids[0], list)
        prompts = ids if batched else [ids]
        for i, p in enumerate(prompts):
            if not isinstance(p, list) or not p or not all(_is_int(t) for t in p):
                where = f"input_ids[{i}]" if batched else "input_ids"
                raise RequestError(f"{where} must be a non-empty list of integers")
    count = len(prompts)
    raw_params = _per_item(body.get("sampling_params"), count, batched, "sampling_params")
    logprob = _per_item(body.get("return_logprob", False), count, batched, "return_logprob")
    rids = _per_item(body.get("rid"), count, batched, "rid")
    with_text = body.get("return_text_in_logprobs", False)
    out = []
    for i in range(count):
        where = f"sampling_params[{i}]" if batched and isinstance(body.get("sampling_params"), list) \
            else "sampling_params"
        params, skip = parse_sampling_params(raw_params[i], where)
        if not isinstance(logprob[i], bool) or not isinstance(with_text, bool):
            raise RequestError("return_logprob and return_text_in_logprobs must be true or false")
        out.append(ParsedRequest(input_ids=tuple(prompts[i]), params=params, return_logprob=logprob[i],
                                 return_text_in_logprobs=with_text, skip_special_tokens=skip,
                                 rid=None if rids[i] is None else str(rids[i])))
    return out, batched


def build_response(req: ParsedRequest, gen: Generation, *, weight_version: str, latency_s: float,
                   decode: Callable[[Sequence[int], bool], str]) -> dict[str, Any]:
    """One request's answer: `text`, `output_ids`, `meta_info` as SGLang's `/generate` returns them."""
    meta: dict[str, Any] = {
        "id": req.rid,
        "finish_reason": gen.finish_reason,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(gen.output_ids),
        "cached_tokens": 0,
        "weight_version": weight_version,
        "e2e_latency": latency_s,
    }
    if req.return_logprob:
        meta["output_token_logprobs"] = [
            [lp, tok, decode([tok], False) if req.return_text_in_logprobs else None]
            for lp, tok in zip(gen.logprobs, gen.output_ids, strict=True)
        ]
    return {"text": decode(gen.output_ids, req.skip_special_tokens), "output_ids": list(gen.output_ids),
            "meta_info": meta}
