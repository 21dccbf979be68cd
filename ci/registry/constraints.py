"""`python -m ci lock`: the constraints files every session installs from, and their drift check.

    python -m ci lock                     rewrite constraints/py3.10.txt and py3.11.txt
    python -m ci lock --python 3.11       just one Python version
    python -m ci lock --check             exit 1 (and show the diff) when a fresh resolve differs

One resolve (`uv pip compile`) covers every profile of pyproject.toml at once (dependency
groups and extras, read through ci/registry/profiles.py, as the sessions install them), so all profiles
agree on each version and a new release of transformers, ray or numpy reaches CI only when
someone re-runs this command and commits the result. Torch is the project's pin (2.13.0):
the constraint `torch==2.13.0` also admits the CPU build `2.13.0+cpu` that the sessions
install from the PyTorch CPU index (a local version label is ignored by `==`).
`--check` is what a scheduled job runs: it resolves fresh from the index and compares.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.args import installed
from ci.errors import EXIT_FAILED, EXIT_OK, CIError, UsageError

CONSTRAINTS_DIR = "constraints"
PYTHONS: tuple[str, ...] = ("3.10", "3.11")  # 3.11: every CI job; 3.10: the oldest supported
PLATFORM = "x86_64-manylinux_2_28"  # CI's runners; torch's CPU wheels are built for it
COMMAND = "python -m ci lock"  # what the file's header says made it
NO_LOCK_ENV = "SLIME_CI_NO_LOCK"
NO_LOCK_FLAG = "--no-lock"


class ConstraintsMissing(CIError):
    """A session's Python has no constraints file."""


def constraints_path(root: Path, python: str) -> Path:
    """constraints/py<X.Y>.txt under `root`."""
    return root / CONSTRAINTS_DIR / f"py{python}.txt"


def every_requirement(root: Path) -> list[str]:
    """Every requirement of every session profile (groups and extras), once, in order."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        raise UsageError(f"{COMMAND} reads pyproject.toml with tomllib: run it with Python 3.11+") from None
    from ci.registry.profiles import names, requirements

    path = root / "pyproject.toml"
    try:
        pyproject = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: cannot read it ({exc.__class__.__name__}); fix it and rerun") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path}: not valid TOML ({exc}); fix it and rerun") from None
    return list(dict.fromkeys(r for name in names(pyproject) for r in requirements(pyproject, name)))


def compile_argv(uv: str, source: Path, python: str, out: Path) -> list[str]:
    """The resolver's command line for one Python version (pure)."""
    return [uv, "pip", "compile", str(source), "--python-version", python,
            "--python-platform", PLATFORM, "--no-annotate", "--quiet", "--custom-compile-command", COMMAND,
            "--output-file", str(out)]


def find_uv(env: Mapping[str, str]) -> str:
    """The uv executable: next to this interpreter, or on PATH."""
    found = installed("uv", env)
    if found is None:
        raise UsageError("uv is not installed: pip install uv (the dev profile has it), then rerun")
    return found


def resolve(root: Path, python: str, env: Mapping[str, str]) -> str:
    """A fresh resolve's constraints text for `python`."""
    uv = find_uv(env)
    with tempfile.TemporaryDirectory(prefix="slime-constraints-") as tmp:
        out = Path(tmp) / f"py{python}.txt"
        source = Path(tmp) / "profiles.in"
        source.write_text("".join(f"{req}\n" for req in every_requirement(root)), encoding="utf-8")
        proc = subprocess.run(compile_argv(uv, source, python, out), env=dict(env), capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["(no output)"]
            raise UsageError(f"uv pip compile for Python {python} failed: {tail[0]}")
        return out.read_text()


def pins(text: str) -> list[str]:
    """The requirement lines of a constraints file (comments and blanks dropped)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@dataclass(frozen=True, kw_only=True)
class Drift:
    """How one checked-in constraints file differs from a fresh resolve (empty diff: current)."""

    python: str
    path: Path
    diff: tuple[str, ...]

    @property
    def current(self) -> bool:
        return not self.diff


def check(root: Path, python: str, env: Mapping[str, str]) -> Drift:
    """Compare the checked-in constraints file of `python` with a fresh resolve."""
    path = constraints_path(root, python)
    old = pins(path.read_text()) if path.is_file() else []
    new = pins(resolve(root, python, env))
    diff = tuple(line for line in difflib.unified_diff(old, new, str(path), "fresh resolve", lineterm="", n=0)
                 if not line.startswith("@@"))
    return Drift(python=python, path=path, diff=diff)


def write(root: Path, python: str, env: Mapping[str, str]) -> Path:
    """Resolve and write the constraints file of `python`; returns its path."""
    path = constraints_path(root, python)
    text = resolve(root, python, env)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # never a half-written lock
    return path


# ---- what a session installs with --------------------------------------------------------------

def constraints_disabled(posargs: Sequence[str], env: Mapping[str, str]) -> bool:
    """`--no-lock` among a session's arguments, or SLIME_CI_NO_LOCK=1: resolve fresh."""
    return NO_LOCK_FLAG in posargs or env.get(NO_LOCK_ENV, "").strip().lower() in ("1", "true", "yes")


def strip_no_lock_flag(posargs: Sequence[str]) -> list[str]:
    """A session's arguments without `--no-lock` (it is the session's, not the suite runner's)."""
    return [a for a in posargs if a != NO_LOCK_FLAG]


def constraint_args(root: Path, python: str, *, disabled: bool) -> list[str]:
    """pip arguments that hold an install to the constraints file of `python` (none when disabled)."""
    if disabled:
        return []
    path = constraints_path(root, python)
    if not path.is_file():
        raise ConstraintsMissing(f"no constraints file for Python {python} ({path.relative_to(root)}): run "
                                 f"`{COMMAND} --python {python}` and commit it, or pass --no-lock "
                                 "(SLIME_CI_NO_LOCK=1) to resolve fresh")
    return ["-c", str(path)]


def main(argv: Sequence[str] | None = None, *, env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    p = argparse.ArgumentParser(prog="python -m ci lock", description=__doc__.split("\n\n")[0],
                                epilog="exit codes: 0 current (or written), 1 a lock is behind, 2 bad input")
    p.add_argument("--python", nargs="+", default=list(PYTHONS), metavar="X.Y",
                   help=f"Python versions to lock (default: {' '.join(PYTHONS)})")
    p.add_argument("--check", action="store_true", help="resolve fresh and compare; write nothing")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="the repository (default: here)")
    args = p.parse_args(argv)
    for python in args.python:
        parts = python.split(".")
        if len(parts) != 2 or not all(x.isdigit() for x in parts):
            raise UsageError(f"--python takes versions like 3.11, got {python!r}")
    root = args.root.resolve()
    if not (root / "pyproject.toml").is_file():
        raise UsageError(f"{root} has no pyproject.toml; run from the repository root or pass --root")
    if not args.check:
        for python in args.python:
            path = write(root, python, env)
            print(f"{path.relative_to(root)}: {len(pins(path.read_text()))} pins", flush=True)
        return EXIT_OK
    behind = 0
    for python in args.python:
        drift = check(root, python, env)
        rel = drift.path.relative_to(root)
        if drift.current:
            print(f"{rel}: current", flush=True)
            continue
        behind += 1
        print(f"{rel}: behind a fresh resolve; update with `{COMMAND} --python {python}`", flush=True)
        print("\n".join(drift.diff), flush=True)
    return EXIT_FAILED if behind else EXIT_OK
