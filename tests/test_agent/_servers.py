"""Runs the fake engine and the real adapter on a background event loop, on ephemeral ports.

SDK clients in the tests are the real synchronous ones; they talk to these
servers over loopback HTTP from the test thread.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
import threading
from collections.abc import Coroutine, Iterator
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from _engine import FakeEngine, Policy
from aiohttp import web

from slime.agent.adapters import AdapterConfig, serve_adapter
from slime.agent.trajectory import TrajectoryManager

if TYPE_CHECKING:
    import anthropic
    import openai

T = TypeVar("T")
# Never route a loopback test through a proxy, and never let the Agents SDK export traces.
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
os.environ["OPENAI_AGENTS_DISABLE_TRACING"] = "1"

# Every connection and name lookup this process makes must stay on loopback. A background
# thread (a trace exporter, say) would swallow an exception, so attempts are also recorded
# and `running_stack` fails the test on exit if there were any.
OFF_LOOPBACK: list[str] = []


def _is_loopback(host: object) -> bool:
    if host in ("localhost", None, b"localhost"):
        return True
    try:
        return ipaddress.ip_address(str(host)).is_loopback
    except ValueError:
        return False


def _guard(event: str, args: tuple[Any, ...]) -> None:
    if event == "socket.connect" and isinstance(args[1], tuple):
        host = args[1][0]
    elif event == "socket.getaddrinfo":
        host = args[0]
    else:
        return
    if not _is_loopback(host):
        OFF_LOOPBACK.append(f"{event} {host!r}")
        raise ConnectionRefusedError(f"agent tests stay on loopback; refused {event} to {host!r}")


sys.addaudithook(_guard)


@dataclass
class Stack:
    """A running engine + adapter pair."""

    engine: FakeEngine
    manager: TrajectoryManager
    engine_url: str
    adapter_url: str
    loop: asyncio.AbstractEventLoop

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 20.0) -> T:
        """Run a coroutine on the servers' loop and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    # The SDKs are imported late: they load anyio, a pytest plugin, and a plugin imported
    # before pytest.main() starts cannot be rewritten (an error under -W error).
    def openai_client(self, session: str) -> openai.OpenAI:
        """The real OpenAI SDK, pointed at the adapter; the session id is the API key."""
        import openai

        return openai.OpenAI(base_url=f"{self.adapter_url}/v1", api_key=session, max_retries=0, timeout=20)

    def anthropic_client(self, session: str) -> anthropic.Anthropic:
        """The real Anthropic SDK, pointed at the adapter; the session id is the API key."""
        import anthropic

        return anthropic.Anthropic(base_url=self.adapter_url, api_key=session, max_retries=0, timeout=20)


async def serve_app(app: web.Application, stack: AsyncExitStack) -> str:
    """Serve an aiohttp app on 127.0.0.1 with an ephemeral port; returns its base URL."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return f"http://{host}:{port}"


@contextmanager
def running_stack(policy: Policy, *, max_tokens: int = 512, chunk_tokens: int = 5) -> Iterator[Stack]:
    """Start engine and adapter; stop both (and the loop thread) on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="agent-test-servers", daemon=True)
    thread.start()
    exits = AsyncExitStack()
    engine = FakeEngine(policy, chunk_tokens=chunk_tokens)
    manager = TrajectoryManager(engine.tokenizer)

    async def start() -> tuple[str, str]:
        engine_url = await serve_app(engine.app(), exits)
        config = AdapterConfig(engine_url=engine_url, default_max_tokens=max_tokens, engine_timeout_s=10)
        adapter_url = await exits.enter_async_context(serve_adapter(manager, config))
        return engine_url, adapter_url

    try:
        engine_url, adapter_url = asyncio.run_coroutine_threadsafe(start(), loop).result(15)
        yield Stack(
            engine=engine,
            manager=manager,
            engine_url=engine_url,
            adapter_url=adapter_url,
            loop=loop,
        )
    finally:
        asyncio.run_coroutine_threadsafe(exits.aclose(), loop).result(15)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
    assert not OFF_LOOPBACK, f"tests tried to leave loopback: {OFF_LOOPBACK}"
