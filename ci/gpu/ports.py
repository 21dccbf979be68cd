"""Port blocks: every GPU entry gets its own block of consecutive ports (Ray, torch.distributed).

The one owner of the block layout's numbers: the runner hands each entry
`SLIME_CI_PORT_BASE`, and the private Ray head (slime/utils/external_utils/ray_head.py)
lays its ports out inside a block of the same size, read from a generated copy of this
file (port_utils.py beside it; see ci/registry/u_files.py). Standard library only.
"""

from __future__ import annotations

import fcntl
import os
import stat
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

PORT_BLOCK = 200  # ports reserved per GPU entry (Ray head, dashboard, workers…)
PORT_FLOOR = 20000  # first port of GPU 0's block


def port_base(devices: Sequence[int], floor: int = PORT_FLOOR) -> int:
    """First port of the block of an entry holding `devices`: keyed by its lowest GPU id,
    which no concurrent entry of this host (real GPUs) or of this run (emulated) holds."""
    return floor + min(devices) * PORT_BLOCK


# Emulated runs start above the blocks real GPUs use and end below Linux's ephemeral range.
EMULATED_FLOOR = 24000
PORT_CEILING = 32768


@contextmanager
def claimed_floor(gpus: int, lock_dir: str | None = None) -> Iterator[int]:
    """First port of a range of `gpus` blocks that no other emulated run on this host uses.

    Real GPUs are exclusive on the host, so blocks keyed by GPU id never collide. Emulated
    GPUs are private to each run: two runs at once would both give GPU 0's block to an
    entry, and their Ray heads would fight over the ports. Each emulated run therefore
    holds a flock on every block of its range for as long as it runs.
    """
    # Host-wide, like the GPU lock files: runs with different TMPDIRs must see each other.
    directory = lock_dir or ("/dev/shm" if os.path.isdir("/dev/shm") else "/tmp")
    count = max(1, gpus)
    first = EMULATED_FLOOR
    while first + count * PORT_BLOCK <= PORT_CEILING:
        held = _lock_blocks(directory, first, count)
        if held is not None:
            try:
                yield first
            finally:
                for fd in held:
                    os.close(fd)
            return
        first += PORT_BLOCK
    yield EMULATED_FLOOR  # every range is taken: share, as before (Ray reports a busy port)


def _lock_block(path: str) -> int | None:
    # A name in /dev/shm may have been planted by another user: never follow a link, and
    # use only a plain, singly linked file of ours, root's or the directory's owner (the
    # rules of ci/gpu/safe_open.py, kept here in the standard library because U's copy of this
    # file runs without the toolkit). Anything else counts as a taken block.
    try:
        fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o666)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        owners = {os.geteuid(), 0, os.stat(os.path.dirname(path) or ".").st_uid}
        if stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid in owners:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _lock_blocks(directory: str, first: int, count: int) -> list[int] | None:
    held: list[int] = []
    for block in range(first, first + count * PORT_BLOCK, PORT_BLOCK):
        fd = _lock_block(os.path.join(directory, f"slime-ci-ports-{block}.lock"))
        if fd is None:
            for other in held:
                os.close(other)
            return None
        held.append(fd)
    return held
