"""Run a function on N real gloo ranks (CPU processes) and collect what each returns.

Workers come from a forkserver that has imported torch once, so a 4-rank test
pays one torch import, not four. Rendezvous goes through a file under the
test's tmp_path: no TCP port, so test files can run side by side.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

_CTX = mp.get_context("forkserver")
_CTX.set_forkserver_preload(["torch", "torch.distributed"])


def _worker(
    fn: Callable[..., Any], rank: int, world_size: int, init_file: str, args: tuple[Any, ...], out: Any
) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # All ranks are local: bind to loopback instead of whatever the hostname resolves
    # to (in containers and CI runners that address is sometimes unreachable).
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    try:
        dist.init_process_group(
            "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
        )
        try:
            # Plain pickle copies tensors by value. The queue's own pickler would share their
            # storage through a socket this rank serves, and the rank exits right after the
            # put: a parent slow to read (a loaded machine) then finds the socket gone
            # (FileNotFoundError in multiprocessing.resource_sharer).
            out.put((rank, "ok", pickle.dumps(fn(rank, world_size, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException:
        out.put((rank, "error", traceback.format_exc()))


def run_ranks(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout: float = 60.0
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank of a fresh gloo group; results by rank."""
    init_file = tmp_path / f"gloo-init-{world_size}-{os.urandom(4).hex()}"
    out = _CTX.Queue()
    procs = [
        _CTX.Process(target=_worker, args=(fn, r, world_size, str(init_file), args, out))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world_size and not errors:
            try:
                rank, status, value = out.get(timeout=0.5)
            except queue.Empty:
                # A rank that died without reporting (killed, crashed in C) would
                # otherwise leave its peers waiting in a collective until the timeout.
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if dead:
                    errors.append(f"ranks {dead} died (exit codes {[procs[r].exitcode for r in dead]})")
                elif time.monotonic() > deadline:
                    missing = sorted(set(range(world_size)) - set(results))
                    errors.append(f"ranks {missing} gave no result in {timeout}s")
                continue
            if status == "ok":
                results[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}:\n{value}")
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def preload(*modules: str) -> None:
    """Also import `modules` once in the forkserver (call before the first `run_ranks`).

    A heavy import (transformers) then costs once per test file instead of once per rank.
    """
    _CTX.set_forkserver_preload(["torch", "torch.distributed", *modules])
