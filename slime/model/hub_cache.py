"""Lay a local directory out as a Hugging Face hub cache entry, so the offline download path serves it.

The hub cache (`HF_HUB_CACHE`) holds, per repository, `<type>s--<org>--<name>/` with
`blobs/<hash>` (file contents), `snapshots/<revision>/<path>` (relative symlinks into blobs) and
`refs/main` (the revision `main` points at). `huggingface_hub.snapshot_download` with
`HF_HUB_OFFLINE=1` resolves `main` through `refs/main` and returns the snapshot directory,
exactly as for a model downloaded earlier. The revision here is a content hash of the files,
so publishing the same files twice gives the same revision.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Literal

RepoType = Literal["model", "dataset"]


def repo_folder_name(repo_id: str, repo_type: RepoType) -> str:
    """`models--org--name` / `datasets--org--name`, as huggingface_hub names cache folders."""
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        raise ValueError(f"repo_id must look like 'org/name', got {repo_id!r}")
    return f"{repo_type}s--" + repo_id.replace("/", "--")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def publish_to_hub_cache(src_dir: str | Path, repo_id: str, *, repo_type: RepoType = "model",
                         cache_dir: str | Path) -> Path:
    """Copy `src_dir`'s files into the cache as `repo_id`'s `main` revision; returns the snapshot dir."""
    if repo_type not in ("model", "dataset"):
        raise ValueError(f"repo_type must be 'model' or 'dataset', got {repo_type!r}")
    src = Path(src_dir)
    files = sorted(p for p in src.rglob("*") if p.is_file())
    if not files:
        raise ValueError(f"{src}: no files to publish")
    repo = Path(cache_dir) / repo_folder_name(repo_id, repo_type)
    blobs = repo / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    listing = []
    for path in files:
        blob = _sha256(path)
        target = blobs / blob
        if not target.exists():
            tmp = target.with_suffix(".incomplete")
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
        listing.append((path.relative_to(src).as_posix(), blob))
    # A 40-hex revision, like a git commit id, derived from the file list and contents.
    revision = hashlib.sha1("".join(f"{rel}\0{blob}\n" for rel, blob in listing).encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    for rel, blob in listing:
        link = snapshot / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blobs / blob, link.parent))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot
