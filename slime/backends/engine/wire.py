"""SGLang's `/generate`, typed: the request, its sampling parameters, the answer and its `meta_info`,
and the errors of an engine call. The one model of the wire format, torch-free.

Every side speaks through it: the engine server parses requests into `GenerateInput` and
answers `GenerateOutput.to_json()` (`api.py` holds the server's validation policy); the
trainer's client (`client.py`), the agent tier's client (`slime.agent.engine`), the rollout
and the loop send `SamplingParams.to_json()` bodies and read answers with `parse_output`.
A field added to `/generate` is added here (and, if it changes sampling, in `sampler.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal


# ---- errors ---------------------------------------------------------------------------------
class EngineError(RuntimeError):
    """An engine call failed; the message names the engine (its URL) and what went wrong."""

    status: int | None = None  # the HTTP status, when the engine answered with one


class EngineUnavailable(EngineError):
    """The engine did not answer at all (down, wrong port, timed out)."""


class EngineRequestError(EngineError):
    """The engine answered with an HTTP error; `status` and the server's `message` are kept."""

    def __init__(self, url: str, status: int, message: str) -> None:
        self.url = url
        self.status = status
        self.message = message
        super().__init__(f"engine answered HTTP {status} ({url}): {message}")


class EngineReplyError(EngineError):
    """The engine answered 200 with something that is not a `/generate` answer."""


class RequestError(EngineError, ValueError):
    """A request that does not fit the wire format (the server's 400); the message names the field."""


def error_message(raw: bytes, limit: int = 500) -> str:
    """The `message` of an engine's error body (SGLang's or ours), else the body's text."""
    text = raw.decode("utf-8", errors="replace")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:limit]
    if isinstance(parsed, dict):
        inner = parsed.get("error")
        message = parsed.get("message") or (inner.get("message") if isinstance(inner, dict) else inner)
        if message:
            return str(message)[:limit]
    return text[:limit]


# ---- the request ----------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class SamplingParams:
    """SGLang's `sampling_params` (those this stack implements); temperature 0 means greedy.

    Order per step, as SGLang applies them: logit bias, repetition / frequency / presence
    penalties (over the tokens generated so far), the stop-token mask until `min_new_tokens`,
    then temperature, top-k, top-p and min-p. `n`, `skip_special_tokens` and `no_stop_trim`
    shape the answer, not the draw.
    """

    max_new_tokens: int = 128
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()  # stop strings, matched on the decoded output (special tokens kept)
    min_new_tokens: int = 0
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    ignore_eos: bool = False
    seed: int | None = None  # `sampling_seed` on the wire, as SGLang names it
    n: int = 1
    skip_special_tokens: bool = True
    no_stop_trim: bool = False

    def to_json(self) -> dict[str, Any]:
        """The `sampling_params` object of a request: the draw's knobs always, the rest when set.

        SGLang fills an absent temperature, top-p, top-k or min-p from the model's generation
        config, so those go out even at their defaults: what is trained on is what was asked for.
        """
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _ALWAYS or value != f.default:
                out[_WIRE_NAMES.get(f.name, f.name)] = _to_wire(f.name, value)
        return out


_ALWAYS = ("max_new_tokens", "temperature", "top_p", "top_k", "min_p")
_WIRE_NAMES = {"seed": "sampling_seed"}


def _to_wire(name: str, value: Any) -> Any:
    if name == "logit_bias":
        return {str(token): bias for token, bias in value}
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True, kw_only=True)
class GenerateInput:
    """One prompt of a `/generate` call with what its answer should report."""

    input_ids: tuple[int, ...]
    params: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: bool = True  # SGLang's default is false; `request_body` always sends it
    logprob_start_len: int = -1  # prompt log-probs from this position; -1: none
    top_logprobs_num: int = 0  # the top-N alternatives of every reported position
    return_text_in_logprobs: bool = False
    rid: str | None = None


def request_body(inputs: Sequence[GenerateInput], *, stream: bool = False) -> dict[str, Any]:
    """The JSON body of one `/generate` call: one prompt flat, several as SGLang's batch."""
    if not inputs:
        raise ValueError("a /generate call needs at least one prompt")
    first = inputs[0]
    if any(i.return_text_in_logprobs != first.return_text_in_logprobs for i in inputs):
        raise ValueError("return_text_in_logprobs is one value per /generate call")
    batched = len(inputs) > 1
    body: dict[str, Any] = {
        "input_ids": [list(i.input_ids) for i in inputs] if batched else list(first.input_ids),
        "sampling_params": [i.params.to_json() for i in inputs] if batched else first.params.to_json(),
    }
    for name, default in (("return_logprob", None), ("logprob_start_len", -1), ("top_logprobs_num", 0),
                          ("rid", None)):
        values = [getattr(i, name) for i in inputs]
        if name == "return_logprob" or any(v != default for v in values):
            # A batch shares one value or gives one per prompt.
            body[name] = values[0] if all(v == values[0] for v in values) else values
    if first.return_text_in_logprobs:
        body["return_text_in_logprobs"] = True
    if stream:
        body["stream"] = True
    return body


