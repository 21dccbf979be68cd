"""Shared helpers for the toolkit tests: write test files into a checkout, run `python -m ci`."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PASSING = """
    import sys
    import pytest
    NUM_GPUS = 0

    def test_adds():
        assert 1 + 1 == 2

    if __name__ == "__main__":
        raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
"""


MAIN = '\nif __name__ == "__main__":\n    raise SystemExit(pytest.main([__file__, "-q"]))\n'


def code(body: str) -> str:
    """A pytest file: the dedented body and the `__main__` block that runs it."""
    return textwrap.dedent(body).strip("\n") + "\n" + MAIN


def write(root: Path, files: Mapping[str, str]) -> Path:
    """Write dedented files under root; returns root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return root


def run_ci(*args: str, cwd: Path | None = None, env: Mapping[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `python -m ci ARGS` as a user would, from the repository's own code."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    full_env.pop("GITHUB_ACTIONS", None) if "GITHUB_ACTIONS" not in (env or {}) else None
    return subprocess.run([sys.executable, "-m", "ci", *args], cwd=cwd or REPO, env=full_env,
                          capture_output=True, text=True, timeout=timeout, check=False)


@contextlib.contextmanager
def loopback_server(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """Serve `handler` on a free loopback port in a thread; yields its base URL, then stops it."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
