"""Pre-imported workers: per-file isolation for CPU pytest entries without re-importing torch.

A worker is one interpreter per runner slot that imports the suite's heavy modules
once (pytest, numpy, torch and the suite's `preload`), runs no test and starts no
thread, then forks a fresh child per test file. The child is a full entry: its own
session and process group, the entry's whole environment, cwd, TMPDIR and log, and
`pytest.main` with the argv a fresh interpreter would get. What a file does to its
interpreter (modules planted in `sys.modules`, env vars, cwd, threads, globals) dies
with the child, so the next file starts from the worker's clean state.

The runner talks to a worker over a pipe, one JSON line per message:

    runner                               worker
    {"preload": [...]}               ->
                                     <-  {"ready": true, "preloaded": [...]}
    {"op": "run", "args": ..., ...}  ->
                                     <-  {"pid": N}   or   {"refused": "why"}
                                     <-  {"exited": true}   (child exited, not yet reaped)
    {"op": "reap"}                   ->
                                     <-  {"returncode": R}

The child stays unreaped until the runner says "reap", so the runner may signal the
child's process group (timeout, Ctrl-C) exactly as it does a fresh interpreter's: the
pid cannot be reused while the group is being killed. EOF on the pipe (the runner
died) or the parent-death signal makes the worker kill the child's group and exit.

This file also runs as the worker itself (`python ci/backends/prefork.py RUNNER_PID`), so at
run time it imports only the standard library and `ci.proc` (standard library only too).
"""

from __future__ import annotations

import ctypes
import gc
import importlib
import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import traceback
import types
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

try:
    from ci.proc import signal_group
except ModuleNotFoundError:  # run as the worker script where the toolkit is not on the path
    sys.path.append(str(Path(__file__).resolve().parents[2]))
    try:
        from ci.proc import signal_group
    finally:
        sys.path.pop()  # the children's sys.path stays what a fresh interpreter's would be

Mode = Literal["prefork", "fresh"]

# Imported by every worker; a suite adds its own (`Suite.preload`). Only modules no test
# stubs: a preloaded module is already in `sys.modules` when a test file starts.
BASE_PRELOAD: tuple[str, ...] = ("pytest", "numpy", "torch")

# Variables an interpreter or a native library reads once, at start or at import: an
# entry that sets them differently from its worker must start its own interpreter.
_STARTUP_VARS = re.compile(
    r"^(PYTHON(?!UNBUFFERED$)\w*|LD_\w+|LANG|LC_\w+|\w*_NUM_THREADS|OMP_\w+|KMP_\w+|GOMP_\w+"
    r"|MKL_\w+|OPENBLAS_\w+|MALLOC_\w+|CUDA_\w+|TORCH_\w+)$"
)
_PR_SET_PDEATHSIG = 1
READY_TIMEOUT = 300.0  # seconds a worker may take to import its preload
_CHILD_CRASHED = 70  # EX_SOFTWARE: the child failed before or around pytest itself


@dataclass(frozen=True, kw_only=True)
class Policy:
    """Whether a run may use pre-imported workers, and what they import."""

    preload: tuple[str, ...] = BASE_PRELOAD
    off: str = ""  # non-empty: every entry of the run uses a fresh interpreter, for this reason


FRESH_ONLY = Policy(preload=(), off="pre-imported workers not enabled for this run")


@dataclass(frozen=True, kw_only=True)
class Choice:
    """How one entry's process starts: forked from a worker, or a fresh interpreter (and why)."""

    mode: Mode
    why: str = ""

    def describe(self) -> str:
        return "prefork" if self.mode == "prefork" else f"fresh ({self.why})"


def startup_vars(env: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if _STARTUP_VARS.match(k)}


def pytest_args(argv: Sequence[str], python: str) -> list[str] | None:
    """The arguments after `python -m pytest`, or None when argv is not such a command."""
    if len(argv) >= 3 and argv[0] == python and list(argv[1:3]) == ["-m", "pytest"]:
        return list(argv[3:])
    return None


def can_fork(platform: str = sys.platform) -> bool:
    # Linux only: the worker relies on the parent-death signal and /proc; macOS frameworks
    # are not fork-safe after import.
    return platform.startswith("linux") and hasattr(os, "fork")