# ---- the answer -----------------------------------------------------------------------------
# [logprob, token id, token text]: the log-prob is None for a prompt's first token, the text
# None unless `return_text_in_logprobs`.
LogprobEntry = tuple[float | None, int, str | None]
FinishKind = Literal["stop", "length", "abort"]


@dataclass(frozen=True, kw_only=True)
class FinishReason:
    """Why a sequence ended: `{"type": "stop", "matched": id | str}`, `length` or `abort`."""

    type: FinishKind
    matched: int | str | None = None  # stop: the stop token id or stop string that matched
    length: int | None = None  # length: max_new_tokens
    message: str | None = None  # abort: why

    def to_json(self) -> dict[str, Any]:
        """As SGLang writes it."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass(frozen=True, kw_only=True)
class MetaInfo:
    """An answer's `meta_info`; the log-prob lists are present only when asked for (None: absent)."""

    id: str | None = None
    finish_reason: FinishReason | None = None  # None while a stream is still going
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    weight_version: str | None = None
    e2e_latency: float | None = None
    output_token_logprobs: tuple[LogprobEntry, ...] | None = None
    output_top_logprobs: tuple[tuple[LogprobEntry, ...], ...] | None = None
    input_token_logprobs: tuple[LogprobEntry, ...] | None = None
    input_top_logprobs: tuple[tuple[LogprobEntry, ...] | None, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys a real SGLang adds that no one reads

    def to_json(self) -> dict[str, Any]:
        """As SGLang writes it: the fixed keys always, each log-prob list when present."""
        out: dict[str, Any] = {
            "id": self.id,
            "finish_reason": None if self.finish_reason is None else self.finish_reason.to_json(),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "weight_version": self.weight_version,
            "e2e_latency": self.e2e_latency,
        }
        for name in _LOGPROB_KEYS:
            value = getattr(self, name)
            if value is not None:
                out[name] = _lists(value)
        return {**out, **self.extra}


_LOGPROB_KEYS = ("output_token_logprobs", "output_top_logprobs", "input_token_logprobs", "input_top_logprobs")


def _lists(value: Any) -> Any:
    # Entries are flat tuples (or None, or rows of them): one level of recursion at most.
    if isinstance(value, tuple):
        return [list(v) if isinstance(v, tuple) and (not v or not isinstance(v[0], tuple)) else _lists(v)
                for v in value]
    return value


@dataclass(frozen=True, kw_only=True)
class GenerateOutput:
    """One sample's answer: `text`, `output_ids` (a matched stop token included), `meta_info`."""

    text: str
    output_ids: tuple[int, ...]
    meta_info: MetaInfo

    @property
    def logprobs(self) -> tuple[float, ...]:
        """The log-prob of each output token (empty when none were asked for)."""
        return tuple(float(e[0]) for e in self.meta_info.output_token_logprobs or () if e[0] is not None)

    @property
    def finish_kind(self) -> FinishKind | None:
        """`stop`, `length`, `abort`, or None while a stream is still going."""
        reason = self.meta_info.finish_reason
        return None if reason is None else reason.type

    @property
    def matched_stop(self) -> int | str | None:
        """The stop token id or stop string that ended the sequence, if one did."""
        reason = self.meta_info.finish_reason
        return None if reason is None else reason.matched

    def to_json(self) -> dict[str, Any]:
        """The answer object as SGLang's `/generate` returns it."""
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info.to_json()}


def _entry(raw: Any, where: str, *, token: int | None = None, first: bool = False) -> LogprobEntry:
    ok = isinstance(raw, list) and len(raw) >= 2 and isinstance(raw[1], int) and not isinstance(raw[1], bool)
    lp = raw[0] if ok else None
    if ok and lp is None:
        ok = first  # only a prompt's first token has no log-prob
    elif ok:
        ok = isinstance(lp, (int, float)) and not isinstance(lp, bool) and math.isfinite(lp) and lp <= 0
    if not ok or (token is not None and raw[1] != token):
        raise EngineReplyError(f"engine reply has a bad log-prob entry {raw!r}"[:200]
                               + (f" for token {token}" if token is not None else f" in {where}"))
    text = raw[2] if len(raw) > 2 and isinstance(raw[2], str) else None
    return (None if lp is None else float(lp), raw[1], text)


