"""The engine's HTTP layer under the attacks measured against its `http.server` predecessor.

Each test speaks raw HTTP/1.1 over a real loopback socket to a real `EngineServer` (the tiny
Qwen2 built locally), so malformed framing reaches the server exactly as written: partial
heads, slow bodies, bad and negative Content-Length with a pipelined request behind it, a
50 MB body, NaN, deep JSON, unhashable tags, wrong methods, weight paths outside the
engine's directories, more connections than allowed.
"""

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from slime.backends.engine import EngineServer
from slime.backends.engine.server import Limits
from slime.model.tiny import build_tiny_model

NUM_GPUS = 0

PROMPT = [1, 7, 14, 8, 16]
LIMITS = Limits(max_body_bytes=4 * 1024 * 1024, header_timeout_s=0.5, body_timeout_s=0.5, max_connections=256)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    return {"a": build_tiny_model(root / "weights" / "a", seed=0),
            "b": build_tiny_model(root / "weights" / "b", seed=1),
            "outside": build_tiny_model(root / "outside", seed=2)}


@pytest.fixture(scope="module")
def server(models):
    with EngineServer(models["a"], weights_dirs=[models["a"].parent], limits=LIMITS) as srv:
        yield srv


def _address(srv):
    host, port = srv.url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def _connect(srv, timeout=10.0):
    sock = socket.create_connection(_address(srv), timeout=timeout)
    sock.settimeout(timeout)
    return sock


def _read_all(sock):
    """Every byte the server sends until it closes the connection (or 10 s pass)."""
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        data += chunk
    return data


def _responses(data):
    """[(status, headers, parsed JSON body)] of every HTTP response in `data`."""
    out = []
    while data:
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", 0))
        body, data = rest[:length], rest[length:]
        out.append((status, headers, json.loads(body) if body else None))
    return out


def _exchange(srv, raw):
    with _connect(srv) as sock:
        sock.sendall(raw)
        return _responses(_read_all(sock))


def _post(path, body, extra=b""):
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n").encode() + extra + b"\r\n" + data


def _one_error(answers, status, needle):
    assert len(answers) == 1, answers
    got, headers, body = answers[0]
    assert got == status, answers
    assert headers["content-type"].startswith("application/json")
    assert body["success"] is False and needle in body["message"], body
    return body


def test_keep_alive_still_serves_two_requests_on_one_connection(server):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    with _connect(server) as sock:
        sock.sendall(_post("/generate", body) + _post("/generate", body) + _post(
            "/generate", body, b"Connection: close\r\n"))
        answers = _responses(_read_all(sock))
    assert [a[0] for a in answers] == [200, 200, 200]
    assert all(len(a[2]["output_ids"]) == 2 for a in answers)


def test_partial_heads_are_dropped_after_the_head_timeout(server):
    socks = [_connect(server) for _ in range(50)]
    for s in socks:
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Len")
    start = time.monotonic()
    # A well-formed request is served meanwhile.
    assert _exchange(server, _post("/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}},
                                   b"Connection: close\r\n"))[0][0] == 200
    for s in socks:
        assert _read_all(s) == b""  # closed by the server, not by our 10 s timeout
        s.close()
    assert time.monotonic() - start < 5.0


def test_a_body_that_never_arrives_is_a_408_within_the_body_timeout(server):
    with _connect(server) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"")
        start = time.monotonic()
        answers = _responses(_read_all(sock))
    assert time.monotonic() - start < 5.0
    _one_error(answers, 408, "did not arrive")


def test_a_content_length_over_the_cap_is_a_413_before_the_body_is_read(server):
    with _connect(server) as sock:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n{}")
        _one_error(_responses(_read_all(sock)), 413, "at most")


