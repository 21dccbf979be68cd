"""Headless Chromium driven over its DevTools protocol (a WebSocket on loopback): load a page,
collect what its console and dialogs said, press keys, evaluate, take screenshots.

Debian's `chromium`; `browser()` is None without it (the callers skip and say so). The
browser runs in a process group of its own, ended by its id when the caller is done.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any


def browser() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Page:
    """One tab: `call` a protocol method; every event that came meanwhile is kept in `events`."""

    def __init__(self, ws: Any) -> None:
        self._ws = ws
        self._id = 0
        self.events: list[dict[str, Any]] = []

    async def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        await self._ws.send_str(json.dumps({"id": self._id, "method": method, "params": params}))
        mine = self._id
        while True:
            msg = await self._receive(60)
            if msg.get("id") == mine:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg.get("result", {}))

    async def _receive(self, timeout: float) -> dict[str, Any]:
        msg: dict[str, Any] = json.loads((await self._ws.receive(timeout=timeout)).data)
        if "id" not in msg:
            self.events.append(msg)
        if msg.get("method") == "Page.javascriptDialogOpening":
            # A dialog blocks the page until answered: dismiss it, and it stays a complaint.
            self._id += 1
            await self._ws.send_str(json.dumps({"id": self._id, "method": "Page.handleJavaScriptDialog",
                                                "params": {"accept": False}}))
        return msg

    async def wait_for(self, event: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while not any(e.get("method") == event for e in self.events[seen:]):
            await self._receive(max(0.1, deadline - time.monotonic()))

    async def open(self, url: str, *, width: int, height: int = 900) -> None:
        await self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                        deviceScaleFactor=1, mobile=width < 600)
        self.events.clear()
        await self.call("Page.navigate", url=url)
        await self.wait_for("Page.loadEventFired")

    async def value(self, expression: str) -> Any:
        result = await self.call("Runtime.evaluate", expression=expression, returnByValue=True,
                                 awaitPromise=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    async def key(self, key: str, code: int, *, shift: bool = False) -> None:
        for kind in ("keyDown", "keyUp"):
            await self.call("Input.dispatchKeyEvent", type=kind, key=key, code=key,
                            windowsVirtualKeyCode=code, modifiers=8 if shift else 0)

    async def screenshot(self, path: Path, *, full: bool = False) -> None:
        result = await self.call("Page.captureScreenshot", format="png", captureBeyondViewport=full)
        path.write_bytes(base64.b64decode(result["data"]))

    def complaints(self) -> list[str]:
        """Console errors, uncaught exceptions, failed loads and dialogs since the page opened."""
        out = []
        for e in self.events:
            method, params = e.get("method"), e.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert", "warning"):
                out.append(f"console.{params['type']}: {params.get('args')}")
            elif method == "Runtime.exceptionThrown":
                out.append(f"exception: {params.get('exceptionDetails', {}).get('text')}")
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") in ("error", "warning"):
                out.append(f"log: {params['entry'].get('text')} {params['entry'].get('url', '')}")
            elif method == "Page.javascriptDialogOpening":
                out.append(f"dialog: {params.get('type')} {params.get('message')!r}")
        return out


@contextlib.asynccontextmanager
async def chromium(profile: Path) -> AsyncIterator[Page]:
    """A headless Chromium on a free loopback port, and its first tab."""
    import aiohttp

    exe = browser()
    assert exe is not None, "no Chromium"
    port_file = profile / "DevToolsActivePort"
    port_file.unlink(missing_ok=True)  # a profile used before holds the port of a browser gone
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                             "--no-first-run", "--no-default-browser-check", f"--user-data-dir={profile}",
                             "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().count("\n") >= 1):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not open its DevTools port (exit {proc.poll()})")
            await asyncio.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                target = next(t for t in await resp.json() if t.get("type") == "page")
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                page = Page(ws)
                for domain in ("Page", "Runtime", "Log"):
                    await page.call(f"{domain}.enable")
                # A headless window never has the focus: without this, :focus matches nothing.
                await page.call("Emulation.setFocusEmulationEnabled", enabled=True)
                yield page
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the group we started, by its id
        proc.wait(timeout=30)
