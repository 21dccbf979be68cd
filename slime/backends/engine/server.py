"""`EngineServer`: an `Engine` behind SGLang's native HTTP API, served by aiohttp from a thread.

Why aiohttp: it is what the agent adapters already serve with (no new dependency), its C
parser (llhttp) refuses malformed framing (`Content-Length: abc` or `-1`, both
`Content-Length` and `Transfer-Encoding`) with a 400 and closes the connection, so a body
is never read as a second request; and one event loop holds any number of waiting requests
without a thread each. What the library leaves to us, this module adds (`Limits`): a body
cap checked before reading, a deadline for the request head (the idle timer aiohttp runs
until a complete head has arrived) and for the body, a bound on open connections, strict
JSON, and a JSON error for every refusal, its own or aiohttp's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import json
import os
import resource
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

from slime.backends.engine.api import build_responses, parse_generate
from slime.backends.engine.engine import Engine, GenerateRequest
from slime.backends.engine.weights import TENSOR_FORMAT, deserialize_named_tensors
from slime.backends.engine.wire import RequestError, SamplingParams
from slime.utils.strict_json import JSONBodyError, loads_strict

_MEMORY_TAGS = {"weights", "kv_cache", "cuda_graph"}
_MIB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one client may cost the server; defaults fit a rollout of thousands of samples."""

    max_body_bytes: int = 16 * _MIB  # a 128k-token prompt is about 1 MiB of JSON
    max_refit_body_bytes: int = 1024 * _MIB  # /update_weights_from_tensor carries the weights
    header_timeout_s: float = 10.0  # from connect (or the last answer) to a complete request head
    body_timeout_s: float = 60.0
    max_connections: int = 2048


class _Refused(Exception):
    """An HTTP error answer: status and the message a caller reads."""

    def __init__(self, status: int, message: str, *, close: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.close = close


def _error_body(status: int, message: str) -> bytes:
    return json.dumps({"success": False, "message": message,
                       "error": {"message": message, "code": status}}).encode()


def _json(status: int, payload: Any) -> web.Response:
    data = b"" if payload is None else json.dumps(payload).encode()
    return web.Response(status=status, body=data, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, body=_error_body(status, message), content_type="application/json")


def _events(answers: Sequence[dict[str, Any]]) -> web.Response:
    # SGLang's stream: `data: {answer so far}` events, then `data: [DONE]`. Generation runs as
    # one batch step here, so each sequence is one event carrying its whole, final answer.
    data = b"".join(b"data: " + json.dumps(a).encode() + b"\n\n" for a in answers) + b"data: [DONE]\n\n"
    return web.Response(status=200, body=data, content_type="text/event-stream")


def _field(body: dict[str, Any], name: str, kind: type | tuple[type, ...], *, required: bool = False) -> Any:
    value = body.get(name)
    if value is None:
        if required:
            raise RequestError(f"{name} is required")
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise RequestError(f"{name} must be a {getattr(kind, '__name__', kind)}")
    return value


def _version(body: dict[str, Any], name: str = "weight_version") -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (str, int)) or len(str(value)) > 256:
        raise RequestError(f"{name} must be a string of at most 256 characters (or an integer)")
    return str(value)


def _tags(body: dict[str, Any]) -> set[str]:
    tags = body.get("tags")
    if tags is None:
        return set(_MEMORY_TAGS)
    if not isinstance(tags, list) or not all(isinstance(t, str) and t in _MEMORY_TAGS for t in tags):
        raise RequestError(f"tags must be a list drawn from {sorted(_MEMORY_TAGS)}")
    return set(tags)


def allowed_weights_path(requested: str, roots: Sequence[str]) -> str | None:
    """`requested` resolved (symlinks and `..` followed) when it is one of `roots` or inside one."""
    if not requested or "\x00" in requested:
        return None
    real = Path(os.path.realpath(requested))
    for root in roots:
        base = Path(os.path.realpath(root))
        if real == base or real.is_relative_to(base):
            return str(real)
    return None


