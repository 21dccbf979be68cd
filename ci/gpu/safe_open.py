"""Open lock files in world-writable directories (`/dev/shm`) without trusting what is there.

Any local user can create names in `/dev/shm`. A name planted there must never make us
write somewhere else or read something endless, so a lock file is opened:

- without following a symbolic link (`O_NOFOLLOW`), and created only with `O_EXCL`;
- only if it is a regular file with one link (a hard link would be someone else's file);
- only if it belongs to us, to root, or to the owner of its directory (the kernel's own
  rule for `protected_regular`): a file another user planted is refused, not used.

A refusal is a `LockFileRefused` (exit 2) naming the path and what to do.
Standard library only: `lock-gpus` must run in a container with nothing but Python.
"""

from __future__ import annotations

import errno
import os
import stat
from contextlib import suppress
from pathlib import Path

from ci.errors import UsageError

# Lock and queue files are shared by every user of the directory that trusts their owner
# (runners of several users on one host): set on creation, whatever the umask.
FILE_MODE = 0o666
# A waiter's ticket: everyone reads it to queue behind it, only its waiter writes it.
TICKET_MODE = 0o644
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # NONBLOCK: a planted FIFO never blocks


class LockFileRefused(UsageError):
    """A lock path that is a link, not a regular file, or another user's file."""


def trusted_owners(directory: str) -> set[int]:
    """Users whose lock files in `directory` we use: ourselves, root, the directory's owner."""
    owners = {os.geteuid(), 0}
    with suppress(OSError):
        owners.add(os.stat(directory).st_uid)
    return owners


def check_fd(fd: int, path: str) -> os.stat_result:
    """Refuse an open file that is not a plain, singly linked file of a trusted owner."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise LockFileRefused(f"{path} is not a regular file; remove it (lock files are plain "
                              "files) or pass another --lock-path-pattern")
    if st.st_nlink != 1:
        raise LockFileRefused(f"{path} has {st.st_nlink} hard links, so it may be another file; "
                              "remove it or pass another --lock-path-pattern")
    # Our own or root's file (the common case) needs no look at the directory.
    if st.st_uid not in (os.geteuid(), 0) and st.st_uid not in trusted_owners(
            os.path.dirname(path) or "."):
        raise LockFileRefused(f"{path} belongs to uid {st.st_uid}, not to you (uid "
                              f"{os.geteuid()}), root or the directory's owner; remove it, or "
                              "pass a --lock-path-pattern in a directory of your own")
    return st


def _refuse(path: str, exc: OSError) -> UsageError:
    if exc.errno == errno.ELOOP:
        return LockFileRefused(f"{path} is a symbolic link; lock files are never opened through "
                               "a link: remove it (someone may be aiming the lock at another file)")
    return UsageError(f"{path}: cannot open the lock file ({exc.strerror}); pass a "
                      "--lock-path-pattern in a directory you can write")


def _make_parent(path: str) -> None:
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{path}: cannot create its directory ({exc.strerror}); pass a "
                         "--lock-path-pattern in a directory you can write") from None


def open_lock(path: str, *, create: bool = True) -> int:
    """A checked descriptor of the lock file at `path`, read-write where we may write it.

    `create=False`: a missing file raises FileNotFoundError (it means "free"). Every other
    problem is one UsageError naming the path.
    """
    for _ in range(8):  # a file created or removed by another process between two tries
        try:
            fd = os.open(path, os.O_RDWR | _NOFOLLOW)
        except FileNotFoundError:
            if not create:
                raise
            _make_parent(path)
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _NOFOLLOW, FILE_MODE)
            except FileExistsError:
                continue
            except OSError as exc:
                raise _refuse(path, exc) from None
            # The mode, not the umask, decides who may use a new lock file: with umask 022
            # another user who trusts its owner could only open it read-only, and their
            # first queue write failed with "Bad file descriptor".
            with suppress(OSError):
                os.fchmod(fd, FILE_MODE)
        except PermissionError:
            # A trusted user's file without write permission for us: flocks work read-only.
            try:
                fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _refuse(path, exc) from None
        except OSError as exc:
            raise _refuse(path, exc) from None
        try:
            check_fd(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return fd
    raise UsageError(f"{path}: the lock file keeps appearing and disappearing; is another "
                     "program removing lock files?")


def read_capped(fd: int, limit: int) -> bytes | None:
    """The file's content, or None when it is longer than `limit` (nobody else's size)."""
    data = os.pread(fd, limit + 1, 0)
    return None if len(data) > limit else data
