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
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ci.proc import finish, process_guard, signal_group
from ci.proc import start as start_group
from slime.utils.external_utils.ray_head import (
    HeadRecord,
    RayHead,
    RayPorts,
    ports_from_env,
    private_head,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
NUM_GPUS_OF_HARDWARE = {"H100": 8, "H200": 8, "B200": 8, "GB200": 4, "GB300": 4}

_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


class CommandFailed(RuntimeError):
    """A command exited non-zero (or timed out); says which, how, and how it ended."""

    def __init__(self, command: str, returncode: int | None, output_tail: str = "") -> None:
        self.command = command
        self.returncode = returncode
        self.output_tail = output_tail
        how = "timed out" if returncode is None else f"exited with {returncode}"
        tail = f"\n--- last output ---\n{output_tail}" if output_tail else ""
        super().__init__(f"command {how}: {command}{tail}")


class TrainJobFailed(RuntimeError):
    """The training job ended in a state other than SUCCEEDED."""

    def __init__(self, job_id: str, status: str, logs_tail: str) -> None:
        self.job_id = job_id
        self.status = status
        self.logs_tail = logs_tail
        super().__init__(f"training job {job_id} ended {status}\n--- last log lines ---\n{logs_tail}")


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def get_bool_env_var(name: str, default: bool = False, *, env: Mapping[str, str] | None = None) -> bool:
    """Read a yes/no variable; an unreadable value is an error rather than a silent default."""
    raw = _env(env).get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"{name}={raw!r}: use 1/0, true/false, yes/no or on/off")


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


def exec_command(cmd: str | Sequence[str], capture_output: bool = False, *,
                 env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                 timeout: float | None = None) -> str | None:
    """Echo and run `cmd` through bash in its own process group; raise `CommandFailed` on failure.

    A sequence is joined with shlex.join, so arguments are never re-split. Returns the
    combined output when `capture_output`, else None (the output goes to the terminal).
    """
    text = cmd if isinstance(cmd, str) else shlex.join(cmd)
    print(f"+ {text}", flush=True)
    pipe = subprocess.PIPE if capture_output else None
    # A group of its own (killed whole on timeout), guarded: if this process dies, so does it.
    guard = process_guard()
    proc = start_group(["bash", "-c", text], stdout=pipe,
                       stderr=subprocess.STDOUT if capture_output else None,
                       env=env, cwd=cwd, text=True, guard=guard)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGKILL)  # not reaped yet: the group id is still ours
        out, _ = proc.communicate()
        finish(proc, guard=guard)
        raise CommandFailed(text, None, _tail(out)) from None
    except BaseException:
        signal_group(proc.pid, signal.SIGKILL)
        finish(proc, guard=guard)
        raise
    code = finish(proc, guard=guard)
    if code != 0:
        raise CommandFailed(text, code, _tail(out))
    return out if capture_output else None


def _tail(text: str | None, lines: int = 40) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def nvlink_present(topology: str) -> bool:
    """Whether `nvidia-smi topo -m` output shows GPUs joined by NVLink (NV1, NV12, …)."""
    return re.search(r"\bNV\d+\b", topology) is not None


def _detect_nvlink() -> bool:
    try:
        result = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True,
                                timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and nvlink_present(result.stdout)


