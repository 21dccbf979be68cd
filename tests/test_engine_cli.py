"""`python -m slime.backends.engine` as a real subprocess: serves, answers, stops on SIGTERM/SIGINT.

The model is the tiny Qwen2 built locally; the process binds 127.0.0.1 on a free port.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from slime.model.tiny import build_tiny_model

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
       "SLIME_CI_DEVICE": "cpu", "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error"}


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "model", seed=0)


def _start(*args):
    return subprocess.Popen([sys.executable, "-m", "slime.backends.engine", *map(str, args)], env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _post(url, body):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_serves_prints_its_url_and_stops_cleanly_on_a_signal(model, tmp_path, sig, code):
    proc = _start("--model-path", model, "--port", 0, "--weights-dir", tmp_path)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("serving http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
        url = line.removeprefix("serving ")
        out = _post(url + "/generate", {"input_ids": [1, 7, 14, 8, 16], "return_logprob": True,
                                        "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
        assert len(out["output_ids"]) == 3 and len(out["meta_info"]["output_token_logprobs"]) == 3
        info = json.loads(urllib.request.build_opener(urllib.request.ProxyHandler({}))
                          .open(url + "/get_server_info", timeout=30).read())
        assert info["pid"] == proc.pid and str(tmp_path) in info["weights_dirs"]
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == code
        assert proc.stdout.read().strip() == "stopped"
        assert "Traceback" not in proc.stderr.read()
        port = int(url.rsplit(":", 1)[1])
        with socket.socket() as s:  # the port is free again: nothing is left serving
            assert s.connect_ex(("127.0.0.1", port)) != 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def test_bad_arguments_are_one_line_and_exit_2(model, tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        cases = [
            (["--model-path", tmp_path / "nope"], "not a Hugging Face model directory"),
            (["--model-path", model, "--weights-dir", tmp_path / "nope"], "no such directory"),
            (["--model-path", model, "--port", 70000], "use 0..65535"),
            (["--model-path", model, "--port", busy.getsockname()[1]], "pass another --port"),
        ]
        for args, needle in cases:
            proc = _start(*args)
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 2, (args, err)
            lines = [x for x in err.splitlines() if x.strip()]
            assert len(lines) == 1 and needle in lines[0] and out == "", (args, err)
    finally:
        busy.close()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
