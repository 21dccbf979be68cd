"""The engine server's side of `/generate`: which of SGLang's fields it takes, checked strictly.

The types are `wire`'s; this module is the server's policy over them (implemented, accepted,
refused) and the pure functions that turn a request body into `wire.GenerateInput`s and one
sampled sequence into a `wire.GenerateOutput`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from slime.backends.engine.sampler import Generation
from slime.backends.engine.wire import (
    FinishReason,
    GenerateInput,
    GenerateOutput,
    LogprobEntry,
    MetaInfo,
    RequestError,
    SamplingParams,
    parse_finish_reason,
)

__all__ = ["ACCEPTED", "IMPLEMENTED", "REFUSED", "TOP_ACCEPTED", "TOP_IMPLEMENTED", "TOP_REFUSED",
           "RequestError", "build_response", "build_responses", "parse_generate", "parse_sampling_params"]

# SGLang's documented sampling parameters, in three kinds. Implemented: they change what is
# sampled or reported. Accepted: they cannot matter for this engine (no streaming cadence,
# no custom logit processors, fast tokenizers join special tokens without spaces). Refused:
# features this engine does not have, named in the 400.
IMPLEMENTED = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
               "min_new_tokens", "repetition_penalty", "frequency_penalty", "presence_penalty", "n",
               "ignore_eos", "sampling_seed", "skip_special_tokens", "no_stop_trim", "logit_bias")
ACCEPTED = ("spaces_between_special_tokens", "custom_params", "stream_interval")
REFUSED = {"json_schema": "constrained decoding (json_schema)", "regex": "constrained decoding (regex)",
           "ebnf": "constrained decoding (ebnf)", "structural_tag": "constrained decoding (structural_tag)",
           "stop_regex": "stop_regex (a caller's pattern would run on the engine's one worker thread)"}
_SAMPLING_KEYS = {*IMPLEMENTED, *ACCEPTED, *REFUSED}
# Top-level fields of SGLang's GenerateReqInput, the same three kinds.
TOP_IMPLEMENTED = ("input_ids", "text", "sampling_params", "return_logprob", "return_text_in_logprobs",
                   "logprob_start_len", "top_logprobs_num", "rid", "stream")
TOP_ACCEPTED = ("log_metrics", "data_parallel_rank", "priority", "extra_key", "routing_key", "no_logs",
                "background")
TOP_REFUSED = {"image_data": "multimodal input (image_data)", "video_data": "multimodal input (video_data)",
               "audio_data": "multimodal input (audio_data)", "modalities": "multimodal input (modalities)",
               "input_embeds": "input_embeds", "lora_path": "LoRA adapters (lora_path)",
               "lora_id": "LoRA adapters (lora_id)", "custom_logit_processor": "custom_logit_processor",
               "return_hidden_states": "return_hidden_states", "token_ids_logprob": "token_ids_logprob",
               "return_routed_experts": "return_routed_experts (this engine serves dense models)",
               "session_params": "session_params", "bootstrap_host": "disaggregated prefill (bootstrap_host)",
               "bootstrap_port": "disaggregated prefill (bootstrap_port)",
               "bootstrap_room": "disaggregated prefill (bootstrap_room)"}
_TOP_KEYS = {*TOP_IMPLEMENTED, *TOP_ACCEPTED, *TOP_REFUSED}
MAX_N = 64
MAX_STOPS = 32
MAX_RID_CHARS = 512


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _get(raw: dict[str, Any], key: str, default: Any) -> Any:
    # SGLang treats an explicit null as the default (slime sends "stop": null).
    value = raw.get(key)
    return default if value is None else value


def _number(raw: dict[str, Any], key: str, default: float, lo: float, hi: float, where: str, *,
            lo_open: bool = False) -> float:
    value = raw.get(key)
    if value is None:  # absent or null: the default, valid by construction (most keys, most calls)
        return default
    if not _is_num(value) or value > hi or value < lo or (lo_open and value == lo):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise RequestError(f"{where}.{key} must be a finite number in {interval}, got {value!r}")
    return float(value)


def _integer(raw: dict[str, Any], key: str, default: int, lo: int, hi: int, where: str) -> int:
    value = raw.get(key)
    if value is None:
        return default
    if not _is_int(value) or not lo <= value <= hi:
        raise RequestError(f"{where}.{key} must be an integer in [{lo}, {hi}], got {value!r}")
    return int(value)


def _flag(raw: dict[str, Any], key: str, default: bool, where: str) -> bool:
    value = raw.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise RequestError(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _stops(raw: dict[str, Any], where: str) -> tuple[str, ...]:
    value = raw.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or len(stops) > MAX_STOPS or not all(
            isinstance(t, str) and 0 < len(t) <= 256 for t in stops):
        raise RequestError(f"{where}.stop must be a string or a list of at most {MAX_STOPS} non-empty "
                           "strings of at most 256 characters")
    return tuple(stops)


def _logit_bias(raw: dict[str, Any], where: str) -> tuple[tuple[int, float], ...]:
    value = raw.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise RequestError(f"{where}.logit_bias must be an object of token id -> bias")
    out = []
    for key, bias in value.items():
        if not str(key).isdigit() or len(str(key)) > 9 or not _is_num(bias) or abs(bias) > 100:
            raise RequestError(f"{where}.logit_bias must map token ids to finite biases in [-100, 100], "
                               f"got {key!r}: {bias!r}")
        out.append((int(key), float(bias)))
    return tuple(out)


def parse_sampling_params(raw: Any, where: str = "sampling_params") -> SamplingParams:
    """One `sampling_params` object, validated."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise RequestError(f"{where} must be an object, got {type(raw).__name__}")
    unknown = [] if _SAMPLING_KEYS.issuperset(raw) else sorted(str(k)[:64] for k in set(raw) - _SAMPLING_KEYS)
    if unknown:
        raise RequestError(f"{where}: unsupported keys {unknown[:10]}; supported: {sorted(_SAMPLING_KEYS)}")
    # The common body holds no refused key: one C-level set test instead of a lookup per key.
    for key, feature in () if REFUSED.keys().isdisjoint(raw) else REFUSED.items():
        if raw.get(key) is not None:
            raise RequestError(f"{where}.{key}: {feature} is not supported by this engine")
    custom = raw.get("custom_params")
    if custom is not None and not isinstance(custom, dict):
        raise RequestError(f"{where}.custom_params must be an object")
    interval = raw.get("stream_interval")
    if interval is not None and (not _is_int(interval) or interval < 1):
        raise RequestError(f"{where}.stream_interval must be an integer >= 1")
    _flag(raw, "spaces_between_special_tokens", True, where)
    max_new = _integer(raw, "max_new_tokens", 128, 0, 2**31 - 1, where)
    min_new = _integer(raw, "min_new_tokens", 0, 0, max_new, where)
    stop_ids = _get(raw, "stop_token_ids", [])
    if not isinstance(stop_ids, list) or len(stop_ids) > 1024 or not all(_is_int(t) for t in stop_ids):
        raise RequestError(f"{where}.stop_token_ids must be a list of integers, got {stop_ids!r}"[:300])
    top_k = _integer(raw, "top_k", -1, -1, 2**31 - 1, where)
    if top_k == 0:
        raise RequestError(f"{where}.top_k must be -1 (off) or an integer >= 1, got 0")
    seed = raw.get("sampling_seed")
    if seed is not None and (not _is_int(seed) or not 0 <= seed < 2**63):
        raise RequestError(f"{where}.sampling_seed must be an integer in [0, 2^63), got {seed!r}")
    return SamplingParams(
        max_new_tokens=max_new, min_new_tokens=min_new,
        temperature=_number(raw, "temperature", 1.0, 0.0, 1e6, where),
        top_p=_number(raw, "top_p", 1.0, 0.0, 1.0, where, lo_open=True), top_k=top_k,
        min_p=_number(raw, "min_p", 0.0, 0.0, 1.0, where),
        repetition_penalty=_number(raw, "repetition_penalty", 1.0, 0.0, 2.0, where, lo_open=True),
        frequency_penalty=_number(raw, "frequency_penalty", 0.0, -2.0, 2.0, where),
        presence_penalty=_number(raw, "presence_penalty", 0.0, -2.0, 2.0, where),
        stop_token_ids=tuple(stop_ids), stop=_stops(raw, where), logit_bias=_logit_bias(raw, where),
        ignore_eos=_flag(raw, "ignore_eos", False, where), seed=seed,
        n=_integer(raw, "n", 1, 1, MAX_N, where),
        skip_special_tokens=_flag(raw, "skip_special_tokens", True, where),
        no_stop_trim=_flag(raw, "no_stop_trim", False, where))


