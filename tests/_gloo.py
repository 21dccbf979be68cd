"""Run a function on N real gloo ranks (CPU processes) and collect what each returns.

Ranks are forked from a zygote: a copy of the test process taken once collection is over
(`tests/conftest.py`), before any test has run torch code, so the zygote holds every module
the test file imported and no thread. A rank then pays no import at all, and the test
process's own state after collection (what a test changes) never reaches a rank: the
zygote does nothing but fork. Where forking is unsafe (a native thread still runs after
the thread pools that stop at fork are parked) or unavailable, ranks come from a
multiprocessing forkserver that imports torch (and `preload`'s modules) once per file;
its ranks are given the environment and cwd the test process had when collection ended,
so either way a rank sees the same world.

Each call gets a directory under the test's tmp_path: the gloo rendezvous file (no TCP
port, so test files can run side by side), each rank's output and its result (or its
traceback). The ranks' start and end are rendezvous through marker files there, outside
gloo: no rank runs `fn` until every rank has joined the group, and none leaves the group
until every rank's `fn` has returned. Without them a rank that finishes early (no
collective at all, or a last one it completed first) closes its connections while a peer
is still connecting or reading, and the peer fails with "Connection closed by peer".
A rank that fails writes its traceback before it leaves, so its error is reported even
when a peer fails on its departure first.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing as mp
import multiprocessing.connection
import os
import pickle
import select
import signal
import struct
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

# Every rank needs these: imported here, the zygote holds them and no rank imports them again.
import torch
import torch.distributed  # noqa: F401

_CTX = mp.get_context("forkserver")
START_TIMEOUT = 120.0  # seconds every rank may take to start (the forkserver imports torch)
_PRELOAD = ["torch", "torch.distributed"]
_CTX.set_forkserver_preload(_PRELOAD)
# The environment and cwd ranks start with: the test process's when collection ended
# (`start_zygote`), so a test's monkeypatching reaches no rank, however ranks are made.
_AS_COLLECTED: tuple[dict[str, str], str] = (dict(os.environ), os.getcwd())


# --- one rank --------------------------------------------------------------------------

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


def _rendezvous(run_dir: Path, phase: str, rank: int, world_size: int, timeout: float) -> None:
    """Return once every rank has reached `phase`: one marker file per rank, polled.

    Files, not a gloo barrier: a barrier's last message can still be in flight to a peer
    when the rank that sent it returns and closes its connections.
    """
    (run_dir / f"{phase}.{rank}").touch()
    deadline = time.monotonic() + timeout
    delay = 0.001
    while True:
        missing = [r for r in range(world_size) if not (run_dir / f"{phase}.{r}").exists()]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"ranks {missing} did not reach '{phase}' within {timeout}s")
        time.sleep(delay)
        delay = min(2 * delay, 0.02)


def _report(run_dir: Path, rank: int, status: str, value: bytes | str) -> None:
    tmp = run_dir / f"rank{rank}.pkl.tmp"
    tmp.write_bytes(pickle.dumps((status, value)))
    os.replace(tmp, run_dir / f"rank{rank}.pkl")  # atomic: the test process never reads half


def _run_rank(fn: Callable[..., Any], rank: int, world_size: int, run_dir: Path,
              args: tuple[Any, ...], timeout: float) -> int:
    """Join, run `fn`, leave; the result (or traceback) goes to the rank's file. Exit code."""
    import torch.distributed as dist

    try:
        _setup_rank(rank, world_size, str(run_dir / "init"))
        _rendezvous(run_dir, "joined", rank, world_size, timeout)
        # Plain pickle copies tensors by value (never shared storage a rank frees on exit).
        value = pickle.dumps(fn(rank, world_size, *args))
    except BaseException:
        # Reported before leaving the group: a peer may fail on our departure, and its
        # error must not be the only one the test sees.
        _report(run_dir, rank, "error", traceback.format_exc())
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        return 1
    try:
        _rendezvous(run_dir, "done", rank, world_size, timeout)
        if dist.is_initialized():  # `fn` may have left the group itself (a trainer's shutdown)
            dist.destroy_process_group()
    except BaseException:
        _report(run_dir, rank, "error", traceback.format_exc())
        return 1
    _report(run_dir, rank, "ok", value)
    return 0


