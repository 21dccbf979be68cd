"""Prompts from a JSONL data set, handed out in order by a cursor that wraps into new epochs."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, kw_only=True)
class Prompt:
    """One prompt and the label its reward is graded against."""

    index: int
    text: str
    label: Any


def read_prompts(path: str | Path, *, prompt_key: str = "prompt", label_key: str = "label") -> list[Prompt]:
    """Every row of a JSONL file; a row without the keys is an error naming its line."""
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        row = json.loads(line)
        if prompt_key not in row or label_key not in row:
            raise ValueError(f"{path}:{n}: row lacks {prompt_key!r} or {label_key!r} (keys: {sorted(row)})")
        rows.append(Prompt(index=len(rows), text=str(row[prompt_key]), label=row[label_key]))
    if not rows:
        raise ValueError(f"{path}: no prompts")
    return rows


class PromptSource:
    """A cursor over prompts; each epoch is shuffled with `seed + epoch` (or kept in order)."""

    def __init__(self, prompts: list[Prompt], *, shuffle: bool = True, seed: int = 0) -> None:
        self.prompts = prompts
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.cursor = 0
        self._order = self._epoch_order()

    def _epoch_order(self) -> list[int]:
        order = list(range(len(self.prompts)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        return order

    def next_batch(self, n: int) -> list[Prompt]:
        """The next `n` prompts, moving into the next epoch when this one runs out."""
        out = []
        while len(out) < n:
            if self.cursor == len(self._order):
                self.epoch += 1
                self.cursor = 0
                self._order = self._epoch_order()
            out.append(self.prompts[self._order[self.cursor]])
            self.cursor += 1
        return out

    def state(self) -> dict[str, int]:
        """Where the cursor stands (to resume)."""
        return {"epoch": self.epoch, "cursor": self.cursor}
