"""The namespace-host fixture (`_netns_hosts.py`) itself: its interface names fit the
kernel's 15 characters for any pid, and its clean-up signals only the process groups whose
leader it started and still holds, never a group id it used once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/toolkit: the shared helpers
import _netns_hosts
from _netns_hosts import IFNAMSIZ, Host, NetnsCluster, cluster_prefix, ifname, probe_name

from ci.proc import alive

NUM_GPUS = 0
PID_MAX = 4194304  # the largest pid_max Linux allows


@pytest.mark.parametrize("pid", [1, 99999, 100000, 123456, PID_MAX])
def test_every_interface_name_fits_for_any_pid(pid: int) -> None:
    for n in (0, 35, 36, 1295):  # the counter, up to 2 base-36 digits
        probe = probe_name(pid, n)
        assert len(f"{probe}a") <= IFNAMSIZ, probe
        for host in range(10):
            assert len(f"{cluster_prefix(pid, n)}h{host}s") <= IFNAMSIZ
    assert len({cluster_prefix(p, 0) for p in range(90000, 110000)}) == 20000  # still distinct
    with pytest.raises(RuntimeError, match="longer than 15"):
        ifname("x" * 16)


@pytest.mark.skipif(os.geteuid() != 0 or not Path(_netns_hosts.IP).exists(),
                    reason="network namespaces need root and iproute2")
def test_the_probe_works_when_the_pid_has_seven_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    # With pid >= 100000 the probe's veth name had 16 characters: `ip` refused it, and every
    # host test skipped as if this machine had no namespaces.
    if _netns_hosts.unavailable():
        pytest.skip(f"no namespaces here at all: {_netns_hosts.unavailable()}")
    monkeypatch.setattr(_netns_hosts.os, "getpid", lambda: PID_MAX - 1)
    assert _netns_hosts.unavailable() == ""


def _host(root: Path) -> Host:
    return Host(index=1, ns="unused", address="10.213.0.2", hostname="h1", shm=root, home=root,
                temp=root, log=root / "log")


def test_clean_up_ends_its_live_groups_and_never_a_group_whose_leader_it_reaped() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = NetnsCluster(prefix="unused", root=root / "cluster")
        host = _host(root)
        cluster.hosts.append(host)
        # A node's group, live: it must end.
        live = subprocess.Popen(["sleep", "120"], start_new_session=True)
        # A group id used once: its leader exited and was reaped, and a process of that
        # group (here a stand-in for anyone's) lives on. Reaped, the id is no longer ours to
        # signal: it could as well be a group the kernel handed to someone else since.
        old = subprocess.Popen(["sh", "-c", "sleep 120 & echo $!"], start_new_session=True,
                               stdout=subprocess.PIPE, text=True)
        assert old.stdout is not None
        stranger = int(old.stdout.readline())
        old.wait()
        old.stdout.close()
        host.leaders += [old, live]
        host.past_groups += [old.pid, live.pid]
        try:
            cluster.stop()
            assert alive(stranger), "the clean-up signalled a group whose leader it no longer held"
            assert not alive(live.pid) and live.wait(5) == -signal.SIGTERM
            assert host.leaders == []
        finally:
            if alive(stranger):
                os.kill(stranger, signal.SIGKILL)  # the process this test started
            live.kill()
            live.wait()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
