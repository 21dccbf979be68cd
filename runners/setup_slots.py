"""Runner slots on the GPU host: one unprivileged user and one rootless Podman engine each.

Run it as root on the GPU host (`runners/README.md`). For slot i (1..N) it makes, each step
skipped when already done:

- the user `<prefix><i>` with uid and gid `<uid-base> + i`, no login shell, its home under
  `<root>/home`, and 65,536 subordinate uids and gids of its own in /etc/subuid and
  /etc/subgid (never overlapping another user's range);
- its runtime directory `/run/user/<uid>` (mode 700) and its engine: rootless Podman,
  started as that user, serving the Docker-compatible API on
  `/run/user/<uid>/podman/podman.sock`; the pid and start time are recorded in
  `<root>/slots/<i>/engine.json`, so `down` stops exactly that process;
- its work folder `<root>/work/<i>`, owned by the slot user, mode 700;
- the caches `<root>/data/models` and `<root>/data/datasets`, owned by root and writable by
  root alone: a job whose containers are that slot's uid outside can read them and, however
  it mounts them, never write them;
- the GPU lock's files in /dev/shm, created as root, so every slot trusts them;
- with `--image-tar`, the test image loaded into the slot's engine (a `docker save` archive,
  or a root filesystem tarball, imported), since jobs do not pull from registries here.

`reset [--slot N]` gives a slot back as `up` made it, for its next job: it stops the engine
and its containers, wipes the engine's storage, the user's home and the work folder, and
starts the engine with the image again (runners/registrar.py runs it before each
registration, `--reset-command`).

Why Podman: on the machine this was built on, rootless Podman ran containers (runc, the
cgroupfs manager, native overlay) while rootless dockerd did not start: rootlesskit's
network drivers need /dev/net/tun, which only root may open there (docs/security.md).

Standard library only. Exit codes: 0 done, 2 bad input (one line, nothing changed),
3 this host lacks something (not root, no podman, no newuidmap), 4 an engine did not come up
or a step failed (the line names its log), 5 `down` found a recorded process that is not
the one it started (left alone).
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypedDict

SUBID_COUNT = 65536
ENGINE_WAIT_S = 60.0
STOP_GRACE_S = 10.0
NETWORKS = ("none", "host", "slirp4netns", "pasta")
DRIVERS = ("overlay", "vfs")
DEFAULT_LOCK_PATTERN = "/dev/shm/custom_gpu_lock_{gpu_id}.lock"  # ci/gpu/allocator.py's


class BadInput(Exception):
    """Exit 2."""


class HostLacks(Exception):
    """Exit 3."""


class StepFailed(Exception):
    """Exit 4."""


class NotOurs(Exception):
    """Exit 5."""


@dataclass(frozen=True, kw_only=True)
class Slot:
    index: int
    user: str
    uid: int
    subid_start: int
    home: Path
    work: Path
    state: Path  # <root>/slots/<i>: engine.json, engine.log

    @property
    def runtime(self) -> Path:
        return Path(f"/run/user/{self.uid}")

    @property
    def socket(self) -> Path:
        return self.runtime / "podman" / "podman.sock"


@dataclass(frozen=True, kw_only=True)
class Config:
    root: Path
    slots: tuple[Slot, ...]
    image_tar: Path | None
    image_name: str
    network: str
    driver: str
    gpus: int
    lock_pattern: str
    dry_run: bool


def slot_plan(root: Path, count: int, *, prefix: str, uid_base: int, subid_base: int) -> tuple[Slot, ...]:
    """Every slot's names, ids and paths (pure: the same input gives the same slots)."""
    return tuple(
        Slot(index=i, user=f"{prefix}{i}", uid=uid_base + i,
             subid_start=subid_base + (i - 1) * SUBID_COUNT, home=root / "home" / f"{prefix}{i}",
             work=root / "work" / str(i), state=root / "slots" / str(i))
        for i in range(1, count + 1))


def parse_subids(text: str) -> list[tuple[str, int, int]]:
    """`name:start:count` lines of /etc/subuid (pure); lines that are not are skipped."""
    out = []
    for line in text.splitlines():
        parts = line.strip().split(":")
        if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
            out.append((parts[0], int(parts[1]), int(parts[2])))
    return out


