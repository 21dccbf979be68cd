"""`--rollout-backend sglang`: a real SGLang server in place of our engine, reached by the same client.

Where the `sglang` package is installed (a GPU machine), `launch_sglang_server` starts
`python -m sglang.launch_server --model-path … --host … --port …` in its own process group
and waits for `/health`. It cannot run here (no GPU, no sglang), so no CPU test exercises it;
what the CPU tier does test is that `EngineClient` speaks the API subset SGLang documents.
Differences to keep in mind: SGLang's initial weight version is "default", and its
`/update_weights_from_tensor` takes its own serialisation, not our `safetensors_base64`.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slime.backends.engine.client import EngineClient
from slime.utils.external_utils.proc_utils import stop_group


@dataclass(frozen=True, kw_only=True)
class SGLangServer:
    """A running `sglang.launch_server` process and its URL."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def stop(self, grace: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it after `grace` seconds, then reap the server."""
        stop_group(self.process.pid, grace, finished=self._exits_within)
        self.process.wait()

    def _exits_within(self, seconds: float) -> bool:
        try:
            self.process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True


def sglang_argv(model_path: str, *, host: str, port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The launch command line (pure)."""
    return [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_path),
            "--host", host, "--port", str(port), *extra_args]


def launch_sglang_server(model_path: str, *, port: int, host: str = "127.0.0.1",
                         extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                         log_path: str | Path, timeout: float = 600.0) -> SGLangServer:
    """Start SGLang on `host:port` and wait until it is healthy; raises when sglang is not installed."""
    if importlib.util.find_spec("sglang") is None:
        raise RuntimeError("--rollout-backend sglang needs the sglang package; install it (GPU machine) "
                           "or use the default engine")
    log = Path(log_path)
    with log.open("wb") as fh:
        proc = subprocess.Popen(sglang_argv(model_path, host=host, port=port, extra_args=extra_args),
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=dict(env) if env is not None else None, start_new_session=True)
    server = SGLangServer(url=f"http://{host}:{port}", process=proc, log_path=log)
    try:
        EngineClient(server.url).wait_healthy(timeout=timeout, interval=2.0)
    except BaseException:
        server.stop(grace=10)
        raise
    return server


class SGLangActor:
    """The Ray actor of `--rollout-backend sglang`: holds an engine bundle, runs SGLang on it.

    Ray sets CUDA_VISIBLE_DEVICES to the bundle's GPU, which the server process inherits;
    it shares the interface of `EngineActor` (`start() -> url`, `info()`, `stop()`), so the
    loop's `EngineGroup` drives either. Colocated runs need SGLang's memory saver
    (`--enable-memory-saver`) for release/resume; pass it through `extra_args`.
    """

    def __init__(self, model_path: str, *, seed: int = 0, device: str | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        del device  # SGLang picks its device from CUDA_VISIBLE_DEVICES
        self.model_path = model_path
        self.extra_args = ("--random-seed", str(seed), *extra_args)
        self.server: SGLangServer | None = None

    def start(self) -> str:
        """Launch the server on a free loopback port; its URL once healthy."""
        import socket
        import tempfile

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log = Path(tempfile.mkdtemp(prefix="sglang-")) / "server.log"
        self.server = launch_sglang_server(self.model_path, port=port, extra_args=self.extra_args,
                                           log_path=log)
        return self.server.url

    def info(self) -> dict[str, object]:
        """What `/get_server_info` does not say: the server's pid and log."""
        if self.server is None:
            return {"started": False}
        return {"url": self.server.url, "pid": self.server.process.pid, "log": str(self.server.log_path)}

    def stop(self) -> None:
        """Stop the server's whole process group."""
        if self.server is not None:
            self.server.stop()
            self.server = None
