"""The Docker context of the GPU tier: the `docker run` argv of one entry, as a pure function.

Every entry runs with the smallest flags that serve it. "minimal" (the default): the
container's own network and IPC namespaces, Docker's default capabilities and seccomp
profile, `no-new-privileges`, 16 GB of its own shm. "framework" (an entry that needs RDMA,
DeepEP or several nodes, marked so in the registry): the framework CI's flags, privileged,
SYS_NICE, no seccomp, host network and IPC. Both get unlimited locked memory (NCCL pins
buffers), a 64 MB stack and no memory cap. The model and dataset caches are mounted
read-only, so a pull request's test cannot poison what the next job loads; a host that
fills them sets SLIME_CI_CACHE_WRITER=1 for that run only (runners/README.md). The
workspace is mounted at the same path, so paths in logs and reports mean the same thing
inside and out. Inside, the repo is installed `--no-deps` over the image's packages, then
the entry runs. Values read from the environment enter at the edge (`host_settings`).
"""

from __future__ import annotations

import re
import resource
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from ci.registry.model import Isolation

Pull = Literal["always", "missing", "never"]
PULL_POLICIES: tuple[Pull, ...] = ("always", "missing", "never")
# How the lock's holder hands its GPUs to the container (SLIME_CI_GPU_DEVICES, runners/README.md):
# "gpus" `--gpus "device=…"` (a root dockerd, or rootless dockerd, with the NVIDIA runtime);
# "cdi" one `--device nvidia.com/gpu=N` per GPU (rootless Podman with the CDI spec that
# `nvidia-ctk cdi generate` writes); "nodes" one `--device /dev/nvidiaN` per GPU and the
# driver's control nodes (an engine with neither, and an image carrying the driver's libraries).
GpuDevices = Literal["gpus", "cdi", "nodes"]
GPU_DEVICE_MODES: tuple[GpuDevices, ...] = ("gpus", "cdi", "nodes")
# Every CUDA process opens these besides its GPUs' own /dev/nvidiaN (nvidia-container-cli's list).
NVIDIA_CONTROL_NODES: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")

# Variables handed from the host to every entry by name: `-e NAME` lets docker read the
# value itself, so secrets never appear in the argv (ps, logs, --dry-run).
DEFAULT_PASSTHROUGH: tuple[str, ...] = (
    "http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
    "GITHUB_COMMIT_NAME", "WANDB_API_KEY", "SLIME_TEST_ENABLE_INFINITE_RUN",
)
CONTAINER_MODELS_DIR = "/root/models"
CONTAINER_DATASETS_DIR = "/root/datasets"
INSTALL: tuple[str, ...] = ("pip", "install", "-e", ".", "--no-deps", "--break-system-packages")
STACK_BYTES = 67108864
UNLIMITED = -1
_CAP_SYS_RESOURCE = 24


@dataclass(frozen=True, kw_only=True)
class DockerOptions:
    """Everything one entry's container needs; the defaults are the framework CI's flags."""

    image: str
    workspace: Path
    devices: tuple[int, ...] = ()  # host GPU ids this entry holds; () runs without GPUs
    gpu_devices: GpuDevices = "gpus"  # how they are handed to the container (GPU_DEVICE_MODES)
    env: Mapping[str, str] = field(default_factory=dict)
    passthrough: tuple[str, ...] = DEFAULT_PASSTHROUGH
    caches: Mapping[str, str] = field(default_factory=dict)  # host path -> container path
    pull: Pull = "always"
    name: str | None = None
    install: bool = True
    isolation: Isolation = "minimal"
    privileged: bool = False  # only with isolation "framework"
    writable_caches: bool = False
    memlock: int = UNLIMITED  # bytes, -1 for unlimited
    shm_size: str = "16g"