def uid_free(uid: int) -> bool:
    """Whether no user of this host has `uid`."""
    try:
        pwd.getpwuid(uid)
    except KeyError:
        return True
    return False


def subids_end(floor: int) -> int:
    """The first id past every range of /etc/subuid and /etc/subgid, and at least `floor`:
    where a new slot's subordinate ids can start without overlapping anyone's."""
    ends = [floor]
    for path in ("/etc/subuid", "/etc/subgid"):
        try:
            text = Path(path).read_text()
        except FileNotFoundError:
            continue
        ends.extend(start + count for _, start, count in parse_subids(text))
    return max(ends)


def subid_conflict(entries: list[tuple[str, int, int]], user: str, start: int) -> str | None:
    """Whose range overlaps [start, start + 65536) other than `user`'s own (pure)."""
    for name, s, n in entries:
        if name != user and s < start + SUBID_COUNT and start < s + n:
            return f"{name}:{s}:{n}"
    return None


def _say(cfg: Config, text: str) -> None:
    print(("would: " if cfg.dry_run else "") + text, flush=True)


def _run(argv: Sequence[str], *, what: str, stdin: int | None = None, slot: Slot | None = None,
         timeout: float = 300) -> str:
    try:
        done = subprocess.run(list(argv), stdin=stdin if stdin is not None else subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False,
                              **(_as_user(slot) if slot else AsUser()))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise StepFailed(f"{what}: {exc}") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise StepFailed(f"{what} failed ({done.returncode}): {last[:300]}")
    return done.stdout


def _env(slot: Slot) -> dict[str, str]:
    return {"HOME": str(slot.home), "USER": slot.user, "LOGNAME": slot.user,
            "XDG_RUNTIME_DIR": str(slot.runtime), "XDG_CONFIG_HOME": str(slot.home / ".config"),
            "PATH": "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"}


class AsUser(TypedDict, total=False):
    """The keyword arguments of subprocess that run a command as a slot's user."""

    user: int
    group: int
    extra_groups: list[int]
    env: dict[str, str]
    cwd: str


def _as_user(slot: Slot) -> AsUser:
    return AsUser(user=slot.uid, group=slot.uid, extra_groups=[], env=_env(slot), cwd=str(slot.home))


# ---- checks -------------------------------------------------------------------------------

def check_host(cfg: Config) -> None:
    if not cfg.dry_run and os.geteuid() != 0:
        raise HostLacks("run it as root: it creates users and their engines (or pass --dry-run)")
    for tool in ("podman", "newuidmap", "newgidmap", "useradd", "usermod", "runc"):
        if shutil.which(tool) is None:
            pkg = {"newuidmap": "uidmap", "newgidmap": "uidmap",
                   "useradd": "passwd", "usermod": "passwd"}.get(tool, tool)
            raise HostLacks(f"{tool} not found: apt-get install {pkg}")
    if cfg.image_tar is not None and not cfg.image_tar.is_file():
        raise BadInput(f"--image-tar {cfg.image_tar}: no such file")
    # Every slot user must reach its home and work folder through the root's parents.
    for parent in [cfg.root, *cfg.root.parents]:
        if parent.exists() and not parent.stat().st_mode & stat.S_IXOTH:
            raise BadInput(f"--root {cfg.root}: {parent} is not searchable by other users; "
                           f"chmod o+x {parent} or choose another root")
    subuids = parse_subids(_read("/etc/subuid"))
    subgids = parse_subids(_read("/etc/subgid"))
    for slot in cfg.slots:
        try:
            owner = pwd.getpwuid(slot.uid).pw_name
        except KeyError:
            owner = None
        if owner not in (None, slot.user):
            raise BadInput(f"uid {slot.uid} belongs to {owner}, not {slot.user}; pass another --uid-base")
        try:
            existing = pwd.getpwnam(slot.user).pw_uid
        except KeyError:
            existing = None
        try:
            group = grp.getgrgid(slot.uid).gr_name
        except KeyError:
            group = None
        if group not in (None, slot.user):
            raise BadInput(f"gid {slot.uid} belongs to group {group}, not {slot.user}; "
                           "pass another --uid-base")
        if existing not in (None, slot.uid):
            raise BadInput(f"user {slot.user} exists with uid {existing}, not {slot.uid}; "
                           "pass another --prefix or --uid-base")
        for entries, path in ((subuids, "/etc/subuid"), (subgids, "/etc/subgid")):
            clash = subid_conflict(entries, slot.user, slot.subid_start)
            if clash:
                raise BadInput(f"{path}: {slot.user}'s range {slot.subid_start}:{SUBID_COUNT} overlaps "
                               f"{clash}; pass another --subid-base")


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except FileNotFoundError:
        return ""


