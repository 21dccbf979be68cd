"""Two runner slots brought up by runners/setup_slots.py: what a job of slot A can and cannot reach.

Real users, real subordinate ranges, real rootless Podman engines, real containers. A job
is what the runner container runs: a process of slot A's uid that holds slot A's engine
socket and nothing else. Each test runs the docker CLI as that uid, against that socket,
the way a job does, and tries one thing from docker-compose.yml's and docs/security.md's
table of what a job can touch. The slots are made once for the module, under /tmp (the
slot users must reach their homes: pytest's tmp_path is mode 700), with their own user
names, uids, subordinate ranges and GPU lock files, and removed at the end.

They need root, podman, newuidmap and the root filesystem tarball that
.ci/docker-engine.sh builds (the image the engines import: no registry is reachable
here); elsewhere they skip and say which was missing.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

NUM_GPUS = 0
SETUP = REPO / "runners" / "setup_slots.py"
sys.path.insert(0, str(SETUP.parent))
import setup_slots  # noqa: E402  (runners/ is no package: the script is its own module)

ROOTFS = Path(os.environ.get("SLIME_CI_DOCKER_ROOT", "/var/lib/slime-ci-docker")) / "rootfs-bookworm.tar"
IMAGE = "localhost/slime-ci-local:bookworm"
# What a job passes to `docker run` here: the engines' default bridge network needs
# /dev/net/tun, which only root may open on this machine (runners/README.md).
NET = ("--network", "none")


@dataclass(frozen=True)
class SlotView:
    index: int
    uid: int
    work: Path
    socket: Path


@dataclass(frozen=True)
class Slots:
    root: Path
    args: tuple[str, ...]  # the set-up's flags that name these slots
    a: SlotView
    b: SlotView
    lock_pattern: str
    root_only: Path  # a file only root may read
    host_socket: Path | None  # the root engine's socket, when one runs here


def _free_uid_base() -> int:
    for base in range(63000, 64000, 10):
        if all(setup_slots.uid_free(base + i) for i in (1, 2)):
            return base
    raise RuntimeError("no free uid pair between 63001 and 64000")


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root: runners/setup_slots.py creates users and starts their engines"
    for tool in ("podman", "newuidmap", "runc", "setpriv"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install podman uidmap runc util-linux)"
    if not ROOTFS.is_file():
        return f"no image tarball {ROOTFS}: run `bash .ci/docker-engine.sh` first"
    probe = subprocess.run(["unshare", "-U", "-r", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        return "user namespaces are not available here (unshare -U failed)"
    return None


def _setup(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SETUP), *args], capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.fixture(scope="module")
def slots() -> Iterator[Slots]:
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    token = uuid.uuid4().hex[:6]
    root = Path(tempfile.mkdtemp(prefix="slime-ci-slots-", dir="/tmp"))
    os.chmod(root, 0o755)
    uid_base = _free_uid_base()
    pattern = f"/dev/shm/slime-ci-slots-{token}_{{gpu_id}}.lock"
    args = ("--slots", "2", "--root", str(root), "--prefix", f"rlt{token}-", "--uid-base", str(uid_base),
            "--subid-base", str(setup_slots.subids_end(1_500_000_000)), "--gpus", "2", "--lock-path-pattern", pattern)
    try:
        up = _setup("up", *args, "--image-tar", str(ROOTFS))
        assert up.returncode == 0, up.stdout + up.stderr
        root_only = root / "root-only.txt"
        root_only.write_text("root's alone\n")
        os.chmod(root_only, 0o600)
        (root / "data" / "models" / "marker.txt").write_text("model bytes\n")
        host = Path("/var/run/docker.sock").resolve()
        views = [SlotView(index=i, uid=uid_base + i, work=root / "work" / str(i),
                          socket=Path(f"/run/user/{uid_base + i}/podman/podman.sock")) for i in (1, 2)]
        yield Slots(root=root, args=args, a=views[0], b=views[1], lock_pattern=pattern,
                    root_only=root_only, host_socket=host if host.is_socket() else None)
    finally:
        down = _setup("down", "--remove", *args)
        print(down.stdout + down.stderr)
        for path in Path("/dev/shm").glob(f"slime-ci-slots-{token}_*"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        shutil.rmtree(root, ignore_errors=True)


def as_slot(slot: SlotView, argv: Sequence[str], *, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run argv as the slot's uid with its engine socket: where a job of that slot stands."""
    env = {"PATH": os.environ["PATH"], "HOME": str(slot.work), "DOCKER_HOST": f"unix://{slot.socket}",
           "PYTHONPATH": str(REPO)}
    return subprocess.run(["setpriv", f"--reuid={slot.uid}", f"--regid={slot.uid}", "--clear-groups",
                           "--", *argv], env=env, cwd=str(slot.work), capture_output=True, text=True,
                          timeout=timeout, check=False)


