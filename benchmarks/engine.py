"""Benchmark the rollout engine's HTTP layer: two server revisions side by side, and per-call costs.

    python benchmarks/engine.py [--baseline REV ...] [--concurrent 200] [--rounds 15] [--max-new-tokens 4]
    python benchmarks/engine.py --calls [--runs 5]

Default mode: the engine at `--baseline` (default 941447b, the last one served by
`http.server`) and the engine of this working tree each run in their own process on the
same tiny Qwen2, started once and warmed up; then, round after round, each gets a burst of
`--concurrent` one-prompt `/generate` requests sent at once over loopback (one connection
each), the sides taking turns to go first (old-new, new-old, ...) so a drift in the host's
load falls on both. Every request's latency and the server process's CPU time are recorded.
Printed: per side the median over the rounds of requests/s, p50/p99 latency and server CPU
ms per request, their ratios new/old, and the paired figure: the median over the rounds of
each round's own new/old ratio (with its range), steadier than a ratio of medians when the
host's load moves between rounds. On a busy host the CPU column is the steadier one, and
"cores used" (server CPU seconds over burst seconds) shows how much CPU each side was given:
an http.server engine, one thread per connection, is handed a larger share of a contended
CPU than one event loop and one worker thread are, whatever a request costs. Each
server runs with its own root as working directory and reports the package it imported,
so a side can never run the other side's code. `--baseline` given more than once (say the
last http.server revision and the revision before a change) runs every one of them in the
same rounds and prints new/each. `--calls`: the median latency of single calls (generate,
refits, release/resume) on this tree's engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = "941447b"
PROMPT = [1, 7, 14, 8, 16]
# The same launcher for both revisions: only the constructor and `.url` both have.
# It prints the URL and the directory its engine was imported from, which the parent checks.
_SERVE = """
import signal, sys, threading
from slime.backends.engine import EngineServer, server
srv = EngineServer(sys.argv[1], seed=0)
print(srv.start(), server.__file__, flush=True)
done = threading.Event()
signal.signal(signal.SIGTERM, lambda *a: done.set())
done.wait()
srv.stop()
"""


def _median(fn: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _snapshot(rev: str, dest: Path) -> Path:
    """The `slime/` package as it was at `rev`, extracted under `dest` (an importable root)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "slime"], capture_output=True, check=False)
    if archive.returncode != 0:
        raise SystemExit(f"git archive {rev} failed: {archive.stderr.decode().strip()}; pass --baseline REV")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


