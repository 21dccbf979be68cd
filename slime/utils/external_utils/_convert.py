"""Checkpoint conversion: an HF checkpoint to the trainer's distributed format with torchrun
(across SLURM nodes when asked), and FP8 to BF16 with the repository's tool."""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._dirs import models_dir
from ._env import REPO_ROOT, _env, _repo_path
from ._shell import exec_command, model_args

MULTINODE_MASTER_PORT = 23456  # the port slime's conversion uses across nodes


def convert_checkpoint(
    model_name: str,
    megatron_model_type: str,
    num_gpus_per_node: int,
    multinode: bool = False,
    extra_args: str | Sequence[str] = "",
    dir_dst: str | Path | None = None,
    hf_checkpoint: str | Path | None = None,
    *,
    hf_dir: str | Path | None = None,
    save_dir: str | Path | None = None,
    script: str = "tools/convert_hf_to_torch_dist.py",
    env: Mapping[str, str] | None = None,
) -> Path:
    """Convert an HF checkpoint to the trainer's distributed format with torchrun; skip when done.

    The call shape is slime's: the source is `hf_checkpoint` (default `<models dir>/<name>`),
    the target `<dir_dst>/<name>_torch_dist`. `dir_dst` defaults to the parent of the models
    dir — `/root` in the Docker context, where slime's scripts expect `/root/<name>_torch_dist`.
    `hf_dir`/`save_dir` name source and target directly. `multinode` reads the node list
    from SLURM (SLURM_JOB_HOSTNAMES, one host a line; SLURM_NODEID). The target counts as done
    when it holds `latest_checkpointed_iteration.txt`, which the converter writes last, so a
    conversion cut short is redone rather than trusted.
    """
    env = _env(env)
    if hf_dir is not None and hf_checkpoint is not None and Path(hf_dir) != Path(hf_checkpoint):
        raise ValueError("convert_checkpoint: pass hf_checkpoint or hf_dir, not both")
    if save_dir is not None and dir_dst is not None:
        raise ValueError("convert_checkpoint: pass dir_dst (the parent) or save_dir (the target), not both")
    given = hf_checkpoint if hf_checkpoint is not None else hf_dir
    source = Path(given) if given is not None else models_dir(env) / model_name
    parent = Path(dir_dst) if dir_dst is not None else models_dir(env).parent
    target = Path(save_dir) if save_dir is not None else parent / f"{model_name}_torch_dist"
    if (target / "latest_checkpointed_iteration.txt").exists():
        print(f"checkpoint {target} exists; conversion skipped", flush=True)
        return target
    script_path = _repo_path(script)
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    extra = shlex.split(extra_args) if isinstance(extra_args, str) else list(extra_args)
    argv = [
        *launcher, "--nproc-per-node", str(num_gpus_per_node),
        *(_multinode_args(env) if multinode else []), str(script_path),
        *model_args(megatron_model_type, env=env),
        "--hf-checkpoint", str(source), "--save", str(target), *extra,
    ]
    run_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))}
    exec_command(argv, env=run_env)
    return target


def _multinode_args(env: Mapping[str, str]) -> list[str]:
    hosts = [h.strip() for h in env.get("SLURM_JOB_HOSTNAMES", "").splitlines() if h.strip()]
    node = env.get("SLURM_NODEID", "").strip()
    if not hosts or not node.isdigit():
        raise ValueError("convert_checkpoint(multinode=True) needs SLURM_JOB_HOSTNAMES (one host a "
                         "line: `scontrol show hostnames \"$SLURM_JOB_NODELIST\"`) and SLURM_NODEID")
    return ["--master-addr", hosts[0], "--master-port", str(MULTINODE_MASTER_PORT),
            "--nnodes", str(len(hosts)), "--node-rank", node]


def fp8_cast_bf16(path_src: str | Path, path_dst: str | Path, *, script: str = "tools/fp8_cast_bf16.py",
                  env: Mapping[str, str] | None = None) -> Path:
    """Cast an FP8 HF checkpoint to BF16 with the repository's tool; skipped when `path_dst` exists."""
    target = Path(path_dst)
    if target.exists():
        print(f"{target} exists; fp8_cast_bf16 skipped", flush=True)
        return target
    script_path = _repo_path(script)
    exec_command([sys.executable, str(script_path), "--input-fp8-hf-path", str(path_src),
                  "--output-bf16-hf-path", str(target)], env=env)
    return target
