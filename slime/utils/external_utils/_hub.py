"""Models and data sets from the Hugging Face hub: `hf download` as the original ran it, or
huggingface_hub, which also serves them offline from the hub cache."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from ._dirs import datasets_dir, models_dir
from ._env import _env, get_bool_env_var
from ._shell import exec_command


def _hf_download(repo_id: str, *, repo_type: str, local_dir: Path, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        # Online: straight into local_dir (no second copy of a large model in the hub cache).
        # Offline (HF_HUB_OFFLINE=1): a complete local_dir is returned as it is.
        return Path(snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision,
                                      local_dir=str(local_dir)))
    except LocalEntryNotFoundError:
        pass
    # Offline with an empty local_dir: serve the snapshot the hub cache (HF_HUB_CACHE) holds,
    # which raises LocalEntryNotFoundError itself when the cache lacks it too.
    snapshot = Path(snapshot_download(repo_id=repo_id, repo_type=repo_type, revision=revision))
    _materialize(snapshot, local_dir)
    return local_dir


def _materialize(snapshot: Path, local_dir: Path) -> None:
    # Cache snapshots are symlinks into a blob store that is not mounted everywhere the
    # local_dir is (containers): place real files, hard-linked where the filesystem allows.
    for src in sorted(snapshot.rglob("*")):
        if src.is_dir():
            continue
        dst = local_dir / src.relative_to(snapshot)
        dst.parent.mkdir(parents=True, exist_ok=True)
        if dst.exists():
            continue
        blob = src.resolve()
        try:
            os.link(blob, dst)
        except OSError:
            shutil.copy2(blob, dst)


def _hf_command(env: Mapping[str, str]) -> str | None:
    """The `hf` CLI on PATH (as the original's shell found it), else beside this interpreter;
    None when offline or absent."""
    if get_bool_env_var("HF_HUB_OFFLINE", env=env):
        return None  # offline, the snapshot must come from the hub cache (see _hf_download)
    beside = Path(sys.executable).parent / "hf"
    return shutil.which("hf", path=env.get("PATH")) or (str(beside) if beside.is_file() else None)


def hf_download_dataset(full_name: str, *, revision: str | None = None,
                        env: Mapping[str, str] | None = None) -> Path:
    """Fetch data set `org/name` into `<datasets dir>/<name>`, with `hf download` as the original.

    Without the `hf` command, or offline (HF_HUB_OFFLINE=1, where the snapshot is served
    from the hub cache), through huggingface_hub.
    """
    env = _env(env)
    name = full_name.rsplit("/", maxsplit=1)[-1]
    local_dir = datasets_dir(env) / name
    hf = _hf_command(env)
    if hf is None:
        return _hf_download(full_name, repo_type="dataset", local_dir=local_dir, revision=revision)
    exec_command([hf, "download", "--repo-type", "dataset", full_name, "--local-dir", str(local_dir),
                  *(["--revision", revision] if revision else [])], env=env)
    return local_dir


def hf_download_model(full_name: str, *, revision: str | None = None,
                      env: Mapping[str, str] | None = None) -> Path:
    """Fetch model `org/name` into `<models dir>/<name>`; works offline from the hub cache."""
    name = full_name.rsplit("/", maxsplit=1)[-1]
    return _hf_download(full_name, repo_type="model", local_dir=models_dir(env) / name,
                        revision=revision)
