"""The verifiable task: one-digit addition and subtraction, prompt `a+b=` and label the exact answer."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from pathlib import Path
from typing import Any


def all_problems() -> list[dict[str, str]]:
    """Every `a+b=` and `a-b=` (a >= b, so answers are non-negative) with one-digit a and b."""
    records = [{"prompt": f"{a}+{b}=", "label": str(a + b)} for a in range(10) for b in range(10)]
    records += [{"prompt": f"{a}-{b}=", "label": str(a - b)} for a in range(10) for b in range(a + 1)]
    return records


def make_records(seed: int = 0, *, eval_fraction: float = 0.2) -> tuple[list[dict[str, str]],
                                                                       list[dict[str, str]]]:
    """(train, eval): the problems shuffled by `seed` and split; no prompt is in both."""
    if not 0.0 < eval_fraction < 1.0:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    records = all_problems()
    random.Random(seed).shuffle(records)
    n_eval = max(1, round(len(records) * eval_fraction))
    return records[n_eval:], records[:n_eval]


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> Path:
    """One JSON object per line."""
    with path.open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    return path


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSONL file (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_dataset(out_dir: str | Path, *, seed: int = 0, eval_fraction: float = 0.2) -> Path:
    """Write `train.jsonl` and `eval.jsonl` into `out_dir`; returns `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, evaluation = make_records(seed, eval_fraction=eval_fraction)
    write_jsonl(out / "train.jsonl", train)
    write_jsonl(out / "eval.jsonl", evaluation)
    return out