def job_container(slot: SlotView, *flags: str, script: str) -> subprocess.CompletedProcess[str]:
    """`docker run` from the slot's job: a container on the slot's own engine."""
    return as_slot(slot, ["docker", "run", "--rm", *NET, *flags, IMAGE, "sh", "-c", script])


# ---- must succeed -------------------------------------------------------------------------

def test_a_job_runs_a_test_container_whose_root_is_the_slot_uid_outside(slots: Slots) -> None:
    done = job_container(slots.a, "-v", f"{slots.a.work}:{slots.a.work}",
                         script=f"id -u; cat /proc/self/uid_map; touch {slots.a.work}/made-inside")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.split()
    assert lines[0] == "0"  # root inside ...
    assert lines[1:4] == ["0", str(slots.a.uid), "1"]  # ... is the slot's uid outside
    assert (slots.a.work / "made-inside").stat().st_uid == slots.a.uid


def test_a_job_reads_the_caches_and_writes_its_own_work_folder(slots: Slots) -> None:
    data = slots.root / "data"
    done = job_container(slots.a, "-v", f"{data}/models:/root/models:ro", "-v", f"{slots.a.work}:/w",
                         script="cat /root/models/marker.txt && echo out > /w/result.txt")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "model bytes\n"
    assert (slots.a.work / "result.txt").read_text() == "out\n"


def test_every_slot_takes_the_gpu_lock_files_the_set_up_made(slots: Slots) -> None:
    for slot in (slots.a, slots.b, slots.a):  # files made by root: every slot trusts them
        done = as_slot(slot, [sys.executable, "-m", "ci", "lock-gpus", "--total-gpus", "2", "--count", "2",
                              "--timeout", "30", "--lock-path-pattern", slots.lock_pattern, "--",
                              "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"])
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "0,1"
    for path in (slots.lock_pattern.format(gpu_id=0), slots.lock_pattern.format(gpu_id="queue")):
        st = os.lstat(path)
        assert st.st_uid == 0 and stat.S_IMODE(st.st_mode) == 0o666


# ---- must fail ----------------------------------------------------------------------------

def test_a_job_cannot_list_or_inspect_slot_b_containers(slots: Slots) -> None:
    name = f"runner-b-{uuid.uuid4().hex[:6]}"
    started = as_slot(slots.b, ["docker", "run", "-d", "--name", name, *NET, IMAGE,
                                "sh", "-c", "sleep 300", "run.sh", "--jitconfig", "B-ONE-USE-CONFIG"])
    assert started.returncode == 0, started.stderr
    try:
        assert name in as_slot(slots.b, ["docker", "ps", "--format", "{{.Names}}"]).stdout  # B sees it
        listed = as_slot(slots.a, ["docker", "ps", "-a", "--no-trunc"])
        assert listed.returncode == 0 and name not in listed.stdout and "B-ONE-USE" not in listed.stdout
        inspect = as_slot(slots.a, ["docker", "inspect", name])
        assert inspect.returncode != 0 and "B-ONE-USE" not in inspect.stdout
        # Nor by B's socket: the job's own uid, and a container of A that mounts B's runtime dir.
        direct = as_slot(slots.a, ["docker", "-H", f"unix://{slots.b.socket}", "ps"])
        assert direct.returncode != 0 and "permission denied" in direct.stderr.lower()
        mounted = job_container(slots.a, "-v", f"{slots.b.socket.parent.parent}:/b",
                                script="ls /b/podman")
        assert "Permission denied" in mounted.stderr, mounted.stderr
    finally:
        as_slot(slots.b, ["docker", "rm", "-f", name])