def _rank_main(fn: Callable[..., Any], rank: int, world_size: int, run_dir: str,
               args: tuple[Any, ...], timeout: float) -> int:
    """In a rank's process: output to its log file, then the rank itself."""
    out = Path(run_dir)
    (out / f"started.{rank}").touch()
    # The rank's output goes to a file the test process shows under the test that ran it.
    log = os.open(out / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    try:
        return _run_rank(fn, rank, world_size, out, args, timeout)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


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
    """In a forked rank: run it, exit without Python's cleanup (the zygote's, not ours)."""
    code = 1
    try:
        code = _rank_main(*pickle.loads(payload))
    except BaseException:
        traceback.print_exc()
    finally:
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
    """At collection end: fork the zygote now if that is safe; returns why not, or "".

    Also takes the environment and cwd every rank of this file starts with.
    """
    global _ZYGOTE  # noqa: PLW0603 - one per test process
    if _ZYGOTE is not None:
        return ""
    global _AS_COLLECTED  # noqa: PLW0603
    _AS_COLLECTED = (dict(os.environ), os.getcwd())
    why = fork_hazard()
    if not why:
        _ZYGOTE = _Zygote()
    return why


def stop_zygote() -> None:
    global _ZYGOTE  # noqa: PLW0603
    if _ZYGOTE is not None:
        _ZYGOTE.close()
        _ZYGOTE = None


class _Ranks(Protocol):
    """A started set of ranks, however they were started."""

    def wait(self, timeout: float) -> None: ...  # until all have exited, or timeout
    def exit_codes(self) -> dict[int, int]: ...  # rank -> exit code, for those that exited
    def kill(self) -> None: ...


class _ForkedRanks:
    def __init__(self, zygote: _Zygote, payloads: list[bytes]) -> None:
        self.zygote = zygote
        self.pids = [zygote.spawn(p) for p in payloads]

    def wait(self, timeout: float) -> None:
        self.zygote.wait(self.pids, timeout)

    def exit_codes(self) -> dict[int, int]:
        return {r: self.zygote.exited[p] for r, p in enumerate(self.pids) if p in self.zygote.exited}

    def kill(self) -> None:
        self.zygote.kill(self.pids)


def _served_rank(env: dict[str, str], cwd: str, *rank: Any) -> None:
    """In a rank the forkserver made: the world as collected, the rank, exit."""
    code = 1
    try:
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        code = _rank_main(*rank)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


class _ServedRanks:
    def __init__(self, ranks: list[tuple[Any, ...]]) -> None:
        env, cwd = _AS_COLLECTED
        self.procs = [_CTX.Process(target=_served_rank, args=(env, cwd, *r)) for r in ranks]
        for p in self.procs:
            p.start()

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while (alive := [p.sentinel for p in self.procs if p.exitcode is None]):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            multiprocessing.connection.wait(alive, left)

    def exit_codes(self) -> dict[int, int]:
        return {r: p.exitcode for r, p in enumerate(self.procs) if p.exitcode is not None}

    def kill(self) -> None:
        for p in self.procs:
            if p.exitcode is None:
                p.kill()


def _read_result(run_dir: Path, rank: int) -> tuple[str, Any] | None:
    path = run_dir / f"rank{rank}.pkl"
    return pickle.loads(path.read_bytes()) if path.exists() else None


def _collect(ranks: _Ranks, world_size: int, run_dir: Path,
             timeout: float) -> tuple[dict[int, Any], list[str]]:
    results: dict[int, Any] = {}
    failed: dict[int, str] = {}
    errors: list[str] = []

    def scan() -> dict[int, int]:
        codes = ranks.exit_codes()  # before the files: a rank writes its file, then exits
        for r in range(world_size):
            if r in results or r in failed:
                continue
            got = _read_result(run_dir, r)
            if got is not None and got[0] == "ok":
                results[r] = pickle.loads(got[1])
            elif got is not None:
                failed[r] = f"rank {r}:\n{got[1]}"
        return codes

    # `timeout` counts from when every rank runs: a forkserver that is still importing
    # torch on a loaded machine must not eat a rank's time. Starting has its own limit.
    deadline = time.monotonic() + max(timeout, START_TIMEOUT)
    started = False
    try:
        while True:
            ranks.wait(min(0.2, max(0.0, deadline - time.monotonic())))
            codes = scan()
            died = [r for r, c in sorted(codes.items()) if c != 0 and r not in results and r not in failed]
            if died:
                errors.append(f"ranks {died} died (exit codes {[codes[r] for r in died]})")
            if failed or errors or len(results) == world_size:
                break
            if not started and all((run_dir / f"started.{r}").exists() for r in range(world_size)):
                started, deadline = True, time.monotonic() + timeout
            if time.monotonic() > deadline:
                missing = sorted(set(range(world_size)) - set(results))
                errors.append(f"ranks {missing} gave no result in {timeout}s" if started else
                              f"ranks {missing} did not start within {max(timeout, START_TIMEOUT)}s")
                break
    finally:
        if failed or errors:
            # A peer of a failed rank may be stuck in a collective or in the last rendezvous;
            # what the others say within a moment is kept, then they are stopped.
            ranks.wait(0.5)
            scan()
            ranks.kill()
        ranks.wait(10.0)
        if len(ranks.exit_codes()) < world_size:  # stuck in exit: no rank outlives its test
            ranks.kill()
            ranks.wait(5.0)
        for r in range(world_size):
            log = run_dir / f"rank{r}.log"
            text = log.read_text(errors="replace") if log.exists() else ""
            if text:
                sys.stderr.write(f"--- output of gloo rank {r} ---\n{text}")
    return results, [*(failed[r] for r in sorted(failed)), *errors]


def run_ranks(
    fn: Callable[..., Any], world_size: int, tmp_path: Path, *args: Any, timeout: float = 60.0
) -> list[Any]:
    """`fn(rank, world_size, *args)` on each rank of a fresh gloo group; results by rank."""
    run_dir = tmp_path / f"gloo-{world_size}-{os.urandom(4).hex()}"
    run_dir.mkdir()
    ranks = [(fn, r, world_size, str(run_dir), args, timeout) for r in range(world_size)]
    started: _Ranks
    if _ZYGOTE is not None:
        started = _ForkedRanks(_ZYGOTE, [pickle.dumps(r) for r in ranks])
    else:
        started = _ServedRanks(ranks)
    results, errors = _collect(started, world_size, run_dir, timeout)
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
