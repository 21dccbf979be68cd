"""A coverage.py plugin that writes each process's measurements every fraction of a second.

`run --record-executed` copies this file beside its rcfile, puts that directory on every
entry's PYTHONPATH and names it in the rcfile's `plugins`, so coverage loads it in every
process it measures. A process that exits cleanly writes its data at exit anyway; one that
never exits cleanly would lose it all: a Ray actor ended by `ray.kill` leaves through the
core worker's immediate exit, with no atexit and no signal. Here a daemon thread calls
`Coverage.save()` whenever the process ran code since the last write (coverage >= 7.13
flushes while other threads trace, and an idle check costs nothing), so such a process
loses at most the last `interval` seconds. It must import nothing but the standard library
and coverage: it runs in processes that have neither the toolkit nor the repository.
"""

from __future__ import annotations

import atexit
import os
import threading
from typing import Any

DEFAULT_INTERVAL = 0.2  # seconds between writes of a busy process
_started: set[int] = set()  # pids whose flusher runs (a forked child starts its own)
# Set when the process begins to exit: the flusher stops before the interpreter tears its
# modules down (a daemon thread still writing then can crash the process: entries that had
# passed their checks ended with SIGSEGV at exit under recording), and a write in progress
# ends first (`_writing`). Coverage's own write at exit comes after.
_stopping = threading.Event()
_writing = threading.Lock()


def _flush_forever(interval: float) -> None:
    import coverage

    while not _stopping.wait(interval):
        cov = coverage.Coverage.current()
        if cov is None:
            continue
        with _writing:
            if _stopping.is_set():
                return
            try:
                cov.save()
            except Exception:  # a failed write must never break the measured process
                continue


def stop() -> None:
    """Stop this process's flusher and wait for a write in progress (at exit)."""
    _stopping.set()
    with _writing:
        pass


def start(interval: float) -> None:
    """Start this process's flusher once."""
    if os.getpid() in _started:
        return
    _started.add(os.getpid())
    threading.Thread(target=_flush_forever, args=(interval,), name="slime-ci-coverage-flush",
                     daemon=True).start()


def coverage_init(reg: Any, options: dict[str, str]) -> None:
    """coverage.py's plugin hook: registers nothing, starts the flusher."""
    del reg
    interval = float(options.get("interval", DEFAULT_INTERVAL))
    start(interval)
    os.register_at_fork(after_in_child=lambda: start(interval))
    # threading's exit hooks run before atexit's, so before coverage's own write at exit.
    register = getattr(threading, "_register_atexit", None)
    try:
        register(stop) if register is not None else atexit.register(stop)
    except RuntimeError:  # the interpreter is already shutting down: nothing more to write
        stop()
