"""Weights & Biases for an e2e run: its run id and the `--use-wandb …` flags slime's scripts
put on the training command line."""

from __future__ import annotations

import datetime
import random
import shlex
from collections.abc import Mapping
from pathlib import Path

from ._env import _env


def create_run_id() -> str:
    """A run id as slime's scripts make them: UTC `yymmdd-HHMMSS-NNN` (NNN random)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%y%m%d-%H%M%S")
    return f"{stamp}-{random.randrange(1000):03d}"


def get_default_wandb_args(test_file: str, run_name_prefix: str | None = None,
                           run_id: str | None = None, *,
                           env: Mapping[str, str] | None = None) -> str:
    """`--use-wandb …` flags for an e2e run as one string ending in a space; "" without WANDB_API_KEY.

    A string, so slime's `f"{U.get_default_wandb_args(__file__)} …"` works as written. The
    project is `slime-<file stem>` (the parent directory's name in front of a stem shorter
    than 6 characters); the group is the run id, `_$GITHUB_COMMIT_NAME` appended and
    `<prefix>_` in front; `--wandb-key` carries WANDB_API_KEY, as in the original.
    """
    env = _env(env)
    if not env.get("WANDB_API_KEY"):
        print("wandb off: WANDB_API_KEY is not set", flush=True)
        return ""
    path = Path(test_file)
    name = path.stem if len(path.stem) >= 6 else f"{path.parent.name}_{path.stem}"
    group = run_id or create_run_id()
    if env.get("GITHUB_COMMIT_NAME") is not None:
        group += f"_{env['GITHUB_COMMIT_NAME']}"
    if run_name_prefix is not None:
        group = f"{run_name_prefix}_{group}"
    # The key on the command line, as the original passes it (quoted: no shell expansion).
    return (f"--use-wandb --wandb-project slime-{name} --wandb-group {shlex.quote(group)} "
            f"--wandb-key {shlex.quote(env['WANDB_API_KEY'])} --disable-wandb-random-suffix ")