# ---- up -----------------------------------------------------------------------------------

def ensure_dir(cfg: Config, path: Path, *, uid: int, mode: int) -> None:
    if path.is_symlink():
        raise BadInput(f"{path} is a symbolic link; remove it")
    if path.is_dir():
        st = path.stat()
        if st.st_uid == uid and stat.S_IMODE(st.st_mode) == mode:
            return
    _say(cfg, f"make {path} owned by uid {uid}, mode {mode:o}")
    if cfg.dry_run:
        return
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, uid, uid)
    os.chmod(path, mode)


def ensure_user(cfg: Config, slot: Slot) -> None:
    try:
        pwd.getpwnam(slot.user)
    except KeyError:
        _say(cfg, f"create user {slot.user} (uid {slot.uid}, home {slot.home})")
        if not cfg.dry_run:
            ensure_dir(cfg, slot.home.parent, uid=0, mode=0o755)
            try:
                grp.getgrnam(slot.user)
            except KeyError:
                _run(["groupadd", "--gid", str(slot.uid), slot.user], what=f"groupadd {slot.user}")
            # SUB_*_COUNT=0: no automatic range; the slot's own is added below.
            _run(["useradd", "--uid", str(slot.uid), "--gid", str(slot.uid), "--home-dir", str(slot.home),
                  "--create-home", "--shell", "/usr/sbin/nologin", "-K", "SUB_UID_COUNT=0",
                  "-K", "SUB_GID_COUNT=0", slot.user], what=f"useradd {slot.user}")
            os.chmod(slot.home, 0o700)
    for path, flag in (("/etc/subuid", "--add-subuids"), ("/etc/subgid", "--add-subgids")):
        mine = [(s, n) for name, s, n in parse_subids(_read(path)) if name == slot.user]
        if (slot.subid_start, SUBID_COUNT) in mine:
            continue
        end = slot.subid_start + SUBID_COUNT - 1
        _say(cfg, f"give {slot.user} the range {slot.subid_start}-{end} in {path}")
        if not cfg.dry_run:
            _run(["usermod", flag, f"{slot.subid_start}-{end}", slot.user], what=f"usermod {flag}")


def engine_config(cfg: Config, slot: Slot) -> dict[str, str]:
    """The slot engine's containers.conf and storage.conf (pure)."""
    containers = (
        "# Written by runners/setup_slots.py.\n"
        "[containers]\n"
        f'netns = "{cfg.network}"\n'
        "[engine]\n"
        '# runc with the cgroupfs manager: no systemd user session is needed; on cgroup v1 the\n'
        "# engine sets no resource limits (docs/security.md).\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n')
    storage = (
        "# Written by runners/setup_slots.py.\n"
        "[storage]\n"
        f'driver = "{cfg.driver}"\n'
        f'graphroot = "{slot.home}/.local/share/containers/storage"\n'
        f'runroot = "{slot.runtime}/containers"\n')
    return {"containers.conf": containers, "storage.conf": storage}


def ensure_engine_config(cfg: Config, slot: Slot) -> None:
    conf = slot.home / ".config" / "containers"
    for name, text in engine_config(cfg, slot).items():
        path = conf / name
        if path.is_file() and not path.is_symlink() and path.read_text() == text:
            continue
        _say(cfg, f"write {path}")
        if cfg.dry_run:
            continue
        for d in (slot.home / ".config", conf):
            d.mkdir(exist_ok=True)
            os.chown(d, slot.uid, slot.uid)
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        tmp.write_text(text)
        os.chown(tmp, slot.uid, slot.uid)
        os.replace(tmp, path)


def proc_start(pid: int) -> int | None:
    """The process's start time in clock ticks (field 22 of /proc/PID/stat), None when gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2:].split()[19])


def proc_uid(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def recorded_engine(slot: Slot) -> dict[str, int] | None:
    try:
        rec = json.loads((slot.state / "engine.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or not all(isinstance(rec.get(k), int) for k in ("pid", "start", "uid")):
        return None
    return rec


def engine_alive(slot: Slot) -> bool:
    rec = recorded_engine(slot)
    return bool(rec and proc_start(rec["pid"]) == rec["start"] and proc_uid(rec["pid"]) == slot.uid)


def ping(sock: Path, timeout: float = 2.0) -> bool:
    """The engine answers `GET /_ping` on its socket."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: d\r\n\r\n")
            return b" 200 " in s.recv(256)
    except OSError:
        return False