def test_a_job_cannot_read_slot_b_runner_configuration(slots: Slots) -> None:
    config = slots.b.work / ".runner"
    config.write_text("B-ONE-USE-CONFIG\n")
    os.chown(config, slots.b.uid, slots.b.uid)
    os.chmod(config, 0o600)
    direct = as_slot(slots.a, ["cat", str(config)])
    assert direct.returncode != 0 and "Permission denied" in direct.stderr
    mounted = job_container(slots.a, "-v", f"{slots.b.work}:/b", script="cat /b/.runner")
    # The refusal is read from stderr: Podman 4.3's Docker API hands this docker CLI exit 0.
    assert "B-ONE-USE" not in mounted.stdout and "Permission denied" in mounted.stderr


def test_a_job_cannot_write_the_caches_even_when_it_mounts_them_itself(slots: Slots) -> None:
    data = slots.root / "data"
    for flags in (("-v", f"{data}:/d"), ("--mount", f"type=bind,source={data},target=/d"),
                  ("--privileged", "-v", f"{data}:/d")):
        done = job_container(slots.a, *flags,
                             script="touch /d/models/planted; echo x >> /d/models/marker.txt; "
                             "mkdir /d/datasets/planted; rm -f /d/models/marker.txt; ls /d/models")
        assert "Permission denied" in done.stderr, done.stderr
        assert "marker.txt" in done.stdout
    direct = as_slot(slots.a, ["touch", str(data / "models" / "planted")])
    assert direct.returncode != 0
    assert sorted(os.listdir(data / "models")) == ["marker.txt"] and os.listdir(data / "datasets") == []
    assert (data / "models" / "marker.txt").read_text() == "model bytes\n"


def test_a_job_cannot_read_a_root_only_file_through_a_mount_of_the_host_root(slots: Slots) -> None:
    for flags in (("-v", "/:/host"), ("--privileged", "-v", "/:/host")):
        done = job_container(slots.a, *flags, script=f"cat /host{slots.root_only}; cat /host/etc/shadow")
        assert "root's alone" not in done.stdout and done.stderr.count("Permission denied") == 2, done.stderr


def test_a_job_cannot_reach_the_host_docker_socket(slots: Slots) -> None:
    if slots.host_socket is None:
        pytest.skip("no root Docker engine runs here (bash .ci/docker-engine.sh starts one)")
    probe = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\n"
             "try:\n s.connect(sys.argv[1])\nexcept OSError as e:\n print(type(e).__name__)\n"
             "else:\n print('connected')\n")
    direct = as_slot(slots.a, [sys.executable, "-c", probe, str(slots.host_socket)])
    assert direct.stdout.strip() == "PermissionError", direct.stdout + direct.stderr
    mounted = job_container(slots.a, "-v", f"{slots.host_socket}:/host.sock",
                            script=f"python3 -c \"{probe}\" /host.sock")
    assert mounted.stdout.strip() == "PermissionError", mounted.stdout + mounted.stderr
    # The socket is root's (and the docker group's): the slot user is in no group but its own.
    assert os.getgrouplist(f"{pwd.getpwuid(slots.a.uid).pw_name}", slots.a.uid) == [slots.a.uid]


