"""Rollout engines that speak SGLang's native HTTP API (the subset a trainer uses).

The trainer talks to engines only over HTTP, through `EngineClient`, so a real SGLang server
(`launch_sglang_server`, `--rollout-backend sglang`) can take an engine's place.

Python API
----------
- `EngineServer(model_path, *, device="cpu", seed=0, host="127.0.0.1", port=0,
  weight_version="0", max_batch_size=64, gpu_ids=(), weights_dirs=(), limits=Limits())`:
  `start() -> url` loads the model and serves (aiohttp, on an event loop in a daemon thread
  of this process; port 0: a free port); `stop()`; a context manager. `.engine` is the
  `Engine` (model, tokenizer, worker thread). `weights_dirs`: where
  `/update_weights_from_disk` may load from, besides `model_path`. `server.Limits`: body
  caps, head/body timeouts, connection bound. `python -m slime.backends.engine` serves one.
- `EngineClient(url, *, timeout=300)`: `generate(input_ids, sampling_params=None, *,
  return_logprob=True, **extra)`, `update_weights_from_disk(model_path, *, weight_version=None)`,
  `update_weights_from_tensor(named_tensors, *, weight_version=None)`, `weight_version()`,
  `release_memory_occupation(tags=None)`, `resume_memory_occupation(tags=None)`, `health()`,
  `is_healthy()`, `wait_healthy(timeout)`, `flush_cache()`, `model_info()`, `server_info()`
  (alias `info()`), `request(method, path, body)`. `generate` takes `wire.SamplingParams`
  (or their JSON); `wire.parse_outputs` reads its answers as `wire.GenerateOutput`s. Errors
  (`wire`): `EngineUnavailable` (no answer; the message names the URL), `EngineRequestError`
  (`.status`, `.message`, `.url`), `EngineReplyError` (an answer that is not one), all
  `EngineError`; the server's 400s are `RequestError`, an `EngineError` too.
- `EngineRouter(urls_or_clients)`: `generate(...)` on the engine with the fewest requests in
  flight (ties: round robin); `update_weights_from_disk/tensor`, `release/resume_memory_occupation`,
  `flush_cache`, `health` on every engine; `weight_versions() -> {url: version}`.
- `EngineActor` (Ray): `create_engine_actor(model_path, *, num_gpus=1, seed=0,
  placement_group=None, bundle_index=None, device=None, weight_version="0", max_batch_size=64,
  host="127.0.0.1", runtime_env=None)` returns a handle (`num_cpus=0`) with `start() -> url`,
  `info() -> dict` (server info + `url`, `cuda_visible_devices`), `stop()`. `engine_device(env)`
  decides cpu/cuda from `SLIME_CI_DEVICE` / `SLIME_CI_EMULATE_GPUS`.
- `launch_sglang_server(model_path, *, port, host="127.0.0.1", extra_args=(), env=None,
  log_path, timeout=600) -> SGLangServer` (`.url`, `.process`, `.stop()`); untested here.
- The CPU engine sets `torch.set_num_threads(cpu_threads)` (default 1) in its process.
- Concurrency: HTTP requests wait on one event loop; generations waiting together are merged
  into one batch (up to `max_batch_size` sequences) by the engine's single worker thread, and
  refits / release / resume run between batches in arrival order (`engine.Engine`).

HTTP API (JSON bodies; every error is `{"success": false, "message": ..., "error":
{"message": ..., "code": N}}`: 400 bad request, 404 unknown path, 405 wrong method, 408 slow
body, 413 body too large, 503 too many connections)
----------------------------------------------------------------------------------------
`POST /generate`
  `{"input_ids": [ids] | [[ids], ...]` (or `"text": str | [str]`), `"sampling_params": {...}`
  (or one object per prompt), `"return_logprob": bool, "return_text_in_logprobs": bool,
  "rid": str, "logprob_start_len": int, "top_logprobs_num": int, "stream": bool}`. Sampling
  params: `max_new_tokens` (128), `temperature` (1.0; 0 = greedy), `top_p` (1.0), `top_k`
  (-1), `min_p` (0), `stop` ([] strings), `stop_token_ids` ([]), `min_new_tokens` (0),
  `repetition_penalty` (1), `frequency_penalty` / `presence_penalty` (0), `logit_bias` ({}),
  `n` (1), `ignore_eos` (false), `skip_special_tokens` (true), `no_stop_trim` (false),
  `sampling_seed` (SGLang's name; default: drawn from the engine's seed in arrival order);
  accepted with no effect and refused keys: `api.ACCEPTED`, `api.REFUSED`, `api.TOP_REFUSED`
  (docs/framework/engine.md). Unknown keys are rejected (400), not ignored.
  Answer per prompt (a list for a batch): `{"text", "output_ids", "meta_info": {"id",
  "finish_reason": {"type": "stop", "matched": id} | {"type": "length", "length": n},
  "prompt_tokens", "completion_tokens", "cached_tokens": 0, "weight_version", "e2e_latency",
  "output_token_logprobs": [[logprob, token_id, text | null], ...]}}` (log-probs only when
  `return_logprob`; `weight_version` is the version the batch ran with, even when a refit was
  queued behind it). `output_ids` include the matched stop token (its log-prob too); `text`
  drops special tokens unless `skip_special_tokens` is false. Log-probs are of the unmodified
  model distribution (temperature 1, no top-p/top-k), as the trainer recomputes them; they
  agree with a full forward pass of prompt + output to ~1e-6 in fp32.
`POST /update_weights_from_disk` `{"model_path", "weight_version"?, "load_format"?}` -> `{"success",
  "message", "num_paused_requests"}`; every tensor of the checkpoint must match the model.
`POST /update_weights_from_tensor` `{"serialized_named_tensors": [base64 safetensors],
  "load_format": "safetensors_base64", "weight_version"?}` (any subset of parameters; see
  `weights.serialize_named_tensors`).
  Both refits run between batches; without `weight_version` the version stays (as in SGLang).
`GET /get_weight_version` -> `{"weight_version"}`; `POST /update_weight_version` `{"new_version"}`.
`POST /release_memory_occupation` / `POST /resume_memory_occupation` `{"tags"?: ["weights",
  "kv_cache", "cuda_graph"]}` -> `{"success", "model_bytes"}`: release moves every parameter
  and buffer to a file in the engine's temp dir and frees it on the device (CUDA memory on a
  GPU, the tensors' bytes on CPU), leaving `model_bytes` 0; resume brings back identical
  weights. Generating or refitting while released is a 400. KV caches live for one batch only.
`GET /health`, `GET /health_generate` (one token), `GET|POST /flush_cache` (waits for queued
  work; no KV cache outlives its batch, so there is nothing else to drop).
`GET /get_model_info` -> `{"model_path", "tokenizer_path", "is_generation", "weight_version",
  "vocab_size", "max_position_embeddings", "eos_token_id", "pad_token_id", "bos_token_id"}`.
`GET /v1/models` -> `{"object": "list", "data": [{"id": model_path, ...}]}`.
`GET /get_server_info` -> `{"engine": "slime", "weights_dirs", "device", "gpu_ids", "pid", "model_bytes",
  "memory_released", "weight_version", "seed", "max_batch_size", "requests_served",
  "batches_run", "cuda_memory_allocated", "model_path"}`.
"""

import importlib
from typing import TYPE_CHECKING, Any

# The package's names load on first use: `python -m slime.backends.engine.sglang_config`
# (a YAML check) then starts without importing torch through the server.
_WHERE = {
    "EngineActor": "actor", "create_engine_actor": "actor", "engine_device": "actor",
    "EngineClient": "client", "EngineError": "wire", "EngineRequestError": "wire",
    "EngineUnavailable": "wire", "EngineRouter": "router", "EngineServer": "server",
    "SGLangServer": "sglang_backend", "launch_sglang_server": "sglang_backend",
}

__all__ = [
    "EngineActor", "EngineClient", "EngineError", "EngineRequestError", "EngineRouter", "EngineServer",
    "EngineUnavailable", "SGLangServer", "create_engine_actor", "engine_device", "launch_sglang_server",
]

if TYPE_CHECKING:
    from slime.backends.engine.actor import EngineActor, create_engine_actor, engine_device
    from slime.backends.engine.client import EngineClient
    from slime.backends.engine.router import EngineRouter
    from slime.backends.engine.server import EngineServer
    from slime.backends.engine.sglang_backend import SGLangServer, launch_sglang_server
    from slime.backends.engine.wire import EngineError, EngineRequestError, EngineUnavailable


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