def _entries(raw: Any, where: str, *, first_none: bool = False) -> tuple[LogprobEntry, ...]:
    if not isinstance(raw, list):
        raise EngineReplyError(f"engine reply's '{where}' is not a list")
    return tuple(_entry(e, where, first=first_none and k == 0) for k, e in enumerate(raw))


def _tops(raw: Any, where: str, *, optional: bool = False) -> tuple[Any, ...]:
    if not isinstance(raw, list):
        raise EngineReplyError(f"engine reply's '{where}' is not a list")
    return tuple(None if optional and row is None else _entries(row, where) for row in raw)


def parse_finish_reason(raw: Any) -> FinishReason | None:
    """A `finish_reason` object (None stays None); `EngineReplyError` for an unknown one."""
    if raw is None:
        return None
    kind = raw.get("type") if isinstance(raw, dict) else None
    if kind not in ("stop", "length", "abort"):
        raise EngineReplyError(f"engine reply has an unknown finish_reason {raw!r}"[:200])
    matched = raw.get("matched")
    length = raw.get("length")
    message = raw.get("message")
    return FinishReason(type=kind, matched=matched if isinstance(matched, (int, str)) else None,
                        length=length if isinstance(length, int) else None,
                        message=None if message is None else str(message))


def parse_output(payload: Any, *, final: bool = True, logprobs: bool = True) -> GenerateOutput:
    """One answer object, validated; `EngineReplyError` naming the first field that is wrong.

    `final`: the answer must say why it ended (a streamed snapshot need not). `logprobs`: the
    request asked for them, so `output_token_logprobs` must pair with `output_ids`.
    """
    if not isinstance(payload, dict):
        raise EngineReplyError("engine reply is not a JSON object")
    if "error" in payload:
        raise EngineReplyError(f"engine reported an error: {payload['error']}"[:500])
    text, ids, meta = payload.get("text"), payload.get("output_ids"), payload.get("meta_info")
    if not isinstance(text, str):
        raise EngineReplyError("engine reply has no string 'text'")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0
                                            for i in ids):
        raise EngineReplyError("engine reply has no list of token ids 'output_ids'")
    if not isinstance(meta, dict):
        raise EngineReplyError("engine reply has no 'meta_info' object")
    pairs = meta.get("output_token_logprobs")
    output_lps: tuple[LogprobEntry, ...] | None = None
    if logprobs or pairs is not None:
        if not isinstance(pairs, list) or len(pairs) != len(ids):
            raise EngineReplyError("engine reply's 'output_token_logprobs' do not match 'output_ids'")
        output_lps = tuple(_entry(p, "output_token_logprobs", token=t)
                           for p, t in zip(pairs, ids, strict=True))
    finish = parse_finish_reason(meta.get("finish_reason"))
    if final and finish is None:
        raise EngineReplyError("engine reply ended without a finish_reason")
    version = meta.get("weight_version")
    if version is not None and (isinstance(version, bool) or not isinstance(version, (str, int))):
        raise EngineReplyError(f"engine reply has a bad weight_version {version!r}"[:200])
    known = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "weight_version",
             "e2e_latency", *_LOGPROB_KEYS}
    rid = meta.get("id")
    return GenerateOutput(text=text, output_ids=tuple(ids), meta_info=MetaInfo(
        id=None if rid is None else str(rid), finish_reason=finish,
        prompt_tokens=_count(meta, "prompt_tokens"), completion_tokens=_count(meta, "completion_tokens"),
        cached_tokens=_count(meta, "cached_tokens"), weight_version=None if version is None else str(version),
        e2e_latency=_seconds(meta.get("e2e_latency")), output_token_logprobs=output_lps,
        output_top_logprobs=None if meta.get("output_top_logprobs") is None
        else _tops(meta["output_top_logprobs"], "output_top_logprobs"),
        input_token_logprobs=None if meta.get("input_token_logprobs") is None
        else _entries(meta["input_token_logprobs"], "input_token_logprobs", first_none=True),
        input_top_logprobs=None if meta.get("input_top_logprobs") is None
        else _tops(meta["input_top_logprobs"], "input_top_logprobs", optional=True),
        extra={k: v for k, v in meta.items() if k not in known}))


def _count(meta: Mapping[str, Any], key: str) -> int:
    value = meta.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _seconds(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def parse_outputs(payload: Any, count: int, *, logprobs: bool = True) -> list[GenerateOutput]:
    """The answers of a call that sent `count` prompts (a list for a batch, one object for one)."""
    answers = payload if count > 1 or isinstance(payload, list) else [payload]
    if not isinstance(answers, list) or len(answers) != count:
        got = len(answers) if isinstance(answers, list) else type(answers).__name__
        raise EngineReplyError(f"engine answered {got} samples for {count} prompts")
    return [parse_output(a, final=True, logprobs=logprobs) for a in answers]
