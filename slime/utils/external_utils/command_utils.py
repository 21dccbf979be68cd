"""Helpers the GPU end-to-end tests call, imported as `U`.

They run shell commands, train through a Ray job on a private head, convert checkpoints,
fetch models and data sets through huggingface_hub, and read the environment the CI runner
sets for each entry. Every variable is optional, so `python tests/e2e/test_x.py` works bare:

  SLIME_CI_OUTPUT_DIR   private directory for outputs and checkpoints
  SLIME_CI_PORT_BASE    first of 200 ports reserved for the entry (Ray, torch.distributed)
  SLIME_CI_DEVICE       "cuda" or "cpu" (default: cuda when torch sees one)
  SLIME_CI_EMULATE_GPUS "1" when the runner emulates GPUs on the CPU
  SLIME_CI_MODELS_DIR / SLIME_CI_DATASETS_DIR   caches (default /root/models, /root/datasets)
  SLIME_SCRIPT_EXTERNAL_RAY   address of a running cluster to submit to, used as is

This module is the one name scripts import (`from slime.utils.external_utils import
command_utils as U`); the code lives beside it, one private module per concern: _env (the
repository root, on/off flags), _hardware (GPU machines, NVLink), _dirs (device and
directories), _shell (commands), _train (the Ray job), _convert (checkpoints), _hub
(downloads), _wandb, _cli (dataclass_cli). Everything here is one of their objects, so
replacing `U.submit_and_wait` or `U.check_has_nvlink` (the cluster, the GPUs) reaches
`execute_train`, which looks both up here (this module registers itself with _train; no
private module imports it); any other helper is replaced in the module that defines it.
"""

from __future__ import annotations

import sys

from . import _train
from ._cli import dataclass_cli
from ._convert import (
    MULTINODE_MASTER_PORT,
    _multinode_args,  # noqa: F401 - private, reached through U (tests)
    convert_checkpoint,
    fp8_cast_bf16,
)
from ._dirs import datasets_dir, device, models_dir, output_dir, rsync_simple, save_to_temp_file
from ._env import REPO_ROOT, get_bool_env_var, get_env_enable_infinite_run, repo_base_dir
from ._hardware import GENERATION_HARDWARE, NUM_GPUS_OF_HARDWARE, check_has_nvlink, nvlink_present
from ._hub import hf_download_dataset, hf_download_model
from ._shell import CommandFailed, exec_command, model_args
from ._train import (
    ExecuteTrainConfig,
    Hook,
    TrainJobFailed,
    _config_parts,  # noqa: F401 - private, reached through U (tests)
    _external_address,  # noqa: F401 - private, reached through U (tests)
    _hook_caller,  # noqa: F401 - private, reached through U (tests)
    execute_train,
    parse_extra_env_vars,
    submit_and_wait,
    train_env_vars,
    worker_crash_lines,
)
from ._wandb import create_run_id, get_default_wandb_args

# The process-group helpers U's commands run under and the private Ray head its jobs run
# on, stdlib-only code beside this file (scripts have reached them through U).
from .proc_utils import finish, process_guard, signal_group
from .proc_utils import start as start_group
from .ray_head import HeadRecord, RayHead, RayPorts, ports_from_env, private_head

__all__ = [
    "GENERATION_HARDWARE",
    "MULTINODE_MASTER_PORT",
    "NUM_GPUS_OF_HARDWARE",
    "REPO_ROOT",
    "CommandFailed",
    "ExecuteTrainConfig",
    "HeadRecord",
    "Hook",
    "RayHead",
    "RayPorts",
    "TrainJobFailed",
    "check_has_nvlink",
    "convert_checkpoint",
    "create_run_id",
    "dataclass_cli",
    "datasets_dir",
    "device",
    "exec_command",
    "execute_train",
    "finish",
    "fp8_cast_bf16",
    "get_bool_env_var",
    "get_default_wandb_args",
    "get_env_enable_infinite_run",
    "hf_download_dataset",
    "hf_download_model",
    "model_args",
    "models_dir",
    "nvlink_present",
    "output_dir",
    "parse_extra_env_vars",
    "ports_from_env",
    "private_head",
    "process_guard",
    "repo_base_dir",
    "rsync_simple",
    "save_to_temp_file",
    "signal_group",
    "start_group",
    "submit_and_wait",
    "train_env_vars",
    "worker_crash_lines",
]

# execute_train looks the cluster and the GPU check up on U, where they are replaced.
_train._register_facade(sys.modules[__name__])