def ensure_engine(cfg: Config, slot: Slot) -> None:
    if engine_alive(slot) and ping(slot.socket):
        return
    _say(cfg, f"start {slot.user}'s engine: podman system service on {slot.socket}")
    if cfg.dry_run:
        return
    ensure_dir(cfg, slot.runtime / "podman", uid=slot.uid, mode=0o700)
    log = slot.state / "engine.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(["podman", "system", "service", "--time=0", f"unix://{slot.socket}"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                                start_new_session=True, **_as_user(slot))
    start = proc_start(proc.pid)
    rec = {"pid": proc.pid, "start": start, "uid": slot.uid}
    (slot.state / "engine.json").write_text(json.dumps(rec) + "\n")
    deadline = time.monotonic() + ENGINE_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise StepFailed(f"slot {slot.index}: the engine exited {proc.returncode}; see {log}")
        if ping(slot.socket):
            return
        time.sleep(0.2)
    raise StepFailed(f"slot {slot.index}: the engine did not answer on {slot.socket} within "
                     f"{ENGINE_WAIT_S:.0f} s; see {log}")


def ensure_image(cfg: Config, slot: Slot) -> None:
    if cfg.image_tar is None:
        return
    if not cfg.dry_run:
        exists = subprocess.run(["podman", "image", "exists", cfg.image_name], stdin=subprocess.DEVNULL,
                                capture_output=True, check=False, **_as_user(slot))
        if exists.returncode == 0:
            return
    saved = _is_docker_save(cfg.image_tar)
    verb = "load" if saved else "import"
    _say(cfg, f"{verb} {cfg.image_tar} into {slot.user}'s engine as {cfg.image_name}")
    if cfg.dry_run:
        return
    # Root opens the archive and hands it over on stdin: the slot user needs no access to it.
    with open(cfg.image_tar, "rb") as tar:
        if saved:
            out = _run(["podman", "load"], stdin=tar.fileno(), slot=slot,
                       what=f"slot {slot.index}: podman load")
            # A `docker save` archive keeps its own name; tag it with the one jobs use too.
            loaded = [line.split(":", 1)[1].strip().split(",")[0] for line in out.splitlines()
                      if line.startswith("Loaded image")]
            if loaded and loaded[0] != cfg.image_name:
                _run(["podman", "tag", loaded[0], cfg.image_name], slot=slot,
                     what=f"slot {slot.index}: podman tag")
        else:
            _run(["podman", "import", "-", cfg.image_name], stdin=tar.fileno(), slot=slot,
                 what=f"slot {slot.index}: podman import")


def _is_docker_save(path: Path) -> bool:
    import tarfile

    try:
        with tarfile.open(path) as tar:
            for member in tar:
                if member.name in ("manifest.json", "./manifest.json"):
                    return True
                if member.name.startswith(("etc", "./etc", "usr", "./usr", "bin", "./bin")):
                    return False
    except (OSError, tarfile.TarError):
        raise BadInput(f"--image-tar {path}: not a tar archive") from None
    return False


def gpu_lock_paths(pattern: str, gpus: int) -> tuple[list[str], str]:
    """The GPU lock's files for `gpus` GPUs and its ticket directory (pure; ci/gpu/allocator.py)."""
    files = [pattern.format(gpu_id=i) for i in range(gpus)] + [pattern.format(gpu_id="queue")]
    return files, pattern.format(gpu_id="queue") + ".d"


