"""`EngineServer`: an `Engine` behind SGLang's native HTTP API, served from a thread of this process."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from slime.backends.engine.api import RequestError, build_response, parse_generate
from slime.backends.engine.engine import Engine, EngineInputError, GenerateRequest
from slime.backends.engine.weights import TENSOR_FORMAT, deserialize_named_tensors

_MEMORY_TAGS = {"weights", "kv_cache", "cuda_graph"}


class _BadRequest(Exception):
    pass


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise _BadRequest(f"{name} is required")
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _BadRequest(f"{name} must be a {getattr(kind, '__name__', kind)}, got {value!r}")
    return value


def _version(body: dict[str, Any], name: str = "weight_version") -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _BadRequest(f"{name} must be a string (or an integer), got {value!r}")
    return str(value)


def _tags(body: dict[str, Any]) -> set[str]:
    tags = body.get("tags")
    if tags is None:
        return set(_MEMORY_TAGS)
    if not isinstance(tags, list) or not set(tags) <= _MEMORY_TAGS:
        raise _BadRequest(f"tags must be a list drawn from {sorted(_MEMORY_TAGS)}, got {tags!r}")
    return set(tags)


class _HTTPServer(ThreadingHTTPServer):
    # A rollout opens a connection per sample at once; the default listen backlog of 5 made
    # the kernel reset connections when 64 arrived together.
    request_queue_size = 1024
    daemon_threads = True


class EngineServer:
    """An engine served over HTTP on `host:port` (port 0: a free one) from a daemon thread."""

    def __init__(self, model_path: str | Path, *, device: str = "cpu", seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, weight_version: str = "0",
                 max_batch_size: int = 64, gpu_ids: Sequence[int] = (),
                 cpu_threads: int | None = 1, batch_delay_s: float = 0.0) -> None:
        self.model_path = str(model_path)
        self.device = device
        self.seed = seed
        self.host = host
        self.port = port
        self.weight_version = weight_version
        self.max_batch_size = max_batch_size
        self.gpu_ids = tuple(gpu_ids)
        self.cpu_threads = cpu_threads
        self.batch_delay_s = batch_delay_s
        self.engine: Engine | None = None
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """`http://host:port` once started."""
        if self._httpd is None:
            raise RuntimeError("the server is not started; call start()")
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        """Load the model, bind, serve; returns the URL."""
        if self._httpd is not None:
            return self.url
        self.engine = Engine(self.model_path, device=self.device, seed=self.seed,
                             weight_version=self.weight_version, max_batch_size=self.max_batch_size,
                             gpu_ids=self.gpu_ids, cpu_threads=self.cpu_threads,
                             batch_delay_s=self.batch_delay_s)
        handler = type("Handler", (_Handler,), {"engine": self.engine})
        try:
            self._httpd = _HTTPServer((self.host, self.port), handler)
        except OSError:
            self.engine.close()
            self.engine = None
            raise
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="engine-http",
                                        kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self.url

    def stop(self) -> None:
        """Stop serving and free the engine (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Handler(BaseHTTPRequestHandler):
    engine: Engine
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the test and run logs

    # ---- plumbing -------------------------------------------------------------------------
    def _send(self, status: int, payload: Any) -> None:
        data = b"" if payload is None else json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        self._send(status, {"success": False, "message": message,
                            "error": {"message": message, "code": status}})

    def _read(self) -> bytes:
        # Always consumed, even for a request that is then refused: on a kept-alive connection
        # an unread body would be parsed as the next request.
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length > 0 else b""

    @staticmethod
    def _parse(raw: bytes) -> Any:
        if not raw:
            return {}
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise _BadRequest(f"the body is not JSON: {exc}") from None

    def _dispatch(self, method: str) -> None:
        raw = self._read()
        path = self.path.split("?", 1)[0]
        route = _ROUTES.get((method, path))
        if route is None:
            known = sorted({p for _, p in _ROUTES})
            if any(p == path for _, p in _ROUTES):
                self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{method} {path} is not allowed")
            else:
                self._error(HTTPStatus.NOT_FOUND, f"no endpoint {path}; endpoints: {', '.join(known)}")
            return
        try:
            body = self._parse(raw) if method == "POST" else {}
            if method == "POST" and not isinstance(body, dict):
                raise _BadRequest("the body must be a JSON object")
            status, payload = route(self, body)
        except (_BadRequest, RequestError, EngineInputError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        except Exception as exc:  # the server answers; the caller sees what went wrong
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
            return
        self._send(status, payload)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    # ---- endpoints ------------------------------------------------------------------------
    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        engine = self.engine
        started = time.monotonic()
        reqs, batched = parse_generate(body, engine.encode)
        gens, version = engine.generate([GenerateRequest(input_ids=r.input_ids, params=r.params,
                                                         seed=r.params.seed if r.params.seed is not None
                                                         else engine.next_seed()) for r in reqs])
        latency = time.monotonic() - started

        out = [build_response(r, g, weight_version=version, latency_s=latency, decode=engine.decode)
               for r, g in zip(reqs, gens, strict=True)]
        return HTTPStatus.OK, out if batched else out[0]

    def health(self, body: dict[str, Any]) -> tuple[int, Any]:
        return HTTPStatus.OK, None

    def health_generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        from slime.backends.engine.sampler import SamplingParams

        bos = self.engine.tokenizer.bos_token_id
        self.engine.generate([GenerateRequest(input_ids=(bos if bos is not None else 0,),
                                              params=SamplingParams(max_new_tokens=1), seed=0)])
        return HTTPStatus.OK, None

    def flush_cache(self, body: dict[str, Any]) -> tuple[int, Any]:
        self.engine.flush_cache()
        return HTTPStatus.OK, {"success": True, "message": "Cache flushed."}

    def get_weight_version(self, body: dict[str, Any]) -> tuple[int, Any]:
        return HTTPStatus.OK, {"weight_version": self.engine.weight_version}

    def update_weight_version(self, body: dict[str, Any]) -> tuple[int, Any]:
        version = _version(body, "new_version")
        if version is None:
            raise _BadRequest("new_version is required")
        self.engine.set_weight_version(version)
        return HTTPStatus.OK, {"success": True, "message": f"weight version set to {version}"}

    def get_model_info(self, body: dict[str, Any]) -> tuple[int, Any]:
        e = self.engine
        return HTTPStatus.OK, {
            "model_path": e.model_path, "tokenizer_path": e.model_path, "is_generation": True,
            "weight_version": e.weight_version, "vocab_size": e.vocab_size,
            "max_position_embeddings": e.max_positions, "eos_token_id": e.eos_token_id,
            "pad_token_id": e.pad_token_id, "bos_token_id": e.tokenizer.bos_token_id,
        }

    def get_server_info(self, body: dict[str, Any]) -> tuple[int, Any]:
        return HTTPStatus.OK, {**self.engine.info(), "engine": "slime"}

    def update_weights_from_disk(self, body: dict[str, Any]) -> tuple[int, Any]:
        path = _field(body, "model_path", str, required=True)
        if body.get("load_format") not in (None, "auto", "safetensors"):
            raise _BadRequest(f"load_format {body['load_format']!r} is not supported; use safetensors")
        self.engine.update_weights_from_disk(path, _version(body))
        return HTTPStatus.OK, {"success": True, "message": f"weights loaded from {path}",
                               "num_paused_requests": 0}

    def update_weights_from_tensor(self, body: dict[str, Any]) -> tuple[int, Any]:
        blobs = _field(body, "serialized_named_tensors", list, required=True)
        if body.get("load_format", TENSOR_FORMAT) != TENSOR_FORMAT:
            raise _BadRequest(f"load_format must be {TENSOR_FORMAT!r}, got {body['load_format']!r}")
        named: dict[str, Any] = {}
        for i, blob in enumerate(blobs):
            if not isinstance(blob, str):
                raise _BadRequest(f"serialized_named_tensors[{i}] must be a base64 string")
            try:
                named.update(deserialize_named_tensors(blob))
            except ValueError as exc:
                raise _BadRequest(f"serialized_named_tensors[{i}]: {exc}") from None
        if not named:
            raise _BadRequest("serialized_named_tensors holds no tensor")
        self.engine.update_weights_from_tensor(named, _version(body))
        return HTTPStatus.OK, {"success": True, "message": f"{len(named)} tensors loaded"}

    def release_memory_occupation(self, body: dict[str, Any]) -> tuple[int, Any]:
        # KV caches live only as long as their batch, so the weights are all there is to free.
        if "weights" in _tags(body):
            self.engine.release_memory()
        return HTTPStatus.OK, {"success": True, "model_bytes": self.engine.model_bytes()}

    def resume_memory_occupation(self, body: dict[str, Any]) -> tuple[int, Any]:
        if "weights" in _tags(body):
            self.engine.resume_memory()
        return HTTPStatus.OK, {"success": True, "model_bytes": self.engine.model_bytes()}


_ROUTES = {
    ("POST", "/generate"): _Handler.generate,
    ("GET", "/health"): _Handler.health,
    ("GET", "/health_generate"): _Handler.health_generate,
    ("GET", "/flush_cache"): _Handler.flush_cache,
    ("POST", "/flush_cache"): _Handler.flush_cache,
    ("GET", "/get_weight_version"): _Handler.get_weight_version,
    ("POST", "/update_weight_version"): _Handler.update_weight_version,
    ("GET", "/get_model_info"): _Handler.get_model_info,
    ("GET", "/get_server_info"): _Handler.get_server_info,
    ("POST", "/update_weights_from_disk"): _Handler.update_weights_from_disk,
    ("POST", "/update_weights_from_tensor"): _Handler.update_weights_from_tensor,
    ("POST", "/release_memory_occupation"): _Handler.release_memory_occupation,
    ("POST", "/resume_memory_occupation"): _Handler.resume_memory_occupation,
}
