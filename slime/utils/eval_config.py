"""Evaluation datasets from a YAML file: shared defaults, per-dataset overrides, strict keys."""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any


class EvalConfigError(ValueError):
    """An evaluation config that cannot be used; the message names the dataset and key."""


@dataclass(frozen=True, kw_only=True)
class EvalDataset:
    """One evaluation dataset, every setting resolved."""

    name: str
    path: str
    rm_type: str = "math"
    n_samples_per_prompt: int = 1
    temperature: float = 0.0
    top_p: float = 1.0
    max_response_len: int = 1024
    prompt_key: str = "prompt"
    label_key: str = "label"


_KEYS = {f.name for f in fields(EvalDataset)}
_DEFAULTABLE = _KEYS - {"name", "path"}


def _check_keys(where: str, keys: Any, allowed: set[str]) -> None:
    for key in keys:
        if key not in allowed:
            near = difflib.get_close_matches(str(key), sorted(allowed), n=1)
            hint = f"; did you mean {near[0]!r}?" if near else f"; allowed: {', '.join(sorted(allowed))}"
            raise EvalConfigError(f"{where}: unknown key {key!r}{hint}")


def _build(where: str, values: dict[str, Any]) -> EvalDataset:
    from slime.rollout.rm_hub import RM_TYPES

    for key in ("name", "path"):
        if not values.get(key):
            raise EvalConfigError(f"{where}: '{key}' is required")
    try:
        ds = EvalDataset(**values)
    except TypeError as exc:
        raise EvalConfigError(f"{where}: {exc}") from None
    if ds.rm_type not in RM_TYPES:
        raise EvalConfigError(
            f"{where}: rm_type {ds.rm_type!r} is unknown; pick one of {', '.join(RM_TYPES)}"
        )
    if not isinstance(ds.n_samples_per_prompt, int) or ds.n_samples_per_prompt < 1:
        raise EvalConfigError(f"{where}: n_samples_per_prompt must be an integer >= 1")
    if not isinstance(ds.temperature, (int, float)) or ds.temperature < 0:
        raise EvalConfigError(f"{where}: temperature must be >= 0 (0 is greedy)")
    if not 0 < ds.top_p <= 1:
        raise EvalConfigError(f"{where}: top_p must be in (0, 1]")
    if not isinstance(ds.max_response_len, int) or ds.max_response_len < 1:
        raise EvalConfigError(f"{where}: max_response_len must be an integer >= 1")
    return ds


def parse_eval_config(data: Any, *, source: str = "eval config") -> tuple[EvalDataset, ...]:
    """Resolve `{defaults: {...}, datasets: [{name, path, ...}, ...]}` into datasets."""
    if not isinstance(data, dict):
        raise EvalConfigError(f"{source}: expected a mapping with 'datasets'")
    _check_keys(source, data, {"defaults", "datasets"})
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise EvalConfigError(f"{source}: 'defaults' must be a mapping")
    _check_keys(f"{source}: defaults", defaults, _DEFAULTABLE)
    entries = data.get("datasets")
    if not isinstance(entries, list) or not entries:
        raise EvalConfigError(f"{source}: 'datasets' must be a non-empty list")
    out: list[EvalDataset] = []
    for i, entry in enumerate(entries):
        where = f"{source}: datasets[{i}]"
        if not isinstance(entry, dict):
            raise EvalConfigError(f"{where}: expected a mapping")
        _check_keys(where, entry, _KEYS)
        ds = _build(f"{where} ({entry.get('name', '?')})", {**defaults, **entry})
        if any(d.name == ds.name for d in out):
            raise EvalConfigError(f"{where}: dataset name {ds.name!r} is used twice; metrics would collide")
        out.append(ds)
    return tuple(out)


def load_eval_config(path: str | os.PathLike[str]) -> tuple[EvalDataset, ...]:
    """Read and resolve a YAML evaluation config."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise EvalConfigError(f"{p}: no such eval config")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise EvalConfigError(f"{p}: not valid YAML: {exc}") from None
    return parse_eval_config(data, source=str(p))
