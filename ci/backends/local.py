"""The local backend: entries run in this environment (CPU suites, GPU suites with `--no-docker`)."""

from __future__ import annotations

from ci.backends.base import EntryEnv, Launch
from ci.backends.process import LocalProcessBackend
from ci.errors import UsageError
from ci.gpu.allocator import DEFAULT_PATTERN, nvml_gpu_count
from ci.select.entries import ResolvedEntry


def check_gpu_count(gpus: int) -> None:
    """Refuse `--gpus N` above what NVML sees (when it sees any): the locks would hand out
    GPUs that do not exist and entries would fail late, one by one."""
    seen = nvml_gpu_count()
    if seen is not None and gpus > seen:
        raise UsageError(f"--gpus {gpus}: NVML sees {seen} GPU(s) on this machine; pass "
                         f"--gpus {seen} or less, or --emulate-gpus to run on logical GPUs")


class LocalBackend(LocalProcessBackend):
    """The entry's local argv, in the runner's environment, on the GPUs its lock granted."""

    name = "local"
    forks_entries = True  # a CPU pytest file may fork from a pre-imported worker

    def __init__(self, *, gpus: int = 0, lock_path_pattern: str | None = None) -> None:
        super().__init__(gpus=gpus)
        self._pattern = lock_path_pattern or DEFAULT_PATTERN

    def check(self) -> None:
        if self.gpus:
            check_gpu_count(self.gpus)

    def launch(self, entry: ResolvedEntry, argv: tuple[str, ...], env: EntryEnv,
               devices: tuple[int, ...]) -> Launch:
        full = env.local()
        if entry.num_gpus:
            full["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        return Launch(argv=argv, env=full)

    @property
    def lock_pattern(self) -> str:
        return self._pattern

    def describe(self) -> str:
        return "local"