def ensure_gpu_locks(cfg: Config) -> None:
    """Create the GPU lock's files as root, mode 0666 (the ticket directory 1777).

    The lock uses a file only when it belongs to the caller, root or the directory's owner
    (ci/gpu/safe_open.py): files the first slot created would be refused by every other
    slot. Root's are trusted by all. /dev/shm is emptied at boot: run `up` at boot."""
    if cfg.gpus == 0:
        return
    files, tickets = gpu_lock_paths(cfg.lock_pattern, cfg.gpus)
    for path in files:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            _say(cfg, f"create the GPU lock file {path} (root, mode 666)")
            if cfg.dry_run:
                continue
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
            os.fchmod(fd, 0o666)
            os.close(fd)
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_uid != 0:
            raise BadInput(f"{path}: exists and is not a plain file of root's (uid {st.st_uid}); "
                           "remove it, then run this again")
    try:
        st = os.lstat(tickets)
    except FileNotFoundError:
        _say(cfg, f"create the GPU lock's ticket directory {tickets} (root, mode 1777)")
        if not cfg.dry_run:
            os.mkdir(tickets)
            os.chmod(tickets, 0o1777)
        return
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0:
        raise BadInput(f"{tickets}: exists and is not root's directory (uid {st.st_uid}); remove it, "
                       "then run this again")


def up(cfg: Config) -> None:
    check_host(cfg)
    ensure_dir(cfg, cfg.root, uid=0, mode=0o755)
    for sub in ("data", "data/models", "data/datasets", "work", "slots", "home"):
        ensure_dir(cfg, cfg.root / sub, uid=0, mode=0o755)
    ensure_gpu_locks(cfg)
    for slot in cfg.slots:
        ensure_user(cfg, slot)
        ensure_dir(cfg, slot.state, uid=0, mode=0o755)
        ensure_dir(cfg, slot.work, uid=slot.uid, mode=0o700)
        ensure_dir(cfg, slot.runtime.parent, uid=0, mode=0o755)
        ensure_dir(cfg, slot.runtime, uid=slot.uid, mode=0o700)
        if not cfg.dry_run or pwd_exists(slot.user):
            ensure_engine_config(cfg, slot)
        ensure_engine(cfg, slot)
        ensure_image(cfg, slot)


def pwd_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return False
    return True


# ---- down ---------------------------------------------------------------------------------

