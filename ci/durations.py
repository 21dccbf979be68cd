"""The durations store: measured seconds per entry, kept between runs for ordering and sharding."""

from __future__ import annotations

import fcntl
import json
import math
import os
import stat
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path

from ci.errors import UsageError

# Where a checkout keeps measured durations (relative to its root); CI caches this file.
DURATIONS_FILE = ".ci-cache/durations.json"
# Committed seconds per entry (what a maintainer copied from a measured run's store): the
# run order of a fresh clone, whose store is empty, so that its longest files start first
# instead of in name order. Measured seconds, where there are any, always win.
BASELINE_FILES = (".slime-ci/durations.json", "tests/durations.json")
# Ours holds a few dozen bytes per entry; anything far bigger was not written by a run and
# is not read (a cache restored from elsewhere, a file someone put there).
MAX_BYTES = 16 * 1024 * 1024


def _usable(value: object) -> bool:
    # NaN and inf would make every comparison of the LPT order and the shard loads lie.
    # An integer past any float (400 digits) is no duration either: isfinite would raise.
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return math.isfinite(value) and value >= 0
    except OverflowError:
        return False


class DurationStore:
    """Measured seconds per entry id, kept between runs so plans can order and shard by them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, float]:
        """What was measured; a missing, unreadable or malformed store reads as empty."""
        try:
            # A regular file only: `--durations /dev/zero` or a FIFO would be read forever.
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            with os.fdopen(fd, "rb") as f:
                if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                    return {}
                raw = f.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                return {}
            data = json.loads(raw.decode("utf-8"))
        except (OSError, ValueError, RecursionError):  # `[[[[…`: too deep for the parser
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items() if _usable(v)}

    def update(self, measured: Mapping[str, float]) -> None:
        """Merge new measurements in; written atomically so concurrent runs never see half a file,
        and read, merged and written under a lock so that two runs ending together (the suites
        of `ci smoke`) both keep what they measured.

        A store that cannot be written is one UsageError, and no temporary file stays behind.
        """
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # The lock is the directory's own (flock on its descriptor): no lock file left.
            folder = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                fcntl.flock(folder, fcntl.LOCK_EX)
                data = self.load()
                data.update({k: round(v, 2) for k, v in measured.items() if _usable(v)})
                tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
                tmp.replace(self.path)
            finally:
                os.close(folder)  # and with it the lock
        except OSError as exc:
            with suppress(OSError):
                tmp.unlink()
            raise UsageError(f"cannot write the durations store {self.path} ({exc.strerror}); "
                             "remove what is in the way or pass --durations FILE") from None


def baseline(root: Path) -> dict[str, float]:
    """The committed durations of a checkout (BASELINE_FILES, the first that exists), or none."""
    for rel in BASELINE_FILES:
        if (root / rel).is_file():
            return DurationStore(root / rel).load()
    return {}
