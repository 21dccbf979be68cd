"""Prompt datasets from JSONL files, with an optional slice: `data.jsonl@[start:end]`.

Slices with non-negative bounds stream the file and stop at `end`, so taking
the first 100 prompts of a multi-GB dump reads only those lines.
"""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_SPEC = re.compile(r"(?P<path>.+?)@\[(?P<start>-?\d*):(?P<end>-?\d*)\]")


class DataFileError(ValueError):
    """A dataset spec or file that cannot be read; the message names the file and line."""


@dataclass(frozen=True, kw_only=True)
class DataSpec:
    """A file and the slice of its records to use."""

    path: Path
    start: int | None = None
    end: int | None = None


def parse_data_spec(spec: str) -> DataSpec:
    """`path`, or `path@[start:end]` with Python slice bounds (either may be omitted)."""
    if "@[" not in spec:
        return DataSpec(path=Path(spec))
    match = _SPEC.fullmatch(spec)
    if not match:
        raise DataFileError(f"cannot read data spec {spec!r}; write it as 'file.jsonl@[start:end]'")
    start, end = match.group("start"), match.group("end")
    return DataSpec(
        path=Path(match.group("path")),
        start=int(start) if start else None,
        end=int(end) if end else None,
    )


def _records(path: Path) -> Any:
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFileError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None


def read_jsonl(spec: str) -> list[dict[str, Any]]:
    """The records a spec selects, in file order."""
    ds = parse_data_spec(spec)
    if not ds.path.is_file():
        raise DataFileError(f"{ds.path}: no such file")
    records = _records(ds.path)
    if (ds.start or 0) >= 0 and (ds.end is None or ds.end >= 0):
        # Streaming: stop reading at `end`.
        out = list(itertools.islice(records, ds.start or 0, ds.end))
    else:
        out = list(records)[ds.start : ds.end]
    for i, rec in enumerate(out):
        if not isinstance(rec, dict):
            kind = type(rec).__name__
            raise DataFileError(f"{ds.path}: record {i} of the selection is a {kind}, not an object")
    return out


def to_items(
    records: list[dict[str, Any]], *, prompt_key: str = "prompt", label_key: str = "label"
) -> list[tuple[Any, Any]]:
    """(prompt, label) pairs; a record without the prompt key is an error, a missing label is None."""
    items = []
    for i, rec in enumerate(records):
        if prompt_key not in rec:
            raise DataFileError(
                f"record {i} has no {prompt_key!r} key (keys: {sorted(rec)}); pass prompt_key"
            )
        items.append((rec[prompt_key], rec.get(label_key)))
    return items
