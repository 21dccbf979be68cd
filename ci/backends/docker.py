"""The Docker backend: each entry in the framework image with the GPU flags (`ci.backends.docker_argv`).

The entry's own variables go into the container (`EntryEnv.own`); what the runner merely
inherited stays outside, and secrets are passed by name (`ci.backends.docker_argv.DEFAULT_PASSTHROUGH`).
Killing the `docker run` client does not stop its container, so `abort` kills the
container by the name the launch gave it.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

from ci.backends.base import EntryEnv, Launch, Note
from ci.backends.docker_argv import (
    DockerOptions,
    Pull,
    container_name,
    docker_kill_argv,
    docker_run_argv,
    fit_to_host,
    host_settings,
    read_host_limits,
)
from ci.backends.local import LocalBackend
from ci.errors import UsageError
from ci.registry.model import FRAMEWORK_IMAGE
from ci.select.entries import ResolvedEntry

DAEMON_TIMEOUT = 30.0  # seconds to wait for `docker version` to hear from the daemon
ADVICE = "start it, or pass --no-docker (this environment) or --emulate-gpus (no GPUs)"


def daemon_problem(timeout: float = DAEMON_TIMEOUT) -> str | None:
    """Why the Docker daemon cannot run containers here; None when it answers."""
    try:
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"],
                              capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return "the docker command is not installed"
    except subprocess.TimeoutExpired:
        return f"the daemon did not answer within {timeout:.0f}s"
    if proc.returncode == 0 and proc.stdout.strip():
        return None
    lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
    return (lines[0] if lines else f"docker version exited with {proc.returncode}")[:200]


class DockerBackend(LocalBackend):
    """`docker run` of the entry's command in the image, on the GPUs its lock granted."""

    name = "docker"
    forks_entries = False  # the process here is `docker run`; the file runs in the container

    def __init__(self, *, gpus: int, image: str | None, pull: str | None, root: str,
                 lock_path_pattern: str | None, note: Note) -> None:
        super().__init__(gpus=gpus, lock_path_pattern=lock_path_pattern)
        host = host_settings(os.environ)
        self.image = image or FRAMEWORK_IMAGE
        self.pull: Pull = pull or host.pull or "always"  # type: ignore[assignment]
        self._caches = host.caches
        self._cache_writer = host.cache_writer
        self._gpu_devices = host.gpu_devices
        self._limits = read_host_limits()
        self._root = Path(root)
        self._note = note
        self._noted: set[str] = set()

    def check(self) -> None:
        problem = daemon_problem()
        if problem is not None:
            raise UsageError(f"cannot reach the Docker daemon ({problem}): {ADVICE}")
        super().check()

    def launch(self, entry: ResolvedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        # The container has its own /tmp; everything else the entry reads lives under the
        # workspace, which is mounted at the same path.
        inner_env = dict(env.own)
        inner_env["TEST_FILE"] = entry.path
        inner_env["TEST_ARGS"] = " ".join(entry.test_args)
        # PYTHONPATH (in env.own) names the workspace, mounted at the same path: the entry
        # imports the checkout's framework, not the image's installed copy (ci/backends/checkout.py).
        name = container_name(entry.id, uuid.uuid4().hex[:8])
        options = DockerOptions(image=self.image, workspace=self._root, devices=devices,
                                gpu_devices=self._gpu_devices,
                                env=inner_env, caches=self._caches, pull=self.pull, name=name,
                                isolation=entry.container, privileged=entry.container == "framework",
                                writable_caches=self._cache_writer)
        options, notes = fit_to_host(options, self._limits)
        for text in notes:
            if text not in self._noted:
                self._noted.add(text)
                self._note(f"docker: {text}")
        return Launch(argv=docker_run_argv(options, inner=("python3", *argv[1:])),
                      env=env.local(), handle=name)

    def abort(self, launch: Launch) -> None:
        if launch.handle:
            subprocess.run(docker_kill_argv(launch.handle), stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=60, check=False)

    @property
    def local_processes(self) -> bool:
        return False  # the entry imports what the image and the mounted workspace hold

    def describe(self) -> str:
        return f"docker {self.image}"