def gpus_flag(devices: tuple[int, ...], mode: GpuDevices = "gpus") -> tuple[str, ...]:
    """The flags that give the container the held GPUs and no other; nothing for none.

    "gpus": `--gpus "device=0,1"`; the inner double quotes are part of the value: docker
    reads --gpus as CSV, and without them `device=0,1` would be split at the comma.
    "cdi": `--device nvidia.com/gpu=0 --device nvidia.com/gpu=1`, the CDI spec's names.
    "nodes": `--device /dev/nvidia0 --device /dev/nvidia1` and the control nodes.
    The container sees only these GPUs, numbered from 0 in this order (`container_env`).
    """
    if not devices:
        return ()
    if len(set(devices)) != len(devices) or min(devices) < 0:
        raise ValueError(f"GPU ids must be distinct and non-negative, got {devices}")
    if mode == "gpus":
        return ("--gpus", '"device=' + ",".join(str(d) for d in devices) + '"')
    if mode == "cdi":
        names = [f"nvidia.com/gpu={d}" for d in devices]
    elif mode == "nodes":
        names = [f"/dev/nvidia{d}" for d in devices] + list(NVIDIA_CONTROL_NODES)
    else:
        raise ValueError(f"GPU hand-off {mode!r}: use one of {', '.join(GPU_DEVICE_MODES)}")
    return tuple(flag for name in names for flag in ("--device", name))


def container_env(opts: DockerOptions) -> dict[str, str]:
    """The entry's variables as the container must see them."""
    # A variable naming a mounted host directory (SLIME_CI_MODELS_DIR=/data/models) must
    # name its mount point inside, or U would look for the host path in the container.
    env = {key: opts.caches.get(value, value) for key, value in opts.env.items()}
    # Inside, docker renumbers the held GPUs from 0; the host ids would point at nothing.
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(opts.devices)))
    env.setdefault("NUM_GPUS", str(len(opts.devices)))
    return env


def inner_script(inner: tuple[str, ...], *, install: bool) -> str:
    """The `bash -c` string run in the container: install the repo, then exec the entry."""
    if not inner:
        raise ValueError("no command to run in the container")
    run = "exec " + shlex.join(inner)
    return f"{shlex.join(INSTALL)} && {run}" if install else run


def docker_run_argv(opts: DockerOptions, inner: tuple[str, ...]) -> tuple[str, ...]:
    """The full `docker run …` argv of one entry (pure)."""
    if opts.pull not in PULL_POLICIES:
        raise ValueError(f"pull policy {opts.pull!r}: use one of {', '.join(PULL_POLICIES)}")
    workspace = str(opts.workspace)
    if not opts.workspace.is_absolute():
        raise ValueError(f"workspace {workspace} must be an absolute path (it is mounted as is)")
    argv: list[str] = ["docker", "run", f"--pull={opts.pull}", "--rm"]
    if opts.name:
        argv += ["--name", opts.name]
    if opts.isolation == "framework":
        if opts.privileged:
            argv.append("--privileged")
        argv += ["--cap-add", "SYS_NICE", "--security-opt", "seccomp=unconfined", "--network", "host",
                 *gpus_flag(opts.devices, opts.gpu_devices), "--ipc=host"]
    elif opts.isolation == "minimal":
        # A process of the test cannot gain privileges (setuid binaries, file capabilities).
        argv += ["--security-opt", "no-new-privileges", *gpus_flag(opts.devices, opts.gpu_devices)]
    else:
        raise ValueError(f"container isolation {opts.isolation!r}: use minimal or framework")
    argv += [
        f"--shm-size={opts.shm_size}",
        "--ulimit", f"memlock={opts.memlock}",
        "--ulimit", f"stack={STACK_BYTES}",
        "--memory=0",
        "--memory-swap=0",
    ]
    env = container_env(opts)
    for key in sorted(env):
        argv += ["-e", f"{key}={env[key]}"]
    for key in opts.passthrough:
        if key not in env:
            argv += ["-e", key]
    argv += ["-v", f"{workspace}:{workspace}", "-w", workspace]
    for host, inside in sorted(opts.caches.items()):
        argv += ["-v", f"{host}:{inside}" if opts.writable_caches else f"{host}:{inside}:ro"]
    argv += [opts.image, "bash", "-c", inner_script(inner, install=opts.install)]
    return tuple(argv)


def container_name(entry_id: str, token: str) -> str:
    """A valid, unique container name for an entry (to `docker kill` it on timeout)."""
    stem = re.sub(r"[^a-zA-Z0-9_.]+", "-", entry_id).strip("-.")[:80] or "entry"
    return f"slime-ci-{stem}-{token}"


def docker_kill_argv(name: str) -> tuple[str, ...]:
    """Stop a named container: killing the `docker run` client alone leaves it running."""
    return ("docker", "kill", name)


@dataclass(frozen=True, kw_only=True)
class HostSettings:
    """What the environment says about this host's Docker context."""

    caches: Mapping[str, str]
    pull: Pull | None  # None: let the caller choose (always in CI)
    cache_writer: bool = False  # SLIME_CI_CACHE_WRITER=1: this run may write the caches
    gpu_devices: GpuDevices = "gpus"  # SLIME_CI_GPU_DEVICES: how GPUs reach the container