def choose(*, policy: Policy, kind: str, num_gpus: int, opted_in: bool, backend: str,
           may_fork: bool, argv: Sequence[str], python: str, env: Mapping[str, str],
           worker_env: Mapping[str, str], platform: str = sys.platform) -> Choice:
    """Pure: does this entry run forked from a pre-imported worker, and if not, why.

    `may_fork`: the backend's entries are plain processes of this host (`backend` names it).
    """
    fresh: str | None = None
    if policy.off:
        fresh = policy.off
    elif not can_fork(platform):
        fresh = f"no fork() on {platform}"
    elif kind != "pytest":
        fresh = "script entry: judged by its own exit code"
    elif num_gpus:
        fresh = "GPU entry: CUDA must never be initialised before a fork"
    elif not opted_in:
        fresh = "opted out in the registry"
    elif not may_fork:
        fresh = f"runs on the {backend} backend"
    elif pytest_args(argv, python) is None:
        fresh = "not a `python -m pytest` command"
    else:
        mine, theirs = startup_vars(env), startup_vars(worker_env)
        differ = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        if differ:
            fresh = f"sets {', '.join(differ[:3])}, read when an interpreter starts"
    return Choice(mode="fresh", why=fresh) if fresh is not None else Choice(mode="prefork")


# ---------------------------------------------------------------------------------------
# Runner side


class ForkedChild:
    """A test file's process, forked by a worker; waited for without reaping, then reaped."""

    def __init__(self, worker: Worker, pid: int) -> None:
        self.worker = worker
        self.pid = pid
        self._exited = False

    def wait_exited(self) -> None:
        """Block until the child has exited; it stays unreaped, so its pid stays ours."""
        reply = self.worker.receive()
        self._exited = reply is not None and bool(reply.get("exited"))

    def reap(self) -> int:
        if not self._exited:
            # The worker is gone; its death signal killed the child. Report it as killed.
            return -int(signal.SIGKILL)
        self.worker.send({"op": "reap"})
        reply = self.worker.receive()
        if reply is None or "returncode" not in reply:
            return -int(signal.SIGKILL)
        return int(reply["returncode"])