def _per_item(value: Any, count: int, batched: bool, name: str) -> list[Any]:
    # SGLang lets a batch share one value or give one per prompt.
    if batched and isinstance(value, list) and name != "input_ids":
        if len(value) != count:
            raise RequestError(f"{name} has {len(value)} entries for {count} prompts")
        return value
    return [value] * count


def _check_top(body: dict[str, Any]) -> None:
    unknown = [] if _TOP_KEYS.issuperset(body) else sorted(str(k)[:64] for k in set(body) - _TOP_KEYS)
    if unknown:
        raise RequestError(f"unsupported keys {unknown[:10]}; supported: {sorted(_TOP_KEYS)}")
    for key, feature in () if TOP_REFUSED.keys().isdisjoint(body) else TOP_REFUSED.items():
        if body.get(key) not in (None, False, [], {}):
            raise RequestError(f"{key}: {feature} is not supported by this engine")
    if not isinstance(body.get("stream", False), bool):
        raise RequestError("stream must be true or false")


def _prompts(body: dict[str, Any], tokenize: Callable[[str], list[int]]) -> tuple[list[Any], bool]:
    has_ids, has_text = body.get("input_ids") is not None, body.get("text") is not None
    if has_ids == has_text:
        raise RequestError("send exactly one of input_ids and text")
    if has_text:
        text = body["text"]
        batched = isinstance(text, list)
        texts = text if batched else [text]
        if not texts or not all(isinstance(t, str) for t in texts):
            raise RequestError("text must be a string or a non-empty list of strings")
        return [tokenize(t) for t in texts], batched
    ids = body["input_ids"]
    if not isinstance(ids, list) or not ids:
        raise RequestError("input_ids must be a non-empty list of token ids or of lists of them")
    batched = isinstance(ids[0], list)
    prompts = ids if batched else [ids]
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p or not all(_is_int(t) for t in p):
            where = f"input_ids[{i}]" if batched else "input_ids"
            raise RequestError(f"{where} must be a non-empty list of integers")
    return prompts, batched


