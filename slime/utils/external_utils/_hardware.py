"""The GPU machines slime's scripts know (GPUs per node, generation) and NVLink detection."""

from __future__ import annotations

import re
import subprocess

NUM_GPUS_OF_HARDWARE = {"H100": 8, "H200": 8, "B200": 8, "GB200": 4, "GB300": 4}
GENERATION_HARDWARE = {"H100": "Hopper", "H200": "Hopper", "B200": "Blackwell",
                       "GB200": "Blackwell", "GB300": "Blackwell"}


def nvlink_present(topology: str) -> bool:
    """Whether `nvidia-smi topo -m` output shows GPUs joined by NVLink (NV1, NV12, …)."""
    return re.search(r"\bNV\d+\b", topology) is not None


def check_has_nvlink() -> bool:
    """Whether this machine's GPUs are joined by NVLink (False without nvidia-smi)."""
    try:
        result = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and nvlink_present(result.stdout)
