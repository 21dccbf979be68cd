"""SIGINT and SIGTERM for a run: never lost, never raised where they can do harm.

A signal is only recorded. While a run is being planned, the session looks at the
record between steps (`check`) and ends the command with 130 before anything starts;
once entries may run, the run's main loop polls it, stops every running group and
still writes its report. No KeyboardInterrupt is ever raised by the signal itself, so
none can land inside a lock, a `waitid` retry, a worker hand-off, the clean-up, or
the `exec` that builds a dataclass during an import (CPython then marks the
interrupt unhandled, even once caught, and kills the process with SIGINT at exit).

Handlers are installed explicitly for both signals, whatever the process inherited:
a process started in the background by a non-interactive shell inherits SIGINT as
ignored, and Python then never turns it into KeyboardInterrupt, so a `kill -INT` of
such a runner was silently dropped.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

from ci.errors import EXIT_INTERRUPTED

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupts:
    """The signals a run has received; install once, on the main thread."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first signal received
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # An attribute write: safe whatever the main thread was doing when it came.
        if self.signum is None:
            self.signum = signum

    def install(self) -> bool:
        """Take SIGINT and SIGTERM (main thread only; returns False elsewhere). Idempotent."""
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    @property
    def received(self) -> bool:
        return self.signum is not None

    def check(self) -> None:
        """Raise KeyboardInterrupt here, at a step of our choosing, if a signal came."""
        if self.received:
            raise KeyboardInterrupt

    def exit_code(self, code: int) -> int:
        """`code`, or 130 when the run was interrupted."""
        return EXIT_INTERRUPTED if self.received else code

    def close(self) -> None:
        """The run is over and its exit code stands: ignore SIGINT/SIGTERM from here on.

        Python puts the default handlers back while it shuts down, and a signal then
        (a second Ctrl-C, a supervisor's follow-up SIGTERM) would kill the process and
        replace the exit code the run decided with death by signal.
        """
        if self._previous and threading.current_thread() is threading.main_thread():
            for sig in SIGNALS:
                signal.signal(sig, signal.SIG_IGN)

    def restore(self) -> None:
        """Give the signals back to whoever had them (a library caller, a test), and forget
        the one received: the next run starts with none."""
        self.signum = None
        for sig, handler in self._previous.items():
            if handler is not None:  # None: set outside Python; nothing to give back
                signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


# The `run` command's: installed by `python -m ci` before the command's modules are even
# imported, so the window in which a signal meets Python's defaults is as short as it can be.
PROCESS = Interrupts()