def _kill_group(pid: int, start: int | None, uid: int) -> None:
    """SIGTERM the process group the recorded pid leads, then SIGKILL after the grace."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc_start(pid) != start or proc_uid(pid) != uid:
            return
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + STOP_GRACE_S
        while time.monotonic() < deadline and proc_start(pid) == start:
            time.sleep(0.1)


def stop_slot(cfg: Config, slot: Slot, *, remove: bool) -> None:
    if pwd_exists(slot.user) and engine_alive(slot):
        _say(cfg, f"stop and remove {slot.user}'s containers")
        if not cfg.dry_run:
            for args in (("stop", "--all", "--time", "5"), ("rm", "--all", "--force")):
                subprocess.run(["podman", *args], stdin=subprocess.DEVNULL, capture_output=True,
                               check=False, timeout=120, **_as_user(slot))
    rec = recorded_engine(slot)
    if rec is not None:
        if proc_start(rec["pid"]) is not None and not engine_alive(slot):
            # The pid was reused by another process: never signal it.
            if not remove:
                raise NotOurs(f"slot {slot.index}: pid {rec['pid']} is no longer the engine it started; "
                              "left alone")
        elif engine_alive(slot):
            _say(cfg, f"stop {slot.user}'s engine (pid {rec['pid']})")
            if not cfg.dry_run:
                _kill_group(rec["pid"], rec["start"], slot.uid)
        if not cfg.dry_run:
            (slot.state / "engine.json").unlink(missing_ok=True)
    # Rootless Podman keeps a pause process holding its user namespace; it records the pid.
    pause = slot.runtime / "libpod" / "tmp" / "pause.pid"
    try:
        ppid = int(pause.read_text().strip())
    except (OSError, ValueError):
        ppid = 0
    if ppid > 0 and proc_uid(ppid) == slot.uid:
        _say(cfg, f"stop {slot.user}'s podman pause process (pid {ppid})")
        if not cfg.dry_run:
            with contextlib.suppress(ProcessLookupError):
                os.kill(ppid, signal.SIGKILL)
    if not remove:
        return
    _say(cfg, f"remove user {slot.user}, its ranges, home, work folder and runtime directory")
    if cfg.dry_run:
        return
    for path, flag in (("/etc/subuid", "--del-subuids"), ("/etc/subgid", "--del-subgids")):
        for name, s, n in parse_subids(_read(path)):
            if name == slot.user:
                _run(["usermod", flag, f"{s}-{s + n - 1}", slot.user], what=f"usermod {flag}")
    if pwd_exists(slot.user):
        _run(["userdel", slot.user], what=f"userdel {slot.user}")
    try:
        grp.getgrnam(slot.user)
        _run(["groupdel", slot.user], what=f"groupdel {slot.user}")
    except KeyError:
        pass
    for folder in (slot.home, slot.work, slot.runtime, slot.state):
        if folder.is_dir() and not folder.is_symlink():
            shutil.rmtree(folder)


def down(cfg: Config, *, remove: bool) -> None:
    if not cfg.dry_run and os.geteuid() != 0:
        raise HostLacks("run it as root: it stops the slot users' engines (or pass --dry-run)")
    for slot in cfg.slots:
        stop_slot(cfg, slot, remove=remove)


# ---- reset --------------------------------------------------------------------------------

def _empty(folder: Path) -> None:
    """Remove everything inside `folder`, never following a link out of it."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def reset(cfg: Config, only: int | None) -> None:
    """Give slots back as `up` made them, for the next job: whatever a job left in its slot's
    engine (containers, images, a retagged or rewritten test image: the storage is wiped, the
    image loaded again), its work folder and its user's home is gone."""
    if not cfg.dry_run and os.geteuid() != 0:
        raise HostLacks("run it as root: it resets the slot users' engines (or pass --dry-run)")
    check_host(cfg)
    for slot in cfg.slots:
        if only is not None and slot.index != only:
            continue
        if not pwd_exists(slot.user):
            raise StepFailed(f"slot {slot.index}: no user {slot.user}; run `up` first")
        stop_slot(cfg, slot, remove=False)
        _say(cfg, f"wipe {slot.user}'s engine storage, home and work folder {slot.work}")
        if not cfg.dry_run:
            _run(["podman", "system", "reset", "--force"], slot=slot,
                 what=f"slot {slot.index}: podman system reset")
            for folder in (slot.home, slot.work):
                if folder.is_dir() and not folder.is_symlink():
                    _empty(folder)
        ensure_engine_config(cfg, slot)
        ensure_engine(cfg, slot)
        ensure_image(cfg, slot)


# ---- command line -------------------------------------------------------------------------

def table(cfg: Config) -> str:
    rows = [("slot", "user", "uid", "subuids", "socket", "work folder", "engine")]
    for s in cfg.slots:
        state = "up" if engine_alive(s) and ping(s.socket) else "down"
        rows.append((str(s.index), s.user, str(s.uid), f"{s.subid_start}+{SUBID_COUNT}", str(s.socket),
                     str(s.work), state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python3 runners/setup_slots.py", description=(
        "Create (up) or stop (down) the GPU host's runner slots: one unprivileged user, "
        "subordinate id range, rootless Podman engine and work folder per slot, and "
        "root-owned caches no slot can write. Idempotent; run as root."))
    p.add_argument("action", nargs="?", choices=("up", "down", "reset", "status"), default="up",
                   help="up (default): create what is missing and start the engines; down: stop the "
                   "engines this script started; reset: wipe what jobs left in a slot (engine storage, "
                   "home, work folder) and bring it up again with the image; status: the table only")
    p.add_argument("--slot", type=int, help="with reset: that slot only (default every slot)")
    p.add_argument("--slots", type=int, default=4, help="number of slots (default 4, one per runner)")
    p.add_argument("--root", type=Path, default=Path("/srv/slime-ci"),
                   help="base directory: work/<i>, data/{models,datasets}, home/, slots/ "
                        "(default /srv/slime-ci)")
    p.add_argument("--prefix", default="slime-ci-slot", help="slot user name prefix (default slime-ci-slot)")
    p.add_argument("--uid-base", type=int, default=61000,
                   help="slot i gets uid and gid BASE+i (default 61000)")
    p.add_argument("--subid-base", type=int, default=1_000_000_000,
                   help="slot i's subordinate range starts at BASE+(i-1)*65536 (default 1000000000)")
    p.add_argument("--image-tar", type=Path,
                   help="load this image into every slot's engine: a `docker save` archive "
                        "or a rootfs tarball")
    p.add_argument("--image-name", default="localhost/slime-ci-local:bookworm",
                   help="the name a rootfs tarball is imported as")
    p.add_argument("--network", choices=NETWORKS, default="none",
                   help="the engine's default network for containers (default none; slirp4netns and "
                   "pasta need /dev/net/tun open to the slot user)")
    p.add_argument("--storage-driver", choices=DRIVERS, default="overlay",
                   help="overlay (default, native in a user namespace on Linux 5.13+) or vfs")
    p.add_argument("--gpus", type=int, default=len(list(Path("/dev").glob("nvidia[0-9]*"))),
                   help="GPUs whose lock files are created as root, so every slot trusts them "
                   "(default: the /dev/nvidiaN nodes here)")
    p.add_argument("--lock-path-pattern", default=DEFAULT_LOCK_PATTERN,
                   help=f"the GPU lock's files (default {DEFAULT_LOCK_PATTERN}, as python -m ci lock-gpus)")
    p.add_argument("--remove", action="store_true",
                   help="with down: also delete the slot users, their ranges, homes, work folders")
    p.add_argument("--dry-run", action="store_true", help="print what would be done; change nothing")
    return p


