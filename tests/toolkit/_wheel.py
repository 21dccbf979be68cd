"""The toolkit as an adopter gets it: a wheel built from this checkout, in a fresh venv.

The venv sees nothing of the environment running the tests but the wheel and the
third-party distributions a test names (linked into a directory of their own, which a
`.pth` file puts on the venv's path): never this checkout, never its `slime`. No network:
the wheel is built without build isolation, with this environment's setuptools.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path

from _ci import REPO

# Without PYTHONPATH (which names this checkout in the toolkit's tests): pip would take a
# checkout's egg-info for an installed slime-ci, and the venv must not see the checkout.
_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PIP_DISABLE_PIP_VERSION_CHECK": "1"}

# Not part of a source tree a build sees (caches, venvs, earlier builds).
_SKIP = shutil.ignore_patterns(".git", ".nox", ".ci-cache", "__pycache__", "build", "dist", "*.egg-info",
                               ".mypy_cache", ".ruff_cache")


def build_wheel(dest: Path) -> Path:
    """Build the slime-ci wheel from a copy of this checkout (the checkout itself gets no
    build/ or egg-info, so parallel tests cannot race on it). The whole tree is copied, as
    an sdist or a clone would hold it: what the wheel leaves out is the packaging's choice."""
    src = dest / "src"
    shutil.copytree(REPO, src, ignore=_SKIP, symlinks=True)
    out = dest / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(out)], check=True, timeout=300,
                   env=_ENV)
    (wheel,) = out.glob("slime_ci-*.whl")
    return wheel


def _top_levels(dist: md.Distribution) -> set[str]:
    names = set()
    for f in dist.files or ():
        first = f.parts[0]
        if first.endswith((".dist-info", ".egg-info")) or first == "..":
            names.add(first)
            continue
        names.add(first)  # a package directory, or a single-file module (`py.py`)
    return {n for n in names if n not in ("__pycache__", "bin")}


def _closure(names: list[str]) -> dict[str, md.Distribution]:
    found: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = re.split(r"[\[<>=!~ ;(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue  # an optional dependency this environment lacks
        found[name] = dist
        todo += [r for r in dist.requires or () if "extra ==" not in r]
    return found


def fresh_venv(path: Path, wheel: Path, *, deps: tuple[str, ...] = ()) -> Path:
    """A venv with the wheel installed (no index) and `deps` (and what they require) linked in."""
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)
    python = path / "bin" / "python"
    purelib = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    # This environment's pip installs into the venv (`--python`): the real install path.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True, timeout=300,
                   env=_ENV)
    linked = path / "deps"
    linked.mkdir()
    for dist in _closure(list(deps)).values():
        base = Path(str(dist.locate_file("")))
        for top in _top_levels(dist):
            if top.removesuffix(".py") in ("ci", "slime"):
                raise AssertionError(f"dependency {dist.metadata['Name']} would bring {top}/")
            source = base / top
            if source.exists() and not (linked / top).exists():
                (linked / top).symlink_to(source)
    (purelib / "zz-test-deps.pth").write_text(f"{linked}\n")
    return python


def add_to_path(python: Path, name: str, folder: Path) -> None:
    """Put `folder` on the venv's path the way an editable install of it does (a .pth)."""
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, f"{name}.pth").write_text(f"{folder}\n")
