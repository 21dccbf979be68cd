"""The emulated-GPU backend: logical GPUs under real locks, every rank on the CPU.

Entries see `SLIME_CI_EMULATE_GPUS=1`, `SLIME_CI_DEVICE=cpu` and no CUDA device. The
locks live in a private temporary directory unless `--lock-path-pattern` names one,
so a laptop run never queues behind the machine's real GPUs.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from ci.backends.base import EntryEnv, Launch
from ci.backends.process import LocalProcessBackend
from ci.select.entries import ResolvedEntry


class EmulatedBackend(LocalProcessBackend):
    """Local processes on logical GPUs."""

    name = "emulated"

    def __init__(self, *, gpus: int, lock_path_pattern: str | None = None) -> None:
        super().__init__(gpus=gpus)
        self._given = lock_path_pattern
        self._dir: str | None = None

    def launch(self, entry: ResolvedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        full = env.local()
        full.update({"SLIME_CI_EMULATE_GPUS": "1", "SLIME_CI_DEVICE": "cpu",
                     "CUDA_VISIBLE_DEVICES": ""})
        return Launch(argv=argv, env=full)

    @property
    def lock_pattern(self) -> str:
        if self._given is not None:
            return self._given
        if self._dir is None:
            self._dir = tempfile.mkdtemp(prefix="slime-ci-locks-")
        return os.path.join(self._dir, "gpu_{gpu_id}.lock")

    @property
    def emulated(self) -> bool:
        return True

    def describe(self) -> str:
        return "local, GPUs emulated on the CPU"

    def close(self) -> None:
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
