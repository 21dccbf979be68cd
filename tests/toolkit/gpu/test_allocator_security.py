"""The GPU lock in a directory other users can write: what they plant there is refused or skipped.

A real second user (uid 65534 through `setpriv`) plants links, directories and files; the
lock runs as root, as CI runners often do. Without root there is no second uid to be, so
those tests skip.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci

from ci.errors import UsageError
from ci.gpu import allocator
from ci.gpu.ports import EMULATED_FLOOR, PORT_BLOCK, claimed_floor

NUM_GPUS = 0
NOBODY = 65534
SETPRIV = shutil.which("setpriv")

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(os.geteuid() != 0 or SETPRIV is None,
                       reason="needs root and setpriv to act as a second user (uid 65534)"),
]


def as_nobody(*argv: str) -> None:
    """Run a coreutils command as uid/gid 65534 with no groups (the other local user)."""
    assert SETPRIV is not None
    subprocess.run([SETPRIV, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv],
                   check=True, timeout=30)


@pytest.fixture
def shared() -> Iterator[Path]:
    """A directory every user may write, like /dev/shm, but not sticky: the kernel's
    protected_symlinks then does not stop a link from being followed, so only our code does."""
    path = Path(tempfile.mkdtemp(prefix="slime-ci-shared-", dir="/dev/shm"))
    path.chmod(0o777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text("precious\n")
    return path


def _lock(pattern: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return run_ci("lock-gpus", "--count", "1", "--total-gpus", "1", "--timeout", "10",
                  "--lock-path-pattern", pattern, *extra, "--", "true", timeout=60)


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("name", ["x_0.lock", "x_queue.lock"])
def test_a_planted_link_is_refused_and_its_target_untouched(shared: Path, victim: Path,
                                                            name: str) -> None:
    as_nobody("ln", "-s", str(victim), str(shared / name))
    proc = _lock(str(shared / "x_{gpu_id}.lock"))
    assert proc.returncode == 2, proc.stderr
    line = _one_line(proc.stderr)
    assert str(shared / name) in line and "symbolic link" in line
    assert victim.read_text() == "precious\n"


def test_a_file_another_user_planted_is_refused(shared: Path) -> None:
    as_nobody("touch", str(shared / "x_0.lock"))
    proc = _lock(str(shared / "x_{gpu_id}.lock"))
    assert proc.returncode == 2
    line = _one_line(proc.stderr)
    assert str(shared / "x_0.lock") in line and f"uid {NOBODY}" in line
    status = run_ci("gpu-status", "--total-gpus", "1", "--lock-path-pattern",
                    str(shared / "x_{gpu_id}.lock"))
    assert status.returncode == 2 and str(shared / "x_0.lock") in _one_line(status.stderr)


def test_a_ticket_directory_another_user_made_is_refused(shared: Path) -> None:
    # Its owner could remove anyone's ticket and so their place in the queue.
    as_nobody("mkdir", str(shared / "x_queue.lock.d"))
    proc = _lock(str(shared / "x_{gpu_id}.lock"))
    assert proc.returncode == 2
    assert f"{shared / 'x_queue.lock.d'} belongs to uid {NOBODY}" in _one_line(proc.stderr)


def _world_writable_queue(shared: Path) -> Path:
    """The ticket directory as a first run leaves it, then opened to everyone as a directory
    shared by several users' runners is (an older version made it 0777 itself)."""
    assert _lock(str(shared / "x_{gpu_id}.lock")).returncode == 0
    tickets = shared / "x_queue.lock.d"
    assert tickets.is_dir()
    tickets.chmod(0o777)
    return tickets


def test_what_another_user_puts_in_the_queue_is_skipped_and_reported(shared: Path,
                                                                     victim: Path) -> None:
    tickets = _world_writable_queue(shared)
    as_nobody("mkdir", str(tickets / "000000000000.json"))
    # The name the next request would take, aimed at a file of ours.
    as_nobody("ln", "-s", str(victim), str(tickets / "000000000002.json"))
    pattern = str(shared / "x_{gpu_id}.lock")
    proc = _lock(pattern)
    assert proc.returncode == 0, proc.stderr
    assert victim.read_text() == "precious\n"
    status = run_ci("gpu-status", "--total-gpus", "1", "--lock-path-pattern", pattern)
    assert status.returncode == 0, status.stderr
    assert f"ignored {tickets / '000000000000.json'}: not a regular file" in status.stdout
    assert f"ignored {tickets / '000000000002.json'}: a symbolic link" in status.stdout
    as_json = json.loads(run_ci("gpu-status", "--json", "--total-gpus", "1",
                                "--lock-path-pattern", pattern).stdout)
    assert len(as_json["ignored"]) == 2
    # And the directory is the owner's again: sticky, so nobody removes another's ticket.
    assert tickets.stat().st_mode & 0o7777 == 0o1777


def test_a_ticket_that_claims_an_earlier_place_is_not_a_ticket(shared: Path) -> None:
    pattern = str(shared / "x_{gpu_id}.lock")
    _world_writable_queue(shared)
    forged = shared / "x_queue.lock.d" / "000000000007.json"
    forged.write_text(json.dumps({"ticket": 0, "count": 1, "devices": None, "pid": 1}))
    fd = os.open(forged, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # held, so it is not dropped as a dead waiter's
        st = allocator.read_status(pattern, 1)
        assert st.waiters == ()
        assert st.ignored == (f"{forged}: not a ticket record",)
        with allocator.hold(count=1, total_gpus=1, lock_path_pattern=pattern, timeout=5) as lease:
            assert lease.devices == (0,)
    finally:
        os.close(fd)


def test_port_blocks_skip_a_planted_link(shared: Path, victim: Path) -> None:
    as_nobody("ln", "-s", str(victim), str(shared / f"slime-ci-ports-{EMULATED_FLOOR}.lock"))
    with claimed_floor(1, str(shared)) as first:
        assert first == EMULATED_FLOOR + PORT_BLOCK
    assert victim.read_text() == "precious\n"


def test_the_library_refuses_too(shared: Path, victim: Path) -> None:
    (shared / "x_0.lock").symlink_to(victim)
    with pytest.raises(UsageError, match="symbolic link"):
        allocator.acquire(count=1, total_gpus=1, lock_path_pattern=str(shared / "x_{gpu_id}.lock"),
                         timeout=1)
    assert victim.read_text() == "precious\n"
    assert not any((shared / "x_queue.lock.d").iterdir())  # its ticket was dropped on the way out


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
