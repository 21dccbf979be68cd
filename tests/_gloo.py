"""Run a function on N real gloo ranks (CPU processes) and collect what each returns.

Ranks are forked from a zygote: a copy of the test process taken once collection is over
(`tests/conftest.py`), before any test has run torch code, so the zygote holds every module
the test file imported and no thread. A rank then pays no import at all, and the test
process's own state after collection (what a test changes) never reaches a rank: the
zygote does nothing but fork. Where forking is unsafe (a native thread still runs after
the thread pools that stop at fork are parked) or unavailable, ranks come from a
multiprocessing forkserver that imports torch (and `preload`'s modules) once per file.

Rendezvous goes through a file under the test's tmp_path: no TCP port, so test files can
run side by side. Each rank writes its result (or its traceback) to a file there.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import os
import pickle
import queue
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

# Every rank needs these: imported here, the zygote holds them and no rank imports them again.
import torch
import torch.distributed  # noqa: F401

_CTX = mp.get_context("forkserver")
_PRELOAD = ["torch", "torch.distributed"]
_CTX.set_forkserver_preload(_PRELOAD)


def _setup_rank(rank: int, world_size: int, init_file: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    # All ranks are local: bind to loopback instead of whatever the hostname resolves
    # to (in containers and CI runners that address is sometimes unreachable).
    loopback = {"linux": "lo", "darwin": "lo0"}.get(sys.platform)
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)


def _run_rank(fn: Callable[..., Any], rank: int, world_size: int, init_file: str,
              args: tuple[Any, ...]) -> tuple[str, bytes | str]:
    import torch.distributed as dist

    try:
        _setup_rank(rank, world_size, init_file)
        try:
            # Plain pickle copies tensors by value (never shared storage a rank frees on exit).
            return "ok", pickle.dumps(fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException:
        return "error", traceback.format_exc()


# --- the fork zygote -------------------------------------------------------------------

def _send(fd: int, obj: Any) -> None:
    data = pickle.dumps(obj)
    data = struct.pack("!I", len(data)) + data
    while data:
        data = data[os.write(fd, data):]


def _read_exact(fd: int, n: int) -> bytes | None:
    buf = b""
    while len(buf) < n:
        chunk = os.read(fd, n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf


def _recv(fd: int) -> Any:
    head = _read_exact(fd, 4)
    if head is None:
        return None
    body = _read_exact(fd, struct.unpack("!I", head)[0])
    return None if body is None else pickle.loads(body)


def _rank_child(payload: bytes) -> None:
    """In a forked rank: run it, write its result file, exit without Python's cleanup."""
    code = 1
    try:
        fn, rank, world_size, init_file, args, out_path = pickle.loads(payload)
        # The rank's output goes to a file the test process shows under the test that ran it.
        log = os.open(f"{out_path}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        status, value = _run_rank(fn, rank, world_size, init_file, args)
        tmp = f"{out_path}.tmp"
        with open(tmp, "wb") as f:
            pickle.dump((status, value), f)
        os.replace(tmp, out_path)
        code = 0 if status == "ok" else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def _zygote_main(requests: int, events: int) -> None:
    """Fork a rank per request; report each rank's pid and exit code; kill only its own children."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C reaches the whole group: just go
    children: set[int] = set()
    try:
        while True:
            ready, _, _ = select.select([requests], [], [], 0.05)
            if ready:
                msg = _recv(requests)
                if msg is None:  # the test process is done (or gone)
                    return
                if msg[0] == "kill":
                    for pid in set(msg[1]) & children:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                else:
                    pid = os.fork()
                    if pid == 0:
                        os.close(requests)
                        os.close(events)
                        _rank_child(msg[1])
                    children.add(pid)
                    _send(events, ("started", pid))
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                children.discard(pid)
                _send(events, ("exited", pid, os.waitstatus_to_exitcode(status)))
    finally:
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for pid in children:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)


class _Zygote:
    def __init__(self) -> None:
        req_r, req_w = os.pipe()
        ev_r, ev_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                os.close(req_w)
                os.close(ev_r)
                _zygote_main(req_r, ev_w)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(req_r)
        os.close(ev_w)
        self.pid, self.requests, self.events = pid, req_w, ev_r
        self.exited: dict[int, int] = {}  # rank pid -> exit code, as the zygote reaped it
        self._started = 0  # pid of the rank the last request forked

    def _read_event(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.events], [], [], timeout)
        if not ready:
            return False
        msg = _recv(self.events)
        if msg is None:
            raise RuntimeError("the gloo rank zygote exited")
        if msg[0] == "exited":
            self.exited[msg[1]] = msg[2]
        else:
            self._started = msg[1]
        return True

    def spawn(self, payload: bytes) -> int:
        self._started = 0
        _send(self.requests, ("fork", payload))
        while not self._started:
            self._read_event(5.0)
        return self._started

    def wait(self, pids: list[int], timeout: float) -> None:
        """Until every pid has exited or `timeout` passed."""
        deadline = time.monotonic() + timeout
        while any(p not in self.exited for p in pids) and time.monotonic() < deadline:
            self._read_event(max(0.0, min(0.5, deadline - time.monotonic())))

    def kill(self, pids: list[int]) -> None:
        _send(self.requests, ("kill", [p for p in pids if p not in self.exited]))

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.requests)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self.events)


_ZYGOTE: _Zygote | None = None


def _native_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 0  # not Linux: unknown


def fork_hazard() -> str:
    """Why ranks cannot be forked from this process now, or ""."""
    if not hasattr(os, "fork") or sys.platform != "linux":
        return "no fork() with /proc here"
    import threading

    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads"
    if _native_threads() != 1:
        # OpenBLAS (numpy) parks its pool in a pthread_atfork handler: one throwaway fork
        # leaves only the threads that would not survive a fork, which are a hazard.
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    if _native_threads() != 1:
        return f"{_native_threads()} native threads"
    return ""


def start_zygote() -> str:
    """Fork the zygote now if that is safe; returns why not, or ""."""
    global _ZYGOTE  # noqa: PLW0603 - one per test process
    if _ZYGOTE is not None:
        return ""
    why = fork_hazard()
    if not why:
        _ZYGOTE = _Zygote()
    return why


def stop_zygote() -> None:
    global _ZYGOTE  # noqa: PLW0603
    if _ZYGOTE is not None:
        _ZYGOTE.close()
        _ZYGOTE = None


def _run_forked(zygote: _Zygote, fn: Callable[..., Any], world_size: int, init_file: str,
                out_dir: Path, args: tuple[Any, ...], timeout: float) -> tuple[dict[int, Any], list[str]]:
    out_dir.mkdir()
    pids = [zygote.spawn(pickle.dumps((fn, r, world_size, init_file, args, str(out_dir / f"rank{r}.pkl"))))
            for r in range(world_size)]
    results: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while len(results) + len(errors) < world_size:
            zygote.wait(pids, min(0.5, max(0.0, deadline - time.monotonic())))
            for r, pid in enumerate(pids):
                if r in results or pid not in zygote.exited:
                    continue
                path = out_dir / f"rank{r}.pkl"
                if path.exists():
                    status, value = pickle.loads(path.read_bytes())
                    if status == "ok":
                        results[r] = pickle.loads(value)
                    else:
                        errors.append(f"rank {r}:\n{value}")
            died = [r for r, p in enumerate(pids) if zygote.exited.get(p, 0) != 0
                    and not (out_dir / f"rank{r}.pkl").exists()]
            if died:
                errors.append(f"ranks {died} died (exit codes {[zygote.exited[pids[r]] for r in died]})")
            if errors:
                break
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(results))
                errors.append(f"ranks {missing} gave no result in {timeout}s")
                break
    finally:
        if errors:
            zygote.wait(pids, 0.5)  # a peer of a failed rank may be stuck in a collective
            zygote.kill(pids)
        zygote.wait(pids, 10.0)
        for r in range(world_size):
            log = out_dir / f"rank{r}.pkl.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if text:
                sys.stderr.write(f"--- output of gloo rank {r} ---\n{text}")
    return results, errors


# --- the forkserver fallback -------------------------------------------------------------

def _worker(
    fn: Callable[..., Any], rank: int, world_size: int, init_file: str, args: tuple[Any, ...], out: Any
) -> None:
    status, value = _run_rank(fn, rank, world_size, init_file, args)
    out.put((rank, status, value))


def _run_forkserver(fn: Callable[..., Any], world_size: int, init_file: str, args: tuple[Any, ...],
                    timeout: float) -> tuple[dict[int, Any], list[str]]:
    out = _CTX.Queue()
    procs = [
        _CTX.Process(target=_worker, args=(fn, r, world_size, init_file, args, out))
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
    return results, errors


def run_ranks(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout: float = 60.0
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank of a fresh gloo group; results by rank."""
    tag = f"{world_size}-{os.urandom(4).hex()}"
    init_file = str(tmp_path / f"gloo-init-{tag}")
    if _ZYGOTE is not None:
        results, errors = _run_forked(_ZYGOTE, fn, world_size, init_file, tmp_path / f"gloo-out-{tag}", args,
                                      timeout)
    else:
        results, errors = _run_forkserver(fn, world_size, init_file, args, timeout)
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world_size)]


def preload(*modules: str) -> None:
    """Import `modules` once for every rank of this file (call at import, before collection ends).

    They are imported here, so the zygote holds them; where the forkserver serves instead,
    it imports them too. A heavy import (transformers) then costs once per test file
    instead of once per rank.
    """
    for name in modules:
        importlib.import_module(name)
    _CTX.set_forkserver_preload([*_PRELOAD, *modules])