def parse(argv: Sequence[str]) -> tuple[Config, argparse.Namespace]:
    args = _parser().parse_args(list(argv))
    if not 1 <= args.slots <= 64:
        raise BadInput(f"--slots {args.slots}: give 1 to 64")
    if not args.root.is_absolute():
        raise BadInput(f"--root {args.root}: give an absolute path")
    if not args.prefix or not args.prefix.replace("-", "").isalnum() or not args.prefix[0].isalpha() \
            or len(args.prefix) > 24:
        raise BadInput(f"--prefix {args.prefix!r}: letters, digits and '-', starting with a letter, "
                       "at most 24")
    if not 1000 <= args.uid_base <= 2**31 - 100:
        raise BadInput(f"--uid-base {args.uid_base}: give 1000 or more (slot users are not system users)")
    if not 100_000 <= args.subid_base <= 2**32 - 65 * SUBID_COUNT:
        raise BadInput(f"--subid-base {args.subid_base}: give 100000 to {2**32 - 65 * SUBID_COUNT}")
    if not 0 <= args.gpus <= 1024:
        raise BadInput(f"--gpus {args.gpus}: give 0 to 1024")
    if "{gpu_id}" not in args.lock_path_pattern or not args.lock_path_pattern.startswith("/"):
        raise BadInput(f"--lock-path-pattern {args.lock_path_pattern!r}: an absolute path with {{gpu_id}}")
    if args.remove and args.action != "down":
        raise BadInput("--remove goes with down")
    if args.slot is not None and (args.action != "reset" or not 1 <= args.slot <= args.slots):
        raise BadInput(f"--slot {args.slot}: goes with reset, and names one of slots 1 to {args.slots}")
    slots = slot_plan(args.root, args.slots, prefix=args.prefix, uid_base=args.uid_base,
                      subid_base=args.subid_base)
    cfg = Config(root=args.root, slots=slots, image_tar=args.image_tar, image_name=args.image_name,
                 network=args.network, driver=args.storage_driver, gpus=args.gpus,
                 lock_pattern=args.lock_path_pattern, dry_run=args.dry_run)
    return cfg, args


def main(argv: Sequence[str]) -> int:
    try:
        cfg, args = parse(argv)
        if args.action == "up":
            up(cfg)
        elif args.action == "down":
            down(cfg, remove=args.remove)
        elif args.action == "reset":
            reset(cfg, args.slot)
        print(table(cfg))
    except (BadInput, HostLacks, StepFailed, NotOurs) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_CODES[type(exc)]
    return 0


# One exit code per kind of failure (runners/README.md): bad input, a missing host tool, a
# failed step, a recorded pid that is no longer ours.
EXIT_CODES: dict[type[Exception], int] = {BadInput: 2, HostLacks: 3, StepFailed: 4, NotOurs: 5}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
