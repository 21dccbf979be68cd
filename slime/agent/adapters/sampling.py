"""Provider sampling fields → the engine's sampling parameters, validated once for both."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from slime.agent.messages import BadRequest
from slime.backends.engine.wire import SamplingParams


def _number(body: Mapping[str, Any], key: str, default: float, lo: float, hi: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not lo <= value <= hi:
        raise BadRequest(f"'{key}' must be a number in [{lo}, {hi}]", param=key)
    return float(value)


def _stops(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) and s for s in value):
        return tuple(value)
    raise BadRequest(f"'{key}' must be a string or a list of non-empty strings", param=key)


def sampling_params(
    body: Mapping[str, Any],
    *,
    max_tokens_keys: tuple[str, ...],
    stop_key: str,
    default_max_tokens: int,
    stop_token_ids: tuple[int, ...],
) -> SamplingParams:
    """Read temperature, top_p, top_k, penalties, seed, max tokens and stops from a body."""
    max_new = default_max_tokens
    for key in max_tokens_keys:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BadRequest(f"'{key}' must be a positive integer", param=key)
        max_new = value
        break
    top_k = body.get("top_k", -1)
    if isinstance(top_k, bool) or not isinstance(top_k, int) or (top_k < 1 and top_k != -1):
        raise BadRequest("'top_k' must be a positive integer", param="top_k")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("'seed' must be an integer", param="seed")
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=_number(body, "temperature", 1.0, 0.0, 2.0),
        top_p=_number(body, "top_p", 1.0, 0.0, 1.0),
        top_k=top_k,
        stop=_stops(body.get(stop_key), stop_key),
        stop_token_ids=stop_token_ids,
        presence_penalty=_number(body, "presence_penalty", 0.0, -2.0, 2.0),
        frequency_penalty=_number(body, "frequency_penalty", 0.0, -2.0, 2.0),
        seed=seed,
    )
