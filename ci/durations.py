"""The durations store: measured seconds per entry, kept between runs for ordering and sharding."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

# Where a checkout keeps measured durations (relative to its root); CI caches this file.
DURATIONS_FILE = ".ci-cache/durations.json"


class DurationStore:
    """Measured seconds per entry id, kept between runs so plans can order and shard by them."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, float]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if not isinstance(data, dict):
            return {}
        return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}

    def update(self, measured: Mapping[str, float]) -> None:
        """Merge new measurements in; written atomically so concurrent runs never see half a file."""
        data = self.load()
        data.update({k: round(v, 2) for k, v in measured.items()})
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
        tmp.replace(self.path)