class _Protocol(RequestHandler):
    """aiohttp's connection handler, answering its own framing errors as our JSON errors."""

    def handle_error(self, request: Any, status: int = 500, exc: BaseException | None = None,
                     message: str | None = None) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("the answer was already started")
        reason = "bad request framing" if status == 400 else HTTPStatus(status).phrase.lower()
        if exc is not None and status == 400:
            reason = f"bad request: {getattr(exc, 'message', None) or type(exc).__name__}"
        resp = web.Response(status=status, body=_error_body(status, reason), content_type="application/json")
        resp.force_close()
        return resp


_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
         b"Content-Length: %d\r\n\r\n%s")


class _Server(web.Server):
    """aiohttp's low-level server with a bound on open connections (over it: 503, closed)."""

    def __init__(self, handler: Any, *, max_connections: int, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self.max_connections = max_connections

    def __call__(self) -> RequestHandler:
        return _Protocol(self, loop=self._loop, **self._kwargs)

    def connection_made(self, handler: RequestHandler, transport: asyncio.Transport) -> None:
        super().connection_made(handler, transport)
        if len(self._connections) > self.max_connections:
            body = _error_body(503, f"the engine holds {self.max_connections} connections; retry later")
            transport.write(_BUSY % (len(body), body))
            handler.force_close()


class _Relay:
    """The engine worker's results handed to the event loop, one wake-up per burst.

    `asyncio.wrap_future` wakes the loop once per future (a write to its self-pipe each), and
    a batch of 64 finishes 64 futures at once; here the first result of a burst schedules
    one drain and the rest join it.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._ready: list[tuple[asyncio.Future[Any], cf.Future[Any]]] = []

    def wait(self, future: cf.Future[Any]) -> asyncio.Future[Any]:
        """An awaitable of `future`'s outcome on the loop (call on the loop)."""
        waiter: asyncio.Future[Any] = self._loop.create_future()
        future.add_done_callback(lambda done: self._deliver(waiter, done))
        return waiter

    def _deliver(self, waiter: asyncio.Future[Any], done: cf.Future[Any]) -> None:
        with self._lock:
            self._ready.append((waiter, done))
            if len(self._ready) > 1:
                return  # a drain is already scheduled
        with contextlib.suppress(RuntimeError):  # a closed loop: the server stopped, no one waits
            self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        with self._lock:
            ready, self._ready = self._ready, []
        for waiter, done in ready:
            if waiter.cancelled():
                continue
            exc = done.exception()
            if exc is not None:
                waiter.set_exception(exc)
            else:
                waiter.set_result(done.result())


class _Gather:
    """The `/generate` sequences parsed in one pass of the event loop, queued on the engine together.

    Each handler checks its sequences and gets its future at once; one callback after the
    pass hands every job of the pass to the engine (`Engine.enqueue`). Queued one at a time,
    the first request of a burst woke the worker, which started a batch of one or a few
    while the rest were still being parsed: a burst of 200 ran in five batches instead of
    four, each batch costing a forward pass per token whatever its size.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        self._loop = loop
        self._engine = engine
        self._jobs: list[tuple[list[GenerateRequest], cf.Future[Any]]] = []

    def submit(self, requests: list[GenerateRequest]) -> cf.Future[Any]:
        """A future of the engine's answer to `requests` (call on the loop); bad input raises now."""
        for r in requests:
            self._engine.check_request(r.input_ids, r.params)
        future: cf.Future[Any] = cf.Future()
        if not self._jobs:
            self._loop.call_soon(self._flush)
        self._jobs.append((requests, future))
        return future

    def _flush(self) -> None:
        jobs, self._jobs = self._jobs, []
        try:
            self._engine.enqueue(jobs)
        except BaseException as exc:  # nothing was queued: every waiter hears why
            for _, future in jobs:
                if not future.done():
                    future.set_exception(exc)


def _fd_bound(wanted: int) -> int:
    # Each connection is a file descriptor; leave room for model files, pipes and the listener.
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return wanted if soft == resource.RLIM_INFINITY else max(1, min(wanted, soft - 64))


Route = Callable[["EngineServer", dict[str, Any]], Awaitable[Any]]


class EngineServer:
    """An engine served over HTTP on `host:port` (port 0: a free one) from a daemon thread.

    `update_weights_from_disk` loads only from `model_path` and `weights_dirs` (and what lies
    under them); any other path gets the same answer whether it exists or not.
    """

    def __init__(self, model_path: str | Path, *, device: str = "cpu", seed: int = 0,
                 host: str = "127.0.0.1", port: int = 0, weight_version: str = "0",
                 max_batch_size: int = 64, gpu_ids: Sequence[int] = (),
                 cpu_threads: int | None = 1, batch_delay_s: float = 0.0,
                 weights_dirs: Sequence[str | Path] = (), limits: Limits | None = None) -> None:
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
        self.weights_dirs = (self.model_path, *(str(d) for d in weights_dirs))
        self.limits = limits or Limits()
        self.engine: Engine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.ServerRunner | None = None
        self._thread: threading.Thread | None = None
        self._address: tuple[str, int] | None = None
        self._relay: _Relay | None = None
        self._gather: _Gather | None = None

    @property
    def url(self) -> str:
        """`http://host:port` once started."""
        if self._address is None:
            raise RuntimeError("the server is not started; call start()")
        return f"http://{self._address[0]}:{self._address[1]}"

    def start(self) -> str:
        """Load the model, bind, serve; returns the URL."""
        if self._address is not None:
            return self.url
        self.engine = Engine(self.model_path, device=self.device, seed=self.seed,
                             weight_version=self.weight_version, max_batch_size=self.max_batch_size,
                             gpu_ids=self.gpu_ids, cpu_threads=self.cpu_threads,
                             batch_delay_s=self.batch_delay_s)
        loop = asyncio.new_event_loop()
        self._relay = _Relay(loop)
        self._gather = _Gather(loop, self.engine)
        try:
            self._runner = loop.run_until_complete(self._bind())
        except BaseException:
            loop.close()
            self.engine.close()
            self.engine = None
            raise
        self._loop = loop
        self._thread = threading.Thread(target=loop.run_forever, name="engine-http", daemon=True)
        self._thread.start()
        return self.url

    async def _bind(self) -> web.ServerRunner:
        lim = self.limits
        server = _Server(self._handle, max_connections=_fd_bound(lim.max_connections),
                         keepalive_timeout=lim.header_timeout_s, max_line_size=8190, max_field_size=8190,
                         # After a refusal the unread rest of a body is drained for at most this
                         # long (closing at once would reset the connection under the answer).
                         lingering_time=1.0)
        runner = web.ServerRunner(server, access_log=None)
        await runner.setup()
        # A rollout opens a connection per sample at once; a short listen backlog resets them.
        site = web.TCPSite(runner, self.host, self.port, backlog=1024)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._address = runner.addresses[0][:2]
        return runner

    def stop(self) -> None:
        """Stop serving and free the engine (idempotent)."""
        loop, runner = self._loop, self._runner
        if loop is not None and runner is not None:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        if loop is not None:
            loop.close()
        self._loop = self._runner = None
        self._address = None
        if self.engine is not None:
            self.engine.close()
            self.engine = None

    def __enter__(self) -> EngineServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- plumbing -------------------------------------------------------------------------
    async def _body(self, request: web.BaseRequest, cap: int) -> bytes:
        if request.content_length is not None and request.content_length > cap:
            raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                           f"the body is {request.content_length} bytes; at most {cap} are accepted",
                           close=True)
        content = request.content
        if content.is_eof():
            # The whole body came with the head (every /generate of a rollout): nothing to
            # wait for, so no timer and no read loop. The cap held above or is checked here.
            data = content.read_nowait()
            if len(data) > cap:
                raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body exceeds {cap} bytes",
                               close=True)
            return data
        data = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                async for chunk in request.content.iter_any():
                    data += chunk
                    if len(data) > cap:
                        raise _Refused(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                                       f"the body exceeds {cap} bytes", close=True)
        except TimeoutError:
            raise _Refused(HTTPStatus.REQUEST_TIMEOUT,
                           f"the body did not arrive within {self.limits.body_timeout_s:g} s",
                           close=True) from None
        return bytes(data)

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            response = await self._dispatch(request)
        except _Refused as exc:
            response = _error(exc.status, str(exc))
            if exc.close:
                # What is left of an unread body must not be read as the next request.
                response.force_close()
        except (RequestError, JSONBodyError) as exc:
            response = _error(HTTPStatus.BAD_REQUEST, str(exc))
        except Exception as exc:  # the server answers; the caller sees what went wrong
            response = _error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        return response

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        methods = _ROUTES.get(request.path)
        if methods is None:
            raise _Refused(HTTPStatus.NOT_FOUND,
                           f"no endpoint {request.path[:200]}; endpoints: {', '.join(sorted(_ROUTES))}")
        route = methods.get(request.method)
        if route is None:
            response = _error(HTTPStatus.METHOD_NOT_ALLOWED, f"{request.method} is not allowed on "
                              f"{request.path}; use {' or '.join(sorted(methods))}")
            response.headers["Allow"] = ", ".join(sorted(methods))
            if request.can_read_body:
                response.force_close()  # its body stays unread
            return response
        body: Any = {}
        if request.method == "POST":
            cap = (self.limits.max_refit_body_bytes if request.path == "/update_weights_from_tensor"
                   else self.limits.max_body_bytes)
            raw = await self._body(request, cap)
            body = loads_strict(raw) if raw.strip() else {}
            if not isinstance(body, dict):
                raise RequestError("the body must be a JSON object")
        result = await route(self, body)
        if isinstance(result, web.StreamResponse):
            return result
        status, payload = result
        return _json(status, payload)

    @property
    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("the engine is stopped")
        return self.engine

    def _wait(self, future: cf.Future[Any]) -> Awaitable[Any]:
        assert self._relay is not None, "the server is not started"
        return self._relay.wait(future)

    def _submit(self, requests: list[GenerateRequest]) -> Awaitable[Any]:
        assert self._gather is not None, "the server is not started"
        return self._wait(self._gather.submit(requests))

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        # Refits, release and resume wait for the engine's worker; not on the event loop.
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    # ---- endpoints ------------------------------------------------------------------------
    async def generate(self, body: dict[str, Any]) -> Any:
        engine = self._engine
        started = time.monotonic()
        prompts, batched = parse_generate(body, engine.encode)
        gens, version = await self._submit(engine.sequences(prompts))
        out = [a.to_json() for a in build_responses(prompts, gens, weight_version=version,
                                                     latency_s=time.monotonic() - started,
                                                     decode=engine.decode)]
        if body.get("stream"):
            return _events(out)
        return HTTPStatus.OK, out if batched or len(out) > 1 else out[0]

    async def health(self, body: dict[str, Any]) -> tuple[int, Any]:
        return HTTPStatus.OK, None

    async def health_generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        engine = self._engine
        bos = engine.tokenizer.bos_token_id
        await self._submit([GenerateRequest(
            input_ids=(bos if bos is not None else 0,), params=SamplingParams(max_new_tokens=1), seed=0)])
        return HTTPStatus.OK, None

    async def flush_cache(self, body: dict[str, Any]) -> tuple[int, Any]:
        await self._blocking(self._engine.flush_cache)
        return HTTPStatus.OK, {"success": True, "message": "Cache flushed."}

    async def get_weight_version(self, body: dict[str, Any]) -> tuple[int, Any]:
        return HTTPStatus.OK, {"weight_version": self._engine.weight_version}

    async def update_weight_version(self, body: dict[str, Any]) -> tuple[int, Any]:
        version = _version(body, "new_version")
        if version is None:
            raise RequestError("new_version is required")
        engine = self._engine
        await self._blocking(lambda: engine.set_weight_version(version))
        return HTTPStatus.OK, {"success": True, "message": f"weight version set to {version}"}

    async def get_model_info(self, body: dict[str, Any]) -> tuple[int, Any]:
        e = self._engine
        return HTTPStatus.OK, {
            "model_path": e.model_path, "tokenizer_path": e.model_path, "is_generation": True,
            "weight_version": e.weight_version, "vocab_size": e.vocab_size,
            "max_position_embeddings": e.max_positions, "eos_token_id": e.eos_token_id,
            "pad_token_id": e.pad_token_id, "bos_token_id": e.tokenizer.bos_token_id,
        }

    async def get_server_info(self, body: dict[str, Any]) -> tuple[int, Any]:
        info = await self._blocking(self._engine.info)
        return HTTPStatus.OK, {**info, "engine": "slime", "weights_dirs": list(self.weights_dirs)}

    async def models(self, body: dict[str, Any]) -> tuple[int, Any]:
        e = self._engine
        return HTTPStatus.OK, {"object": "list", "data": [
            {"id": e.model_path, "object": "model", "created": 0, "owned_by": "slime",
             "root": e.model_path, "max_model_len": e.max_positions}]}

    async def update_weights_from_disk(self, body: dict[str, Any]) -> tuple[int, Any]:
        requested = _field(body, "model_path", str, required=True)
        if body.get("load_format") not in (None, "auto", "safetensors"):
            raise RequestError("load_format must be auto or safetensors")
        path = allowed_weights_path(requested, self.weights_dirs)
        if path is None or not Path(path).is_dir():
            # One answer for "outside", "missing" and "not a directory": it must not tell a
            # caller which paths exist on the engine's host.
            raise RequestError("model_path is not a model directory the engine may load; it loads only "
                               "from its model path and the directories given with --weights-dir")
        version = _version(body)
        engine = self._engine
        await self._blocking(lambda: engine.update_weights_from_disk(path, version))
        return HTTPStatus.OK, {"success": True, "message": "weights loaded", "num_paused_requests": 0}

    async def update_weights_from_tensor(self, body: dict[str, Any]) -> tuple[int, Any]:
        blobs = _field(body, "serialized_named_tensors", list, required=True)
        if body.get("load_format", TENSOR_FORMAT) != TENSOR_FORMAT:
            raise RequestError(f"load_format must be {TENSOR_FORMAT!r}")
        named: dict[str, Any] = {}
        for i, blob in enumerate(blobs):
            if not isinstance(blob, str):
                raise RequestError(f"serialized_named_tensors[{i}] must be a base64 string")
            try:
                named.update(deserialize_named_tensors(blob))
            except ValueError as exc:
                raise RequestError(f"serialized_named_tensors[{i}]: {exc}") from None
        if not named:
            raise RequestError("serialized_named_tensors holds no tensor")
        version = _version(body)
        engine = self._engine
        await self._blocking(lambda: engine.update_weights_from_tensor(named, version))
        return HTTPStatus.OK, {"success": True, "message": f"{len(named)} tensors loaded"}

    async def release_memory_occupation(self, body: dict[str, Any]) -> tuple[int, Any]:
        # KV caches live only as long as their batch, so the weights are all there is to free.
        engine = self._engine
        if "weights" in _tags(body):
            await self._blocking(engine.release_memory)
        return HTTPStatus.OK, {"success": True, "model_bytes": engine.model_bytes()}

    async def resume_memory_occupation(self, body: dict[str, Any]) -> tuple[int, Any]:
        engine = self._engine
        if "weights" in _tags(body):
            await self._blocking(engine.resume_memory)
        return HTTPStatus.OK, {"success": True, "model_bytes": engine.model_bytes()}


S = EngineServer
_ROUTES: dict[str, dict[str, Route]] = {
    "/generate": {"POST": S.generate},
    "/health": {"GET": S.health},
    "/health_generate": {"GET": S.health_generate},
    "/flush_cache": {"GET": S.flush_cache, "POST": S.flush_cache},
    "/get_weight_version": {"GET": S.get_weight_version},
    "/update_weight_version": {"POST": S.update_weight_version},
    "/get_model_info": {"GET": S.get_model_info},
    "/get_server_info": {"GET": S.get_server_info},
    "/v1/models": {"GET": S.models},
    "/update_weights_from_disk": {"POST": S.update_weights_from_disk},
    "/update_weights_from_tensor": {"POST": S.update_weights_from_tensor},
    "/release_memory_occupation": {"POST": S.release_memory_occupation},
    "/resume_memory_occupation": {"POST": S.resume_memory_occupation},
}