class Worker:
    """Runner side of one pre-imported worker process (one per runner slot)."""

    def __init__(self, *, python: str, root: Path, env: Mapping[str, str],
                 preload: Sequence[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as err:
            self._proc = subprocess.Popen(
                [python, str(Path(__file__).resolve()), str(os.getpid())], cwd=root, env=dict(env),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                # Its own session: a terminal's Ctrl-C reaches the runner, which decides.
                start_new_session=True,
            )
        self.send({"preload": list(preload)})
        reply = self.receive(timeout=READY_TIMEOUT)
        self.error = "" if reply is not None and reply.get("ready") else (
            (reply or {}).get("error") or f"the worker did not get ready (see {log})")
        if self.error:
            self.close(timeout=0)
        self.preloaded: list[str] = list((reply or {}).get("preloaded", []))

    @property
    def pid(self) -> int:
        return self._proc.pid

    def send(self, message: Mapping[str, Any]) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(message).encode() + b"\n")
            self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            pass  # the worker is gone; the next receive() says so

    def receive(self, timeout: float | None = None) -> dict[str, Any] | None:
        """The next message; None when the worker has gone (or stayed silent past timeout)."""
        assert self._proc.stdout is not None
        if timeout is not None and not select.select([self._proc.stdout], [], [], timeout)[0]:
            return None
        line = self._proc.stdout.readline()
        if not line:
            return None
        value: dict[str, Any] = json.loads(line)
        return value

    def start(self, args: Sequence[str], *, env: Mapping[str, str], cwd: Path,
              log: Path) -> ForkedChild | str:
        """Fork a child running `pytest.main(args)`; a string says why the worker refused."""
        if self.error:
            return self.error
        self.send({"op": "run", "args": list(args), "env": dict(env), "cwd": str(cwd),
                   "log": str(log)})
        reply = self.receive()
        if reply is None:
            self.error = f"the worker exited (see {self.log})"
            return self.error
        if "pid" not in reply:
            return str(reply.get("refused", "refused"))
        return ForkedChild(self, int(reply["pid"]))

    def close(self, timeout: float = 5.0) -> None:
        """EOF ends the worker (and kills a child it still has); kill it if it lingers."""
        if self._proc.stdin is not None:
            with suppress(OSError):
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._proc.stdout is not None:
            with suppress(OSError):
                self._proc.stdout.close()


class Slots:
    """One worker per runner thread, started on the thread's first pre-forked entry.

    Per thread on purpose: a worker's parent-death signal fires when the thread that
    started it ends, and a worker serves one entry at a time.
    """

    def __init__(self, *, python: str, root: Path, env: Mapping[str, str],
                 preload: Sequence[str], logs: Path, note: Callable[[str], None]) -> None:
        self._python, self._root, self._env, self._preload = python, root, dict(env), tuple(preload)
        self._logs, self._note = logs, note
        self._local = threading.local()
        self._lock = threading.Lock()
        self._workers: list[Worker] = []
        self._noted: set[str] = set()

    def _note_once(self, text: str) -> None:
        with self._lock:
            if text in self._noted:
                return
            self._noted.add(text)
        self._note(text)

    def _worker(self) -> Worker | None:
        worker: Worker | None = getattr(self._local, "worker", None)
        if worker is None:
            self._logs.mkdir(parents=True, exist_ok=True)
            worker = Worker(python=self._python, root=self._root, env=self._env,
                            preload=self._preload,
                            log=self._logs / f"worker-{threading.current_thread().name}.log")
            with self._lock:
                self._workers.append(worker)
            self._local.worker = worker
            if worker.error:
                self._note_once(f"      pre-imported worker unavailable ({worker.error}); "
                                "using fresh interpreters")
        return None if worker.error else worker

    def fork(self, argv: Sequence[str], *, env: Mapping[str, str], log: Path) -> ForkedChild | None:
        """This thread's worker forks `argv` (a `python -m pytest` command); None: run it fresh."""
        args = pytest_args(argv, self._python)
        worker = self._worker() if args is not None else None
        if worker is None or args is None:
            return None
        child = worker.start(args, env=env, cwd=self._root, log=log)
        if isinstance(child, str):
            self._note_once(f"      pre-imported worker refused to fork ({child}); "
                            "using a fresh interpreter")
            return None
        return child

    def release(self) -> None:
        """End this thread's worker (EOF: it exits), when the thread is done with entries."""
        worker: Worker | None = getattr(self._local, "worker", None)
        if worker is not None:
            worker.close()

    def close(self) -> None:
        """End every worker (the run is over)."""
        with self._lock:
            workers, self._workers = self._workers, []
        for worker in workers:
            worker.close()


# ---------------------------------------------------------------------------------------
# Worker side (this file run as a script)


class _Stop(Exception):
    """The runner went away: EOF on the pipe or the parent-death signal."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop


def _set_parent_death_signal(sig: int) -> None:
    """Ask the kernel to send `sig` when our parent thread exits (Linux prctl)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


class _Pipe:
    """JSON lines over two raw descriptors (never sys.stdout: imports may print)."""

    def __init__(self, rfd: int, wfd: int) -> None:
        self.rfd, self.wfd = rfd, wfd
        self._buf = b""

    def read(self) -> dict[str, Any] | None:
        while b"\n" not in self._buf:
            chunk = os.read(self.rfd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        value: dict[str, Any] = json.loads(line)
        return value

    def write(self, message: Mapping[str, Any]) -> None:
        data = json.dumps(message).encode() + b"\n"
        while data:
            data = data[os.write(self.wfd, data):]


def _os_threads() -> int:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _fork_hazard() -> str:
    """Why forking now would be unsafe, or "" — a forked child keeps only the calling thread."""
    if threading.active_count() != 1:
        return f"{threading.active_count()} Python threads in the worker"
    if _os_threads() != 1:
        return f"{_os_threads()} native threads in the worker"
    return ""


def _park_native_pools() -> None:
    """Fork once and discard the child: pools that stop themselves at fork (OpenBLAS stops
    its threads in a pthread_atfork handler) are then gone from the worker, and any thread
    that is still there is one that does not, which `_fork_hazard` refuses."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


def _load_pytest_plugins() -> None:
    """Import pytest's plugins once, as pytest itself would: through its rewrite hook.

    `pytest --version --version` parses the configuration, which loads every installed
    plugin, lists them and runs nothing (a single `--version` stops before the plugins).
    Each child then finds the plugins imported by the hook, so pytest does not warn that
    they were imported too early, and the child skips ~0.7 s of plugin imports (more
    where bytecode is not cached: pytest rewrites plugins on import).
    """
    pytest = importlib.import_module("pytest")
    pytest.main(["--version", "--version"])


def _preload(names: Sequence[str]) -> tuple[list[str], str]:
    loaded: list[str] = []
    if "pytest" in names and importlib.util.find_spec("pytest") is not None:
        try:
            _load_pytest_plugins()
        except Exception as exc:
            return loaded, f"loading pytest's plugins failed: {type(exc).__name__}: {exc}"
    for name in names:
        if importlib.util.find_spec(name) is None:
            continue  # not in this profile: nothing to pre-import
        try:
            importlib.import_module(name)
        except Exception as exc:
            return loaded, f"preloading {name} failed: {type(exc).__name__}: {exc}"
        loaded.append(name)
    return loaded, ""


def _wait_exited(pid: int, pipe: _Pipe) -> None:
    """Until the child has exited (unreaped). The runner says nothing meanwhile, so a
    readable pipe means EOF: the runner has gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = -1
    try:
        while os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
            fds = [pipe.rfd] + ([pidfd] if pidfd >= 0 else [])
            ready, _, _ = select.select(fds, [], [], 1.0 if pidfd >= 0 else 0.05)
            if pipe.rfd in ready:
                raise _Stop
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _run_one(request: Mapping[str, Any], pipe: _Pipe) -> None:
    hazard = _fork_hazard()
    if hazard:
        pipe.write({"refused": hazard})
        return
    sys.stdout.flush()
    sys.stderr.flush()
    worker = os.getpid()
    pid = os.fork()
    if pid == 0:
        _child(request, pipe, worker)
    try:
        pipe.write({"pid": pid})
        _wait_exited(pid, pipe)
        signal_group(pid, signal.SIGKILL)  # whatever the file left behind in its group
        pipe.write({"exited": True})
        if pipe.read() is None:
            raise _Stop
    finally:
        signal_group(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    pipe.write({"returncode": os.waitstatus_to_exitcode(status)})


def _child(request: Mapping[str, Any], pipe: _Pipe, worker: int) -> NoReturn:
    """The forked child: become a fresh entry, run pytest, exit. Never returns."""
    code = _CHILD_CRASHED
    try:
        os.setsid()
        _set_parent_death_signal(signal.SIGKILL)  # the worker's death ends the file
        if os.getppid() != worker:
            raise SystemExit(_CHILD_CRASHED)  # it died before the signal was armed
        os.close(pipe.rfd)
        os.close(pipe.wfd)
        fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        code = _become_entry_and_run(request)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        _exit(code)


def _become_entry_and_run(request: Mapping[str, Any]) -> int:
    import tempfile

    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # computed from the worker's TMPDIR if anything asked already
    os.chdir(request["cwd"])
    sys.path[0] = request["cwd"]  # what `python -m pytest` run in cwd puts first
    args = list(request["args"])
    # `__main__` as `python -m pytest` has it: multiprocessing's spawn and forkserver
    # re-import `__main__` by its spec in their children, and must not import this file.
    spec = importlib.util.find_spec("pytest.__main__")
    main = types.ModuleType("__main__")
    main.__spec__ = spec
    main.__file__ = spec.origin if spec is not None else None
    main.__dict__["__builtins__"] = __builtins__
    sys.modules["__main__"] = main
    sys.argv = [main.__file__ or "pytest", *args]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        # Each fresh interpreter seeds the legacy global generator anew; recent numpy
        # reseeds it after a fork itself, older releases leave every child the same draws.
        numpy.random.seed()
    _match_torch_threads(sys.modules.get("torch"), os.environ.get("OMP_NUM_THREADS", ""))
    pytest = importlib.import_module("pytest")
    return int(pytest.main(args))


def _match_torch_threads(torch: Any, threads: str) -> None:
    """Give torch the entry's intra-op thread count, and only when it has another.

    The worker imported torch with the same OMP_NUM_THREADS (`choose` forks only such
    entries), so torch already has it, as in a fresh interpreter. Calling
    `torch.set_num_threads(n)` with n > 1 anyway creates torch's pthreadpool of n - 1
    threads, which a fresh interpreter does not have and which comes back in every fork
    of the child: a one-slot run (n = the machine's cores) then started each file with
    a thread that made its gloo rank zygote refuse to fork.
    """
    if torch is None or not threads.isdigit() or int(threads) < 1:
        return
    if torch.get_num_threads() != int(threads):
        torch.set_num_threads(int(threads))


def _exit(code: int) -> NoReturn:
    """Finish as an interpreter would (join threads, atexit), then leave without unwinding
    into the worker's frames."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()  # non-daemon threads keep a fresh interpreter alive too
        import atexit

        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    except BaseException:
        pass
    os._exit(code & 0xFF if code >= 0 else _CHILD_CRASHED)


def serve(runner_pid: int) -> int:
    """The worker's main loop: preload, then fork one child per request until EOF."""
    rfd, wfd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    os.dup2(2, 1)  # whatever an import prints goes to the worker's log, not the protocol
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _raise_stop)
    _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != runner_pid:
        return 1  # the runner died before the death signal was armed
    sys.path[0] = os.getcwd()  # as for `python -m`, not this file's directory
    pipe = _Pipe(rfd, wfd)
    try:
        hello = pipe.read()
        if hello is None:
            return 0
        loaded, error = _preload(hello.get("preload", []))
        if not error:
            _park_native_pools()
            gc.freeze()  # imported objects stay shared with the children instead of copied
        pipe.write({"ready": not error, "error": error, "preloaded": loaded})
        if error:
            return 1
        while (request := pipe.read()) is not None:
            if request.get("op") == "run":
                _run_one(request, pipe)
    except (_Stop, BrokenPipeError):
        return 0
    return 0


def _main(argv: Sequence[str]) -> int:
    if len(argv) != 1 or not argv[0].isdigit():
        print("usage: python ci/backends/prefork.py RUNNER_PID (started by the runner)", file=sys.stderr)
        return 2
    return serve(int(argv[0]))


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

