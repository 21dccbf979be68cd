"""The adapter application: both provider endpoints, health, and a loopback-first server."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import aiohttp
from aiohttp import web

from slime.agent.adapters.anthropic_messages import messages_endpoint
from slime.agent.adapters.common import CONTEXT, MAX_BODY_BYTES, AdapterContext
from slime.agent.adapters.openai_chat import chat_completions
from slime.agent.engine import EngineClient
from slime.agent.trajectory import TrajectoryManager

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class AdapterConfig:
    """Where the engine is and how the adapter answers."""

    engine_url: str
    model_name: str = "slime-policy"
    default_max_tokens: int = 1024
    engine_timeout_s: float = 300.0


async def _health(request: web.Request) -> web.Response:
    ctx = request.app[CONTEXT]
    return web.json_response({"status": "ok", "model": ctx.model_name, "engine": ctx.engine.url})


async def _models(request: web.Request) -> web.Response:
    name = request.app[CONTEXT].model_name
    return web.json_response(
        {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "slime"}]}
    )


@web.middleware
async def _json_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    # Agents parse error bodies as JSON; an HTML error page would surface as a decode error.
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.json_response(
            {"error": {"message": exc.reason, "type": "invalid_request_error"}}, status=exc.status
        )
    except Exception as exc:
        log.exception("adapter failed on %s", request.path)
        return web.json_response(
            {"error": {"message": f"adapter error: {exc}", "type": "api_error"}}, status=500
        )


def build_app(manager: TrajectoryManager, config: AdapterConfig) -> web.Application:
    """An aiohttp application serving both providers over one engine and one trajectory store."""
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=[_json_errors])

    async def engine_session(app: web.Application) -> AsyncIterator[None]:
        async with aiohttp.ClientSession() as http:
            app[CONTEXT] = AdapterContext(
                manager=manager,
                engine=EngineClient(config.engine_url, http, timeout_s=config.engine_timeout_s),
                model_name=config.model_name,
                default_max_tokens=config.default_max_tokens,
            )
            yield

    app.cleanup_ctx.append(engine_session)
    app.router.add_get("/health", _health)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/messages", messages_endpoint)
    return app


@asynccontextmanager
async def serve_adapter(
    manager: TrajectoryManager, config: AdapterConfig, *, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve the adapter until the block exits; yields its base URL (port 0 = a free port)."""
    runner = web.AppRunner(build_app(manager, config), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()