def parse_generate(body: Any, tokenize: Callable[[str], list[int]]) -> tuple[list[GenerateInput], bool]:
    """(requests, batched) of a `/generate` body; `tokenize` turns `text` into ids."""
    if not isinstance(body, dict):
        raise RequestError("the body must be a JSON object")
    _check_top(body)
    prompts, batched = _prompts(body, tokenize)
    count = len(prompts)
    raw_params = _per_item(body.get("sampling_params"), count, batched, "sampling_params")
    logprob = _per_item(body.get("return_logprob", False), count, batched, "return_logprob")
    start_len = _per_item(body.get("logprob_start_len"), count, batched, "logprob_start_len")
    top_n = _per_item(body.get("top_logprobs_num"), count, batched, "top_logprobs_num")
    rids = _per_item(body.get("rid"), count, batched, "rid")
    with_text = body.get("return_text_in_logprobs", False)
    if not isinstance(with_text, bool):
        raise RequestError("return_text_in_logprobs must be true or false")
    out = []
    for i in range(count):
        where = f"sampling_params[{i}]" if batched and isinstance(body.get("sampling_params"), list) \
            else "sampling_params"
        params = parse_sampling_params(raw_params[i], where)
        if not isinstance(logprob[i], bool):
            raise RequestError("return_logprob must be true or false")
        start = -1 if start_len[i] is None else start_len[i]
        if not _is_int(start) or start < -1:
            raise RequestError(f"logprob_start_len must be an integer >= -1, got {start!r}")
        top = 0 if top_n[i] is None else top_n[i]
        if not _is_int(top) or not 0 <= top <= 20:
            raise RequestError(f"top_logprobs_num must be an integer in [0, 20], got {top!r}")
        rid = rids[i]
        if rid is not None and (not isinstance(rid, (str, int)) or isinstance(rid, bool)
                                or len(str(rid)) > MAX_RID_CHARS):
            raise RequestError(f"rid must be a string of at most {MAX_RID_CHARS} characters")
        # Log-probs are reported only when asked for, as SGLang does.
        out.append(GenerateInput(input_ids=tuple(prompts[i]), params=params, return_logprob=logprob[i],
                                 logprob_start_len=start if logprob[i] else -1,
                                 top_logprobs_num=top if logprob[i] else 0,
                                 return_text_in_logprobs=with_text, rid=None if rid is None else str(rid)))
    return out, batched