def host_settings(env: Mapping[str, str]) -> HostSettings:
    """Cache mounts, pull policy and cache writing from SLIME_CI_MODELS_DIR, SLIME_CI_DATASETS_DIR,
    SLIME_CI_DATA_DIR, SLIME_CI_DOCKER_PULL, SLIME_CI_CACHE_WRITER and SLIME_CI_GPU_DEVICES."""
    caches = {
        env.get("SLIME_CI_MODELS_DIR") or CONTAINER_MODELS_DIR: CONTAINER_MODELS_DIR,
        env.get("SLIME_CI_DATASETS_DIR") or CONTAINER_DATASETS_DIR: CONTAINER_DATASETS_DIR,
    }
    data = env.get("SLIME_CI_DATA_DIR")
    if data:
        # HOST or HOST:CONTAINER (slime's CI mounts /mnt/nvme0n1/slime_ci at /data/slime_ci).
        host, _, inside = data.partition(":")
        caches[host] = inside or host
    pull = env.get("SLIME_CI_DOCKER_PULL") or None
    if pull is not None and pull not in PULL_POLICIES:
        raise ValueError(f"SLIME_CI_DOCKER_PULL={pull!r}: use one of {', '.join(PULL_POLICIES)}")
    writer = env.get("SLIME_CI_CACHE_WRITER", "").strip().lower()
    if writer not in ("", "0", "1", "true", "false"):
        raise ValueError(f"SLIME_CI_CACHE_WRITER={writer!r}: use 1 or 0")
    mode = env.get("SLIME_CI_GPU_DEVICES") or "gpus"
    if mode not in GPU_DEVICE_MODES:
        raise ValueError(f"SLIME_CI_GPU_DEVICES={mode!r}: use one of {', '.join(GPU_DEVICE_MODES)} "
                         "(cdi for rootless Podman, runners/README.md)")
    return HostSettings(caches=caches, pull=pull, cache_writer=writer in ("1", "true"),
                        gpu_devices=mode)


@dataclass(frozen=True, kw_only=True)
class HostLimits:
    """What this host lets a container have; a GPU host grants everything."""

    full_capabilities: bool  # --privileged needs every capability in the bounding set
    memlock_max: int  # bytes; -1 when unlimited locked memory can be granted


def parse_host_limits(status: str, cap_last_cap: int, memlock_hard: int) -> HostLimits:
    """Read limits from /proc/self/status text, cap_last_cap and the hard RLIMIT_MEMLOCK (pure)."""
    match = re.search(r"^CapBnd:\s*([0-9a-fA-F]+)$", status, re.MULTILINE)
    bounding = int(match.group(1), 16) if match else 0
    full = bounding & ((1 << (cap_last_cap + 1)) - 1) == (1 << (cap_last_cap + 1)) - 1
    raise_ok = bool(bounding >> _CAP_SYS_RESOURCE & 1)
    unlimited = memlock_hard in (resource.RLIM_INFINITY, UNLIMITED)
    return HostLimits(
        full_capabilities=full,
        memlock_max=UNLIMITED if unlimited or raise_ok else memlock_hard,
    )


def read_host_limits() -> HostLimits:
    """This machine's limits, from /proc and getrlimit."""
    status = Path("/proc/self/status").read_text()
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text().strip())
    return parse_host_limits(status, last, resource.getrlimit(resource.RLIMIT_MEMLOCK)[1])


def fit_to_host(opts: DockerOptions, limits: HostLimits) -> tuple[DockerOptions, tuple[str, ...]]:
    """Lower the flags a restricted host cannot grant; returns the options and what was lowered.

    A sandboxed machine without CAP_SYS_RESOURCE can neither run a privileged container
    nor raise locked memory; runc fails there with "operation not permitted".
    """
    notes: list[str] = []
    if opts.privileged and not limits.full_capabilities:
        opts = replace(opts, privileged=False)
        notes.append("--privileged dropped: this host's capability bounding set is not full")
    if limits.memlock_max != UNLIMITED and (
        opts.memlock == UNLIMITED or opts.memlock > limits.memlock_max
    ):
        opts = replace(opts, memlock=limits.memlock_max)
        notes.append(f"memlock lowered to {limits.memlock_max}: this host cannot raise it")
    return opts, tuple(notes)
