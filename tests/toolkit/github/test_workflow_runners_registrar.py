"""runners/registrar.py against a GitHub that answers badly and token files that are not files.

The real registrar runs as a process. Stand-ins, because this machine has neither: loopback
HTTP servers play GitHub's REST API (one answers 200 with no JSON, one echoes the request's
Authorization header into a 401, one redirects to a second loopback server that records
what reached it), and a `docker` script on PATH plays the docker CLI.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, loopback_server

NUM_GPUS = 0

REGISTRAR = REPO / "runners" / "registrar.py"
TOKEN = "github_pat_" + "Q7w8E9r0" * 4  # a fake admin token: never in a log line


def _github(answer: Callable[[BaseHTTPRequestHandler], tuple[int, dict[str, str], bytes]],
            seen: list[dict[str, str | None]]) -> type[BaseHTTPRequestHandler]:
    """A loopback stand-in for GitHub's REST API that answers every call with `answer`."""

    class Handler(BaseHTTPRequestHandler):
        def _any(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            self.rfile.read(length)
            seen.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization")})
            code, headers, body = answer(self)
            self.send_response(code)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        do_POST = do_DELETE = do_GET = _any

        def log_message(self, *args: object) -> None:
            pass

    return Handler


def _token_file(tmp_path: Path) -> Path:
    path = tmp_path / "admin.token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o600)
    return path


def _registrar(tmp_path: Path, api: str, token_file: Path, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "docker").write_text("#!/bin/sh\nexit 0\n")  # stand-in for the docker CLI: one job, done
    (bindir / "docker").chmod(0o755)
    return subprocess.run([sys.executable, str(REGISTRAR), "--repo", "acme/slime", "--token-file", str(token_file),
                           "--api-url", api, "--runners", "1", "--once"],
                          env={"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path)},
                          capture_output=True, text=True, timeout=timeout, check=False)


def _one_line_failure(done: subprocess.CompletedProcess[str], code: int, expect: str) -> None:
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert expect in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr and TOKEN not in done.stdout + done.stderr


def test_a_200_answer_that_is_not_json_fails_the_slot_and_once_exits_1(tmp_path: Path) -> None:
    seen: list[dict[str, str | None]] = []
    with loopback_server(_github(lambda _h: (200, {}, b"<html>maintenance</html>"), seen)) as api:
        done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "is not JSON")
    assert [s["method"] for s in seen] == ["POST"]


def test_a_slot_stopped_by_anything_unforeseen_still_fails_the_run(tmp_path: Path) -> None:
    # A configuration with a NUL byte: the docker CLI cannot even be started with it.
    answer = json.dumps({"runner": {"id": 7}, "encoded_jit_config": "one\u0000use"}).encode()
    seen: list[dict[str, str | None]] = []
    with loopback_server(_github(lambda h: (201, {}, answer) if h.command == "POST" else (204, {}, b""),
                                 seen)) as api:
        done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "slot 1: stopped by an unexpected ValueError")
    assert [s["method"] for s in seen] == ["POST", "DELETE"]  # the registration is still removed


def test_an_error_body_that_echoes_the_token_never_reaches_the_log(tmp_path: Path) -> None:
    def echo(handler: BaseHTTPRequestHandler) -> tuple[int, dict[str, str], bytes]:
        body = {"message": f"Bad credentials: {handler.headers['Authorization']}", "raw": dict(handler.headers)}
        return 401, {}, json.dumps(body).encode()

    seen: list[dict[str, str | None]] = []
    with loopback_server(_github(echo, seen)) as api:
        done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "GitHub answered 401 to POST /repos/acme/slime/actions/runners/generate-jitconfig")
    with loopback_server(_github(lambda _h: (403, {}, TOKEN.encode() + b" plain text"), seen)) as api:
        done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "GitHub answered 403")
    with loopback_server(_github(lambda _h: (422, {}, b'{"message": "Labels are invalid"}'), seen)) as api:
        done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "GitHub answered 422 to POST /repos/acme/slime/actions/runners/"
                               "generate-jitconfig: Labels are invalid")  # GitHub's own message stays


def test_a_redirect_to_another_host_never_gets_the_token(tmp_path: Path) -> None:
    elsewhere_seen: list[dict[str, str | None]] = []
    with loopback_server(_github(lambda _h: (200, {}, b"{}"), elsewhere_seen)) as elsewhere:
        seen: list[dict[str, str | None]] = []
        moved = _github(lambda h: (302, {"Location": f"{elsewhere}{h.path}"}, b""), seen)
        with loopback_server(moved) as api:
            done = _registrar(tmp_path, api, _token_file(tmp_path))
    _one_line_failure(done, 1, "GitHub answered 302")
    assert seen and elsewhere_seen == [], "the admin token followed a redirect to another host"


@pytest.mark.parametrize("kind", ["directory", "not utf-8", "fifo", "control characters"])
def test_a_token_path_that_is_no_token_file_is_one_line_and_exit_2(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "admin.token"
    if kind == "directory":
        path.mkdir(mode=0o700)
    elif kind == "fifo":
        os.mkfifo(path, 0o600)  # nobody writes it: opening it must not wait for a writer
    else:
        path.write_bytes(b"\xff\xfe\x00token" if kind == "not utf-8" else b"tok\x1b[31men\n")
        path.chmod(0o600)
    seen: list[dict[str, str | None]] = []
    with loopback_server(_github(lambda _h: (500, {}, b""), seen)) as api:
        done = _registrar(tmp_path, api, path, timeout=20)
    expect = {"directory": "not a regular file", "fifo": "not a regular file",
              "not utf-8": "not a UTF-8 text file", "control characters": "holds no single token"}[kind]
    _one_line_failure(done, 2, expect)
    assert not seen, "nothing may reach GitHub with a bad token file"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
