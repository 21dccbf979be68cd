"""Entries import the framework from the checkout being run, never from another tree.

A script entry starts as `python tests/e2e/<file>.py`: its `sys.path[0]` is the script's
directory, so without help `import slime` resolves through site-packages, which may be an
editable install of a different checkout (two worktrees, one venv). The runner therefore
puts the root first on every entry's PYTHONPATH (`entry_env`), and before anything starts
it asks an interpreter with an entry's environment where each of the checkout's top-level
packages would come from; one resolving elsewhere stops the run with a line naming it.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ci.errors import UsageError

# Top-level directories that are never the framework an entry imports.
NOT_PACKAGES = frozenset({"tests", "benchmarks", "runners", "docs", "build", "dist"})

_PROBE = (
    "import importlib.util, json, sys\n"
    "out = {}\n"
    "for name in sys.argv[1:]:\n"
    "    try:\n"
    "        spec = importlib.util.find_spec(name)\n"
    "    except (ImportError, ValueError):\n"
    "        spec = None\n"
    "    locs = list(spec.submodule_search_locations or []) if spec else []\n"
    "    out[name] = locs[0] if locs else (spec.origin if spec else None)\n"
    "print(json.dumps(out))\n"
)


def pythonpath(root: Path, inherited: str | None) -> str:
    """The checkout's root first, then whatever the caller's PYTHONPATH already held."""
    rest = [p for p in (inherited or "").split(os.pathsep) if p and Path(p) != root]
    return os.pathsep.join([str(root), *rest])


def packages(root: Path, declared: Sequence[str] = ()) -> tuple[str, ...]:
    """The framework packages entries must import from root: those declared, else every
    top-level package directory of the checkout (`slime`, `ci`, or an adopter's own)."""
    if declared:
        return tuple(declared)
    found = (p.name for p in sorted(root.iterdir())
             if p.is_dir() and (p / "__init__.py").is_file() and p.name.isidentifier()
             and p.name not in NOT_PACKAGES)
    return tuple(found)


def resolve(python: str, names: Sequence[str], *, env: Mapping[str, str], cwd: Path,
            timeout: float = 60.0) -> dict[str, str | None]:
    """Where `python`, started with env in cwd (as an entry is), finds each package."""
    if not names:
        return {}
    try:
        proc = subprocess.run([python, "-c", _PROBE, *names], cwd=cwd, env=dict(env),
                              capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UsageError(f"cannot ask {python} where {', '.join(names)} come from: {exc}") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise UsageError(f"{python} cannot tell where {', '.join(names)} come from: {tail}")
    found: dict[str, str | None] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def strangers(root: Path, found: Mapping[str, str | None]) -> dict[str, str]:
    """The packages that would be imported from outside root (name -> where from)."""
    out: dict[str, str] = {}
    for name, where in found.items():
        if where is None:
            out[name] = "nowhere (not importable)"
        elif not Path(where).resolve().is_relative_to(root.resolve()):
            out[name] = where
    return out


def check(root: Path, found: Mapping[str, str | None]) -> None:
    """Refuse, in one line, a run whose entries would import another tree's framework."""
    bad = strangers(root, found)
    if bad:
        name, where = next(iter(bad.items()))
        raise UsageError(f"entries would import {name} from {where}, not from {root / name}; "
                         "remove the other install from this Python (or its PYTHONPATH) or run "
                         "with the checkout's own environment")


def describe(root: Path, found: Mapping[str, str | None]) -> str:
    """One line for `--dry-run`: where each package is imported from."""
    parts = [f"{name} from {where}" for name, where in found.items()]
    return f"imports {', '.join(parts) or 'nothing of the checkout'} (PYTHONPATH starts with {root})"