class _Served:
    """An engine of the package under `root`, in its own process, on a free loopback port."""

    def __init__(self, root: Path, model: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(root), "HF_HUB_DISABLE_PROGRESS_BARS": "1",
               "TRANSFORMERS_VERBOSITY": "error"}
        # `python -c` puts its working directory first on sys.path: started from a checkout,
        # every side would import that checkout's `slime` whatever PYTHONPATH says.
        self.proc = subprocess.Popen([sys.executable, "-c", _SERVE, str(model)], env=env, cwd=root,
                                     stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        self.url, _, imported = self.proc.stdout.readline().strip().partition(" ")
        if not self.url.startswith("http://"):
            self.stop()
            raise SystemExit(f"the engine under {root} did not start")
        if not Path(imported).resolve().is_relative_to(root.resolve()):
            self.stop()
            raise SystemExit(f"the engine meant to run from {root} imported {imported}")

    def cpu_seconds(self) -> float:
        """User + system CPU time the server process has used (less noisy than wall time on a busy host)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def _burst(url: str, n: int, params: dict[str, object]) -> tuple[float, list[float]]:
    """(wall seconds, per-request latencies) of `n` requests sent at once, one connection each."""
    import aiohttp

    body = {"input_ids": PROMPT, "sampling_params": params, "return_logprob": True}
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as http:
        async def one() -> float:
            start = time.perf_counter()
            async with http.post(f"{url}/generate", json=body) as resp:
                answer = await resp.json()
                if resp.status != 200 or len(answer["output_ids"]) != params["max_new_tokens"]:
                    raise SystemExit(f"{url}: HTTP {resp.status}: {answer}")
            return time.perf_counter() - start

        start = time.perf_counter()
        latencies = await asyncio.gather(*(one() for _ in range(n)))
        return time.perf_counter() - start, list(latencies)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


Row = tuple[float, float, float, float, float]  # req/s, p50 s, p99 s, server CPU s per request, cores used


def _order(names: list[str], round_no: int) -> list[str]:
    # Each side goes first as often as any other: the first burst of a round meets whatever
    # the host was doing in between, and a fixed order would hand that to one side.
    shift = round_no % len(names)
    return names[shift:] + names[:shift]


def compare(args: argparse.Namespace) -> int:
    """Old and new HTTP layer, taking turns per round; prints one row per side and the ratios."""
    params = {"max_new_tokens": args.max_new_tokens, "ignore_eos": True, "temperature": 1.0}
    with tempfile.TemporaryDirectory() as tmp:
        from slime.model.tiny import build_tiny_model

        model = build_tiny_model(Path(tmp) / "m", seed=0)
        baselines = args.baseline or [BASELINE]
        sides = {f"old ({rev})": _snapshot(rev, Path(tmp) / f"old{i}") for i, rev in enumerate(baselines)}
        sides["new (this tree)"] = ROOT
        rows: dict[str, list[Row]] = {name: [] for name in sides}
        served: dict[str, _Served] = {}
        try:
            for name, root in sides.items():
                served[name] = _Served(root, model)
                asyncio.run(_burst(served[name].url, 8, params))  # warm-up: first batches pay setup
            for round_no in range(args.rounds):
                for name in _order(list(sides), round_no):
                    cpu = served[name].cpu_seconds()
                    wall, lat = asyncio.run(_burst(served[name].url, args.concurrent, params))
                    cpu = served[name].cpu_seconds() - cpu
                    rows[name].append((args.concurrent / wall, _percentile(lat, 0.5), _percentile(lat, 0.99),
                                       cpu / args.concurrent, cpu / wall))
                    print(f"round {round_no + 1} {name}: {args.concurrent / wall:.1f} req/s, "
                          f"{cpu / args.concurrent * 1000:.2f} CPU ms/req", flush=True)
        finally:
            for one in served.values():
                one.stop()
    _report(args, baselines, rows)
    return 0


def _report(args: argparse.Namespace, baselines: list[str], rows: dict[str, list[Row]]) -> None:
    print(f"\n{args.concurrent} concurrent /generate, {args.max_new_tokens} new tokens, "
          f"median of {args.rounds} rounds")
    # Cores used: the server's CPU seconds over the burst's wall seconds. Below one core on a
    # busy host, a side was waiting for a CPU, not working: its req/s says how much CPU the
    # scheduler gave it, and CPU ms/req what a request costs.
    print(f"{'server':<24} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/req':>11} {'cores used':>11}")
    for name, values in rows.items():
        rps, p50, p99, cpu, cores = (statistics.median(v[i] for v in values) for i in range(5))
        print(f"{name:<24} {rps:8.1f} {p50 * 1000:8.1f} {p99 * 1000:8.1f} {cpu * 1000:11.2f} {cores:11.2f}")
    *olds, new = rows.values()
    for rev, old in zip(baselines, olds, strict=True):
        label = "new/old" if len(olds) == 1 else f"new/{rev}"

        def ratio(i: int, old: list[Row] = old) -> float:
            return statistics.median(n[i] for n in new) / statistics.median(o[i] for o in old)

        def paired(i: int, old: list[Row] = old) -> str:
            each = [n[i] / o[i] for n, o in zip(new, old, strict=True)]
            return f"{statistics.median(each):.2f} ({min(each):.2f}-{max(each):.2f})"

        print(f"{label}: req/s {ratio(0):.2f}, p50 {ratio(1):.2f}, p99 {ratio(2):.2f}, "
              f"server CPU per request {ratio(3):.2f}")
        print(f"{label} paired (median of per-round ratios, range): req/s {paired(0)}, "
              f"p50 {paired(1)}, CPU per request {paired(3)}")


def calls(args: argparse.Namespace) -> int:
    """Median latency of single calls on this tree's engine (in this process)."""
    from safetensors.torch import load_file

    from slime.backends.engine import EngineClient, EngineServer
    from slime.model.tiny import build_tiny_model

    params = {"max_new_tokens": args.max_new_tokens, "ignore_eos": True}
    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_model(Path(tmp) / "m", seed=0)
        other = build_tiny_model(Path(tmp) / "o", seed=1)
        tensors = load_file(str(other / "model.safetensors"))
        with EngineServer(model, seed=0, weights_dirs=[tmp]) as server:
            client = EngineClient(server.url)
            client.generate(PROMPT, params)  # first call pays one-off setup
            n = 64

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
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", action="append", metavar="REV",
                        help=f"revision whose engine is 'old' (default {BASELINE}); repeat to compare several")
    parser.add_argument("--concurrent", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--max-new-tokens", type=int, default=4)
    parser.add_argument("--calls", action="store_true", help="time single calls on this tree's engine instead")
    parser.add_argument("--runs", type=int, default=5, help="with --calls: runs per row")
    args = parser.parse_args(argv)
    if min(args.concurrent, args.rounds, args.max_new_tokens, args.runs) < 1:
        parser.error("--concurrent, --rounds, --max-new-tokens and --runs must be >= 1")
    return calls(args) if args.calls else compare(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main(sys.argv[1:]))
