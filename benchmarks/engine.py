"""Benchmark the rollout engine on CPU: per-call latencies over loopback HTTP, and what batching buys.

    python benchmarks/engine.py [--runs 5] [--concurrent 64] [--max-new-tokens 4]

Side by side in one run: 64 one-prompt requests sent one after another vs. sent at once
(the engine merges waiting requests into one batch), and one 64-prompt request; plus the
median latency of a single short generation, a refit from disk, a refit from tensors, a
release and a resume of the weights. The model is the tiny Qwen2 the e2e entries use.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from slime.backends.engine import EngineClient, EngineServer
from slime.model.tiny import build_tiny_model

PROMPT = [1, 7, 14, 8, 16]


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrent", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    args = parser.parse_args(argv)
    params = {"max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", seed=0)
        other = build_tiny_model(Path(tmp) / "o", seed=1)
        from safetensors.torch import load_file

        tensors = load_file(str(other / "model.safetensors"))
        with EngineServer(model, seed=0) as server:
            client = EngineClient(server.url)
            client.generate(PROMPT, params)  # first call pays one-off setup
            n = args.concurrent

            def sequential() -> None:
                for _ in range(n):
                    client.generate(PROMPT, params)

            def concurrent() -> None:
                threads = [threading.Thread(target=client.generate, args=(PROMPT, params)) for _ in range(n)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()

            rows = {
                "generate, 1 prompt": _median(lambda: client.generate(PROMPT, params), args.runs),
                f"generate, {n} prompts in one request": _median(lambda: client.generate([PROMPT] * n, params),
                                                                 args.runs),
                f"{n} one-prompt requests, sequential": _median(sequential, max(1, args.runs // 2)),
                f"{n} one-prompt requests, concurrent": _median(concurrent, max(1, args.runs // 2)),
                "update_weights_from_disk": _median(lambda: client.update_weights_from_disk(str(other)), args.runs),
                "update_weights_from_tensor (all)": _median(lambda: client.update_weights_from_tensor(tensors),
                                                            args.runs),
                "release + resume": _median(lambda: (client.release_memory_occupation(),
                                                     client.resume_memory_occupation()), args.runs),
                "get_weight_version": _median(client.weight_version, args.runs),
            }
    width = max(map(len, rows))
    for name, seconds in rows.items():
        print(f"{name:<{width}}  {seconds * 1000:9.1f} ms")
    seq, conc = rows[f"{n} one-prompt requests, sequential"], rows[f"{n} one-prompt requests, concurrent"]
    print(f"concurrent / sequential: {conc / seq:.2f} (batching makes this < 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