def _can_connect(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
    return True


# ---- the set-up script itself -------------------------------------------------------------

def test_set_up_is_idempotent_and_its_dry_run_changes_nothing(slots: Slots) -> None:
    again = _setup("up", *slots.args, "--image-tar", str(ROOTFS))
    assert again.returncode == 0, again.stderr
    table = again.stdout.splitlines()
    assert table[0].split()[:3] == ["slot", "user", "uid"] and len(table) == 3  # no step was taken
    assert all(line.rstrip().endswith(" up") for line in table[1:])
    dry = _setup("up", *slots.args, "--dry-run")
    assert dry.returncode == 0 and "would:" not in dry.stdout
    assert _can_connect(slots.a.socket) and _can_connect(slots.b.socket)


def test_set_up_refuses_bad_input_in_one_line(slots: Slots) -> None:
    for args, needle in ((("--slots", "0"), "--slots 0"), (("--root", "rel"), "absolute"),
                         (("--remove",), "--remove goes with down"),
                         (("--uid-base", "10"), "--uid-base 10")):
        done = _setup("up", *args)
        assert done.returncode == 2 and done.stderr.count("\n") == 1 and needle in done.stderr, done.stderr
    # Slot B's uid taken by another name: refused before anything changes.
    clash = _setup("up", "--slots", "2", "--root", str(slots.root), "--prefix", "other-",
                   "--uid-base", str(slots.a.uid - 1), "--dry-run")
    assert clash.returncode == 2 and "belongs to" in clash.stderr


def test_reset_takes_away_what_a_job_left_for_its_slot_next_job(slots: Slots) -> None:
    # Last in the file: it resets slot B. A hostile job of B leaves a running container, a
    # test image rewritten in place (`docker commit` over its tag), a file in the work folder
    # and an engine setting in its user's home (through a mount: root inside is B's uid).
    b = slots.b
    home = slots.root / "home" / pwd.getpwuid(b.uid).pw_name
    left = as_slot(b, ["docker", "run", "-d", "--name", "left-behind", *NET, IMAGE, "sleep", "600"])
    assert left.returncode == 0, left.stderr
    made = as_slot(b, ["docker", "run", "--name", "poisoner", *NET, IMAGE, "sh", "-c", "echo bad > /poisoned"])
    assert made.returncode == 0, made.stderr
    # Podman 4.3's Docker API cannot decode this docker CLI's commit; its own API client can.
    commit = as_slot(b, ["podman", "--remote", "--url", f"unix://{b.socket}", "commit", "poisoner", IMAGE])
    assert commit.returncode == 0, commit.stderr
    planted = job_container(b, "-v", f"{home}:/h", "-v", f"{b.work}:/w",
                            script="echo '[registries]' > /h/.config/containers/registries.conf; "
                            "echo next > /w/for-the-next-job; mkdir /w/_tool")
    assert planted.returncode == 0 and not planted.stderr, planted.stderr
    kept = job_container(slots.a, "-v", f"{slots.a.work}:/w", script="echo mine > /w/slot-a-kept")
    assert kept.returncode == 0, kept.stderr
    poisoned = job_container(b, script="cat /poisoned")
    assert poisoned.stdout == "bad\n"  # the next job would meet it

    done = _setup("reset", *slots.args, "--slot", "2", "--image-tar", str(ROOTFS))
    assert done.returncode == 0, done.stdout + done.stderr

    listed = as_slot(b, ["docker", "ps", "-a", "--format", "{{.Names}}"])
    assert listed.returncode == 0 and listed.stdout.strip() == "", listed.stdout
    clean = job_container(b, script="cat /poisoned; echo fresh")
    assert "No such file" in clean.stderr and clean.stdout == "fresh\n", clean.stdout + clean.stderr
    assert os.listdir(b.work) == []
    assert sorted(os.listdir(home / ".config" / "containers")) == ["containers.conf", "storage.conf"]
    st = os.stat(b.work)
    assert st.st_uid == b.uid and stat.S_IMODE(st.st_mode) == 0o700
    # Slot A was not touched: its engine and its work folder's files are still there.
    assert _can_connect(slots.a.socket) and (slots.a.work / "slot-a-kept").read_text() == "mine\n"
    bad = _setup("reset", *slots.args, "--slot", "3")
    assert bad.returncode == 2 and "--slot 3" in bad.stderr and bad.stderr.count("\n") == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