def train_env_vars(*, env: Mapping[str, str], nvlink: bool, master_addr: str,
                   master_port: int | None, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The job's runtime env variables (pure): what the training processes must see."""
    python_path = [str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    no_proxy = [x for x in env.get("no_proxy", "").split(",") if x]
    for host in ("127.0.0.1", "localhost", master_addr):
        if host not in no_proxy:
            no_proxy.append(host)
    out = {
        "PYTHONPATH": os.pathsep.join(python_path),
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NVLS_ENABLE": "1" if nvlink else "0",
        "no_proxy": ",".join(no_proxy),
        "MASTER_ADDR": master_addr,
    }
    if master_port is not None:
        out["MASTER_PORT"] = str(master_port)
    # What the runner decided for this entry must reach the training ranks unchanged.
    for name in ("SLIME_CI_ENTRY", "SLIME_CI_OUTPUT_DIR", "SLIME_CI_DEVICE", "SLIME_CI_EMULATE_GPUS",
                 "SLIME_CI_GPUS", "CUDA_VISIBLE_DEVICES", "NUM_GPUS", "TMPDIR"):
        if name in env:
            out[name] = env[name]
    if get_bool_env_var("SLIME_TEST_ENABLE_CUDA_COREDUMP", env=env):
        out.update({"CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1", "CUDA_COREDUMP_SHOW_PROGRESS": "1",
                    "CUDA_COREDUMP_FILE": str(output_dir(env) / "cuda_coredump_%h.%p.%t")})
    out.update(extra or {})
    return out


def _external_address(env: Mapping[str, str]) -> str | None:
    raw = env.get("SLIME_SCRIPT_EXTERNAL_RAY", "").strip()
    if not raw or raw.lower() in _FALSE:
        return None
    if raw.lower() in _TRUE:
        return "http://127.0.0.1:8265"
    return raw if "://" in raw else f"http://{raw}"


def submit_and_wait(address: str, *, entrypoint: str, env_vars: Mapping[str, str],
                    timeout: float | None = None, echo: Callable[[str], None] | None = None) -> str:
    """Submit `entrypoint` as a Ray job, stream its logs, return its id; raise unless it succeeds."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    echo = echo or (lambda chunk: print(chunk, end="", flush=True))
    client = JobSubmissionClient(address)
    job_id = client.submit_job(entrypoint=entrypoint, runtime_env={"env_vars": dict(env_vars)})
    print(f"submitted ray job {job_id} to {address}", flush=True)
    chunks: list[str] = []

    async def follow() -> None:
        async for chunk in client.tail_job_logs(job_id):
            chunks.append(chunk)
            echo(chunk)

    try:
        asyncio.run(asyncio.wait_for(follow(), timeout))
    except (asyncio.TimeoutError, TimeoutError):
        client.stop_job(job_id)
        raise TrainJobFailed(job_id, f"TIMED OUT after {timeout:.0f} s", _tail("".join(chunks))) from None
    # The log stream ends when the driver exits; the status may lag it by a moment.
    deadline = time.monotonic() + 60
    status = client.get_job_status(job_id)
    while not status.is_terminal() and time.monotonic() < deadline:
        time.sleep(0.5)
        status = client.get_job_status(job_id)
    if status != JobStatus.SUCCEEDED:
        logs = "".join(chunks) or client.get_job_logs(job_id)
        raise TrainJobFailed(job_id, str(status.value), _tail(logs))
    return job_id


def execute_train(
    train_args: str | Sequence[str],
    num_gpus_per_node: int,
    megatron_model_type: str | None = None,
    train_script: str = "train.py",
    before_ray_job_submit: Callable[[RayHead], None] | None = None,
    extra_env_vars: Mapping[str, str] | None = None,
    config: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    head_record: list[HeadRecord] | None = None,
) -> str:
    """Run `train_script` as a Ray job on a private head (or SLIME_SCRIPT_EXTERNAL_RAY); return the job id.

    `train_args` as a string is split with shlex. `megatron_model_type` names the model's
    argument preset: the script gets `--model-type <it>`. `config` items become
    `--key value` flags (True alone as `--key`). The head is stopped on every exit path;
    `head_record` (tests) receives the pids it ran.
    """
    env = _env(env)
    args = shlex.split(train_args) if isinstance(train_args, str) else list(train_args)
    if megatron_model_type:
        args = ["--model-type", megatron_model_type, *args]
    for key, value in (config or {}).items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (None, False):
            args += [flag, str(value)]
    script = Path(train_script)
    if not script.is_absolute():
        script = REPO_ROOT / script
    entrypoint = shlex.join([sys.executable, str(script), *args])
    master_addr = env.get("MASTER_ADDR", "127.0.0.1")
    external = _external_address(env)
    if external is not None:
        env_vars = train_env_vars(env=env, nvlink=_detect_nvlink(), master_addr=master_addr,
                                  master_port=None, extra=extra_env_vars)
        return submit_and_wait(external, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)
    ports: RayPorts = ports_from_env(env)
    env_vars = train_env_vars(env=env, nvlink=_detect_nvlink(), master_addr=master_addr,
                              master_port=ports.master, extra=extra_env_vars)
    with private_head(num_gpus=num_gpus_per_node, env=env, ports=ports, record=head_record) as head:
        if before_ray_job_submit is not None:
            before_ray_job_submit(head)
        return submit_and_wait(head.address, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)


def convert_checkpoint(
    model_name: str,
    megatron_model_type: str,
    num_gpus_per_node: int,
    *,
    hf_dir: str | Path | None = None,
    save_dir: str | Path | None = None,
    script: str = "tools/convert_hf_to_torch_dist.py",
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
) -> Path:
    """Convert an HF checkpoint to the trainer's distributed format with torchrun; skip when done.

    The target counts as done when it holds `latest_checkpointed_iteration.txt`, which the
    converter writes last, so a conversion cut short is redone rather than trusted.
    """
    env = _env(env)
    source = Path(hf_dir) if hf_dir else models_dir(env) / model_name
    target = Path(save_dir) if save_dir else models_dir(env) / f"{model_name}_torch_dist"
    if (target / "latest_checkpointed_iteration.txt").exists():
        print(f"checkpoint {target} exists; conversion skipped", flush=True)
        return target
    script_path = Path(script) if Path(script).is_absolute() else REPO_ROOT / script
    torchrun = Path(sys.executable).parent / "torchrun"
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    argv = [
        *launcher, "--nproc-per-node", str(num_gpus_per_node), str(script_path),
        "--model-type", megatron_model_type,
        "--hf-checkpoint", str(source), "--save", str(target), *extra_args,
    ]
    run_env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))}
    exec_command(argv, env=run_env)
    return target


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


def hf_download_dataset(full_name: str, *, revision: str | None = None,
                        env: Mapping[str, str] | None = None) -> Path:
    """Fetch data set `org/name` into `<datasets dir>/<name>`; works offline from the hub cache."""
    name = full_name.rsplit("/", maxsplit=1)[-1]
    return _hf_download(full_name, repo_type="dataset", local_dir=datasets_dir(env) / name,
                        revision=revision)


def hf_download_model(full_name: str, *, revision: str | None = None,
                      env: Mapping[str, str] | None = None) -> Path:
    """Fetch model `org/name` into `<models dir>/<name>`; works offline from the hub cache."""
    name = full_name.rsplit("/", maxsplit=1)[-1]
    return _hf_download(full_name, repo_type="model", local_dir=models_dir(env) / name,
                        revision=revision)


def get_default_wandb_args(test_file: str, run_name_prefix: str | None = None,
                           run_id: str | None = None, *,
                           env: Mapping[str, str] | None = None) -> list[str]:
    """`--use-wandb …` flags for an e2e run, or none when WANDB_API_KEY is unset.

    The key itself is left to the environment: a flag would show it in `ps` and in logs.
    """
    env = _env(env)
    if not env.get("WANDB_API_KEY"):
        return []
    stem = Path(test_file).stem
    stem = stem[len("test_"):] if stem.startswith("test_") else stem
    run = (run_id or env.get("GITHUB_COMMIT_NAME") or env.get("GITHUB_RUN_ID")
           or time.strftime("%Y%m%d-%H%M%S"))
    group = f"{run_name_prefix}-{run}" if run_name_prefix else run
    return ["--use-wandb", "--wandb-project", f"slime-{stem}", "--wandb-group", group]