def _entries(pairs: Sequence[tuple[float | None, int]], decode: Callable[[Sequence[int], bool], str],
             with_text: bool) -> tuple[LogprobEntry, ...]:
    return tuple((lp, tok, decode([tok], False) if with_text else None) for lp, tok in pairs)


def build_response(req: GenerateInput, gen: Generation, *, weight_version: str, latency_s: float,
                   decode: Callable[[Sequence[int], bool], str]) -> GenerateOutput:
    """One sample's answer as SGLang's `/generate` returns it (`.to_json()` is the body)."""
    with_text = req.return_text_in_logprobs
    report: dict[str, Any] = {}
    if req.return_logprob:
        report["output_token_logprobs"] = _entries(list(zip(gen.logprobs, gen.output_ids, strict=True)),
                                                   decode, with_text)
        if req.top_logprobs_num > 0:
            report["output_top_logprobs"] = tuple(_entries(top, decode, with_text) for top in gen.output_top)
        if req.logprob_start_len >= 0:
            shown = req.input_ids[min(req.logprob_start_len, len(req.input_ids)):]
            report["input_token_logprobs"] = _entries(list(zip(gen.input_logprobs, shown, strict=True)),
                                                      decode, with_text)
            if req.top_logprobs_num > 0:
                report["input_top_logprobs"] = tuple(None if top is None else _entries(top, decode, with_text)
                                                     for top in gen.input_top)
    finish: FinishReason | None = parse_finish_reason(gen.finish_reason) if gen.finish_reason else None
    meta = MetaInfo(id=req.rid, finish_reason=finish, prompt_tokens=len(req.input_ids),
                    completion_tokens=len(gen.output_ids), cached_tokens=0, weight_version=weight_version,
                    e2e_latency=latency_s, **report)
    matched = gen.finish_reason.get("matched")
    ids = list(gen.output_ids)
    trim = not req.params.no_stop_trim
    if trim and isinstance(matched, int) and ids and ids[-1] == matched:
        ids = ids[:-1]  # the matched stop token's text is trimmed from `text` (not from output_ids)
    text = decode(ids, req.params.skip_special_tokens)
    if trim and isinstance(matched, str) and matched in text:
        text = text[:text.index(matched)]
    return GenerateOutput(text=text, output_ids=tuple(gen.output_ids), meta_info=meta)


def build_responses(prompts: Sequence[GenerateInput], gens: Sequence[Generation], *, weight_version: str,
                    latency_s: float, decode: Callable[[Sequence[int], bool], str]) -> list[GenerateOutput]:
    """The answers of one call: `n` per prompt, following each other, as SGLang lists them."""
    out: list[GenerateOutput] = []
    at = 0
    for p in prompts:
        out += [build_response(p, g, weight_version=weight_version, latency_s=latency_s, decode=decode)
                for g in gens[at:at + p.params.n]]
        at += p.params.n
    if at != len(gens):
        raise ValueError(f"{len(gens)} generations for {at} sequences")
    return out
