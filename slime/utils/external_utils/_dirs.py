"""Where an entry runs and writes: its device, its output and cache directories, temp files
and directory copies, as the runner's SLIME_CI_* variables set them (defaults when bare)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from ._env import _env


def device(env: Mapping[str, str] | None = None) -> str:
    """"cuda" or "cpu": SLIME_CI_DEVICE when the runner set it, else what torch sees."""
    chosen = _env(env).get("SLIME_CI_DEVICE", "").strip().lower()
    if chosen in ("cuda", "cpu"):
        return chosen
    if chosen:
        raise ValueError(f"SLIME_CI_DEVICE={chosen!r}: use cuda or cpu")
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def output_dir(env: Mapping[str, str] | None = None) -> Path:
    """The entry's private output directory (made when missing)."""
    env = _env(env)
    raw = env.get("SLIME_CI_OUTPUT_DIR")
    # Without a runner, one directory per process keeps two bare runs apart.
    path = Path(raw) if raw else Path(tempfile.gettempdir()) / f"slime-e2e-{os.getpid()}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where models are cached (mounted from the host in the Docker context)."""
    return Path(_env(env).get("SLIME_CI_MODELS_DIR") or "/root/models")


def datasets_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where data sets are cached (mounted from the host in the Docker context)."""
    return Path(_env(env).get("SLIME_CI_DATASETS_DIR") or "/root/datasets")


def save_to_temp_file(text: str, ext: str) -> str:
    """Write `text` to a new file `*.<ext>` in the temp dir (the entry's own under the runner)."""
    fd, name = tempfile.mkstemp(prefix="slime_temp_file_", suffix=f".{ext}")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    print(f"wrote {len(text)} characters to {name}", flush=True)
    return name


def rsync_simple(path_src: str | Path, path_dst: str | Path) -> None:
    """Copy the contents of directory `path_src` into `path_dst` (made when missing), as `rsync -a src/ dst`.

    Done in Python: the CI images need no rsync binary for it.
    """
    src, dst = Path(path_src), Path(path_dst)
    if not src.is_dir():
        raise FileNotFoundError(f"rsync_simple: {src} is not a directory")
    print(f"+ copy {src}/ -> {dst}", flush=True)
    dst.mkdir(parents=True, exist_ok=True)
    # Not shutil.copytree(symlinks=True, dirs_exist_ok=True): it fails on a symlink that a
    # previous copy already placed, and rsync's second run is a no-op.
    for root, dirs, files in os.walk(src):
        here = Path(root)
        into = dst / here.relative_to(src)
        for name in [*dirs, *files]:
            item, target = here / name, into / name
            if item.is_symlink():
                if target.is_symlink() or target.is_file():
                    target.unlink()
                target.symlink_to(os.readlink(item))
            elif item.is_dir():
                target.mkdir(exist_ok=True)
            else:
                shutil.copy2(item, target)
        dirs[:] = [d for d in dirs if not (here / d).is_symlink()]
