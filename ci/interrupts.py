"""SIGINT and SIGTERM for a run: never lost, never raised where they can do harm.

Two modes. While a run is being planned, a signal raises KeyboardInterrupt (nothing
has started; the command ends with 130). Once entries may run, a signal is only
recorded: the run's main loop polls it, stops every running group and still writes
its report. No KeyboardInterrupt is raised then, so none can land inside a lock, a
`waitid` retry, a worker hand-off or the clean-up itself and leave the run stuck.

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
        self.deferring = False
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # An attribute write and a read: safe whatever the main thread was doing.
        first = self.signum is None
        if first:
            self.signum = signum
        # Raised once: a second signal must not break into the unwinding of the first.
        if first and not self.deferring:
            raise KeyboardInterrupt

    def install(self) -> bool:
        """Take SIGINT and SIGTERM (main thread only; returns False elsewhere). Idempotent."""
        if self._previous:
            return True
        if threading.current_thread() is not threading.main_thread():
            return False
        for sig in SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return True

    def defer(self) -> None:
        """From now on a signal is recorded, not raised."""
        self.deferring = True

    @property
    def received(self) -> bool:
        return self.signum is not None

    def exit_code(self, code: int) -> int:
        """`code`, or 130 when the run was interrupted."""
        return EXIT_INTERRUPTED if self.received else code

    def restore(self) -> None:
        """Give the signals back to whoever had them (a library caller, a test)."""
        for sig, handler in self._previous.items():
            if handler is not None:  # None: set outside Python; nothing to give back
                signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()


# The `run` command's: installed by `python -m ci` before the command's modules are even
# imported, so the window in which a signal meets Python's defaults is as short as it can be.
PROCESS = Interrupts()
