"""Serve one engine on its own, as SGLang's `launch_server` does.

    python -m slime.backends.engine --model-path DIR [--host 127.0.0.1] [--port 30000]
        [--weights-dir DIR ...] [--device cpu|cuda] [--seed 0] [--max-batch-size 64]

Prints `serving http://HOST:PORT` once it answers, then serves until SIGINT (exit 130) or
SIGTERM (exit 0), stopping the server and the engine before it exits. Bad arguments: one
line on stderr, exit 2.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path

LOOPBACK = ("127.0.0.1", "::1", "localhost")


class _Usage(Exception):
    pass


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m slime.backends.engine",
                                description="Serve a rollout engine over SGLang's HTTP API.")
    p.add_argument("--model-path", required=True, help="Hugging Face model directory to serve")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default %(default)s)")
    p.add_argument("--port", type=int, default=30000, help="port (0: a free one; default %(default)s)")
    p.add_argument("--weights-dir", action="append", default=[], metavar="DIR",
                   help="a directory /update_weights_from_disk may load from (repeatable; "
                        "the model path always may)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None,
                   help="default: cuda when torch sees a GPU, else cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-batch-size", type=int, default=64)
    p.add_argument("--weight-version", default="0")
    return p


def _check(args: argparse.Namespace) -> None:
    model = Path(args.model_path)
    if not (model / "config.json").is_file():
        raise _Usage(f"--model-path {model}: not a Hugging Face model directory (no config.json)")
    for d in args.weights_dir:
        if not Path(d).is_dir():
            raise _Usage(f"--weights-dir {d}: no such directory")
    if not 0 <= args.port <= 65535:
        raise _Usage(f"--port {args.port}: use 0..65535")
    if args.max_batch_size < 1:
        raise _Usage(f"--max-batch-size {args.max_batch_size}: use 1 or more")
    if args.port:
        # Before the model loads (a minute on a big one): a taken port fails at once.
        try:
            with socket.create_server((args.host, args.port)):
                pass
        except OSError as exc:
            raise _Usage(f"cannot serve on {args.host}:{args.port}: {exc.strerror or exc}; "
                         "pass another --port") from None


def main(argv: list[str]) -> int:
    """Parse, start, serve until a signal; the exit code."""
    args = _parser().parse_args(argv)
    try:
        _check(args)
    except _Usage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from slime.backends.engine.actor import engine_device
    from slime.backends.engine.server import EngineServer

    if args.host not in LOOPBACK:
        print(f"warning: serving on {args.host}: the engine has no authentication; whoever reaches "
              "this port can generate, refit and release its weights", file=sys.stderr)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum: int, _frame: object) -> None:
        received.append(signum)
        stop.set()
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = EngineServer(args.model_path, device=args.device or engine_device(os.environ), seed=args.seed,
                          host=args.host, port=args.port, weight_version=args.weight_version,
                          max_batch_size=args.max_batch_size, weights_dirs=args.weights_dir)
    try:
        url = server.start()
    except OSError as exc:
        print(f"error: cannot serve on {args.host}:{args.port}: {exc.strerror or exc}; pass another --port",
              file=sys.stderr)
        return 2
    try:
        print(f"serving {url}", flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    print("stopped", flush=True)
    return 130 if received and received[0] == signal.SIGINT else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
