"""Run a function under a wall-clock limit (symbolic simplification can take minutes)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


class TimeLimitExceeded(Exception):
    """The function did not return within its limit."""


class _Interrupt(BaseException):
    # A BaseException, so that `except Exception` inside the interrupted code
    # (sympy has several) cannot swallow the deadline.
    pass


def _raise_time_up(signum: int, frame: Any) -> None:
    raise _Interrupt


def call_with_time_limit(fn: Callable[..., T], seconds: float, *args: Any) -> T:
    """`fn(*args)`, or `TimeLimitExceeded` after `seconds`.

    In the main thread a real-time timer interrupts the work itself; elsewhere
    (signals only reach the main thread), or when someone else's timer is
    already armed (a test-timeout plugin), the call runs in a daemon thread
    that is abandoned when late.
    """
    if seconds <= 0:
        raise ValueError(f"time limit must be positive, got {seconds}")
    if (
        threading.current_thread() is threading.main_thread()
        and hasattr(signal, "setitimer")
        # Re-arming ITIMER_REAL would silently cancel an outer timer.
        and signal.getitimer(signal.ITIMER_REAL)[0] == 0
    ):
        previous = signal.signal(signal.SIGALRM, _raise_time_up)
        try:
            try:
                signal.setitimer(signal.ITIMER_REAL, seconds)
                return fn(*args)
            finally:
                # Nested so the handler is restored even if the alarm lands right here
                # (it is one-shot: it cannot land twice).
                try:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                finally:
                    signal.signal(signal.SIGALRM, previous)
        except _Interrupt:
            raise TimeLimitExceeded from None

    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # handed back to the caller below
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise TimeLimitExceeded
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]
