"""The environment U runs in: this repository's root and the on/off flags scripts read.

Every reader takes `env` (default: os.environ), so tests pass the world in.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
repo_base_dir = REPO_ROOT  # the name slime's own scripts use

_warned_bool_values: set[tuple[str, str]] = set()


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def get_bool_env_var(name: str, default: str | bool = "false", *,
                     env: Mapping[str, str] | None = None) -> bool:
    """True only for "true" or "1" (any case), as in slime's scripts; `default` when unset.

    Any other non-empty value counts as false and is reported once on stderr, so a typo
    such as `SLIME_TEST_ENABLE_EVAL=yes` is visible instead of silently ignored.
    """
    raw = _env(env).get(name)
    if raw is None:
        if isinstance(default, bool):
            return default
        raw = default
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value not in ("false", "0", "") and (name, value) not in _warned_bool_values:
        _warned_bool_values.add((name, value))
        print(f"warning: {name}={raw!r} is neither true/1 nor false/0; counted as false",
              file=sys.stderr, flush=True)
    return False


def get_env_enable_infinite_run(env: Mapping[str, str] | None = None) -> bool:
    """Whether SLIME_TEST_ENABLE_INFINITE_RUN asks to repeat the test until it fails."""
    return get_bool_env_var("SLIME_TEST_ENABLE_INFINITE_RUN", "false", env=env)


def _repo_path(path: str | Path) -> Path:
    """A script path as slime's helpers take it: absolute, else relative to the working
    directory (where slime's scripts run them), else to this repository."""
    given = Path(path)
    if given.is_absolute():
        return given
    here = Path.cwd() / given
    return here if here.exists() else REPO_ROOT / given