def _rss_bytes():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("chunked", [False, True])
def test_a_50_mb_body_is_refused_without_the_server_holding_it(server, chunked):
    body = b'{"input_ids": [' + b"1, " * (25 * 1024 * 1024 // 3) + b'1]}'
    before = _rss_bytes()
    with _connect(server) as sock:
        if chunked:
            sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        else:
            sock.sendall(f"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        try:
            for i in range(0, len(body), 1 << 20):
                piece = body[i:i + (1 << 20)]
                sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece) if chunked else piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        answers = _responses(_read_all(sock))
    _one_error(answers, 413, "bytes")
    # The old layer grew by ~430 MB reading such a body into a list; the cap is 4 MiB here.
    assert _rss_bytes() - before < 40 * 1024 * 1024


@pytest.mark.parametrize("length", [b"abc", b"-1", b"1e3", b"5, 6"])
def test_a_bad_content_length_is_a_400_and_the_pipelined_request_is_never_run(server, length):
    smuggled = b"POST /update_weight_version HTTP/1.1\r\nHost: x\r\nContent-Length: 21\r\n\r\n{\"new_version\": \"evil\"}"
    raw = b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n" + smuggled
    _one_error(_exchange(server, raw), 400, "bad request")
    assert server.engine.weight_version == "0"


def test_content_length_with_transfer_encoding_is_refused(server):
    raw = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n"
           b"0\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    _one_error(_exchange(server, raw), 400, "bad request")


@pytest.mark.parametrize(("body", "needle"), [
    (b'{"input_ids": [1, 7], "sampling_params": {"temperature": NaN}}', "NaN is not JSON"),
    (b'{"input_ids": [1, 7], "sampling_params": {"temperature": Infinity}}', "Infinity is not JSON"),
    (b'{"input_ids": [1, 7], "sampling_params": {"top_p": -Infinity}}', "-Infinity is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "nests 100000 levels"),
    (b'{"input_ids": [1, 7], "sampling_params": {"temperature": 1e400}}', "temperature must be a finite number"),
    (b'{"input_ids": [1, 7], "rid": "' + b"r" * 100_000 + b'"}', "rid must be a string of at most"),
    (b'{"input_ids": [1, 7], "sampling_params": {"max_new_tokens": 1' + b"0" * 5000 + b"}}", "not JSON"),
    (b'\xff\xfe{"input_ids": [1]}', "not UTF-8"),
])
def test_bodies_python_json_would_take_are_400(server, body, needle):
    answers = _exchange(server, _post("/generate", body, b"Connection: close\r\n"))
    _one_error(answers, 400, needle)


def test_unhashable_tags_are_400_not_500(server):
    answers = _exchange(server, _post("/release_memory_occupation", {"tags": [["x"]]}, b"Connection: close\r\n"))
    _one_error(answers, 400, "tags must be a list")
    assert server.engine.released is False


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_a_wrong_method_is_a_405_json_naming_the_allowed_one(server, method):
    raw = f"{method} /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}".encode()
    body = _one_error(_exchange(server, raw), 405, "use POST")
    assert body["error"]["code"] == 405


def test_unknown_paths_are_a_404_json(server):
    raw = b"GET /../../etc/passwd HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    _one_error(_exchange(server, raw), 404, "no endpoint")


def _refit(server, path):
    answers = _exchange(server, _post("/update_weights_from_disk", {"model_path": str(path)},
                                      b"Connection: close\r\n"))
    assert len(answers) == 1
    return answers[0][0], answers[0][2]


def test_weights_load_only_from_the_engine_s_directories_and_say_nothing_about_others(server, models,
                                                                                      tmp_path):
    weights = models["a"].parent
    link = weights / "link_out"
    if not link.exists():
        link.symlink_to(models["outside"])
    refused = [
        "../../../../etc", "/etc", "/nonexistent/model", str(models["outside"]),  # a real model, outside
        str(weights / "missing"), str(link), str(weights / ".." / "outside"), str(models["a"] / "config.json"),
        "", "a\x00b",
    ]
    answers = {p: _refit(server, p) for p in refused}
    messages = {body["message"] for status, body in answers.values() if status == 400}
    assert all(status == 400 for status, _ in answers.values()), answers
    assert len(messages) == 1 and "--weights-dir" in messages.pop()
    assert server.engine.weight_version == "0" and server.engine.model_path == str(models["a"])
    # What lies inside does load.
    status, body = _refit(server, weights / "b")
    assert status == 200 and body["success"] is True
    status, body = _refit(server, models["a"])
    assert status == 200


def test_connections_over_the_bound_get_a_503_json(models):
    limits = Limits(max_connections=4, header_timeout_s=30.0)
    with EngineServer(models["a"], limits=limits) as srv:
        held = [_connect(srv) for _ in range(4)]
        try:
            time.sleep(0.2)  # the server has accepted them all
            with _connect(srv) as extra:
                _one_error(_responses(_read_all(extra)), 503, "holds 4 connections")
        finally:
            for s in held:
                s.close()
        time.sleep(0.2)
        answers = _exchange(srv, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert [a[0] for a in answers] == [200]


def test_200_concurrent_generates_all_answer(server):
    body = {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, "ignore_eos": True}}
    results = []

    def one():
        results.append(_exchange(server, _post("/generate", body, b"Connection: close\r\n"))[0][0])

    threads = [threading.Thread(target=one) for _ in range(200)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [200] * 200


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
