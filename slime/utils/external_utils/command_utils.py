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
import dataclasses
import datetime
import functools
import inspect
import json
import os
import random
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

# Stdlib-only copies of the toolkit's process-group code, generated beside this file: U
# runs in images and checkouts where the toolkit is not installed.
from slime.utils.external_utils.proc_utils import finish, process_guard, signal_group
from slime.utils.external_utils.proc_utils import start as start_group
from slime.utils.external_utils.ray_head import (
    HeadRecord,
    RayHead,
    RayPorts,
    ports_from_env,
    private_head,
)

REPO_ROOT = Path(__file__).resolve().parents[3]
repo_base_dir = REPO_ROOT  # the name slime's own scripts use
NUM_GPUS_OF_HARDWARE = {"H100": 8, "H200": 8, "B200": 8, "GB200": 4, "GB300": 4}
GENERATION_HARDWARE = {"H100": "Hopper", "H200": "Hopper", "B200": "Blackwell",
                       "GB200": "Blackwell", "GB300": "Blackwell"}

# Words `_external_address` accepts for SLIME_SCRIPT_EXTERNAL_RAY besides an address.
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}
_warned_bool_values: set[tuple[str, str]] = set()


class CommandFailed(subprocess.CalledProcessError, RuntimeError):
    """A command exited non-zero (or timed out); says which, how, and how it ended.

    A `subprocess.CalledProcessError`, as the original helper raised, so scripts that
    catch that keep working; `returncode` is None when the command timed out.
    """

    def __init__(self, command: str, returncode: int | None, output_tail: str = "") -> None:
        super().__init__(returncode, command, output=output_tail)  # type: ignore[arg-type]
        self.command = command
        self.output_tail = output_tail

    def __str__(self) -> str:
        how = "timed out" if self.returncode is None else f"exited with {self.returncode}"
        tail = f"\n--- last output ---\n{self.output_tail}" if self.output_tail else ""
        return f"command {how}: {self.command}{tail}"


class TrainJobFailed(RuntimeError):
    """The training job ended in a state other than SUCCEEDED."""

    def __init__(self, job_id: str, status: str, logs_tail: str) -> None:
        self.job_id = job_id
        self.status = status
        self.logs_tail = logs_tail
        super().__init__(f"training job {job_id} ended {status}\n--- last log lines ---\n{logs_tail}")


_CRASH_MARKERS = ("Fatal Python error", "SIGSEGV", "Segmentation fault", "SIGABRT", "Aborted",
                  "terminate called", "Check failed", "SIGKILL", "killed", "SIGBUS", "out of memory")


def worker_crash_lines(temp_dir: Path, *, limit: int = 30) -> list[str]:
    """Lines of a head's worker and raylet logs that tell why a worker died (signals, fatal errors)."""
    found: list[str] = []
    for path in sorted(Path(temp_dir).glob("session_*/logs/*")):
        if path.parent.parent.name == "session_latest":  # a link to the session read already
            continue
        if not path.is_file() or not (path.suffix in (".err", ".out") or path.name.startswith("raylet")):
            continue
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if any(m in line for m in _CRASH_MARKERS):
                found.append(f"{path.name}: {line.strip()[:300]}")
                if len(found) >= limit:
                    return found
    return found


def _env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if env is None else env


def get_bool_env_var(name: str, default: str | bool = "false", *,
                     env: Mapping[str, str] | None = None) -> bool:
    """True only for "true" or "1" (any case), as in slime's scripts; `default` when unset.

    Any other non-empty value counts as false and is reported once on stderr, so a typo
    such as `SLIME_TEST_ENABLE_EVAL=yes` is visible instead of silently ignored.
    """
    raw = _env(env).get(name)
    if raw is None:
        if isinstance(default, bool):
            return default
        raw = default
    value = raw.strip().lower()
    if value in ("true", "1"):
        return True
    if value not in ("false", "0", "") and (name, value) not in _warned_bool_values:
        _warned_bool_values.add((name, value))
        print(f"warning: {name}={raw!r} is neither true/1 nor false/0; counted as false",
              file=sys.stderr, flush=True)
    return False


def get_env_enable_infinite_run(env: Mapping[str, str] | None = None) -> bool:
    """Whether SLIME_TEST_ENABLE_INFINITE_RUN asks to repeat the test until it fails."""
    return get_bool_env_var("SLIME_TEST_ENABLE_INFINITE_RUN", "false", env=env)


def create_run_id() -> str:
    """A run id as slime's scripts make them: UTC `yymmdd-HHMMSS-NNN` (NNN random)."""
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%y%m%d-%H%M%S")
    return f"{stamp}-{random.randrange(1000):03d}"


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


def check_has_nvlink() -> bool:
    """Whether this machine's GPUs are joined by NVLink (False without nvidia-smi)."""
    return _detect_nvlink()


def train_env_vars(*, env: Mapping[str, str], nvlink: bool, master_addr: str,
                   master_port: int | None, extra: Mapping[str, str] | None = None,
                   cuda_core_dump: bool = False) -> dict[str, str]:
    """The job's runtime env variables (pure): what the training processes must see."""
    python_path = [str(REPO_ROOT)]
    if env.get("PYTHONPATH"):
        python_path.append(env["PYTHONPATH"])
    # Where slime's framework image keeps Megatron-LM, which its jobs import.
    megatron = env.get("SLIME_CI_MEGATRON_DIR", "/root/Megatron-LM")
    if Path(megatron).is_dir() and megatron not in python_path:
        python_path.append(megatron)
    no_proxy = [x for x in env.get("no_proxy", "").split(",") if x]
    for host in ("127.0.0.1", "localhost", master_addr):
        if host not in no_proxy:
            no_proxy.append(host)
    out = {
        "PYTHONPATH": os.pathsep.join(python_path),
        "RAY_USE_UVLOOP": "0",  # as the original sets it for the job's Ray actors (slime #2050)
        "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        "NCCL_NVLS_ENABLE": "1" if nvlink else "0",
        "no_proxy": ",".join(no_proxy),
        "MASTER_ADDR": master_addr,
    }
    if master_port is not None:
        out["MASTER_PORT"] = str(master_port)
    # What the runner decided for this entry must reach the training ranks unchanged.
    # WANDB_API_KEY travels here rather than as a flag: a runtime env is not in any argv.
    for name in ("SLIME_CI_ENTRY", "SLIME_CI_OUTPUT_DIR", "SLIME_CI_DEVICE", "SLIME_CI_EMULATE_GPUS",
                 "SLIME_CI_GPUS", "CUDA_VISIBLE_DEVICES", "NUM_GPUS", "TMPDIR", "WANDB_API_KEY"):
        if name in env:
            out[name] = env[name]
    if cuda_core_dump or get_bool_env_var("SLIME_TEST_ENABLE_CUDA_COREDUMP", env=env):
        out.update({"CUDA_ENABLE_COREDUMP_ON_EXCEPTION": "1", "CUDA_COREDUMP_SHOW_PROGRESS": "1",
                    "CUDA_COREDUMP_FILE": str(output_dir(env) / "cuda_coredump_%h.%p.%t")})
    out.update(extra or {})
    return out


def model_args(megatron_model_type: str, *, root: Path | None = None,
               env: Mapping[str, str] | None = None) -> list[str]:
    """The flags that describe a model type to the trainer and the converter.

    In a repository with slime's `scripts/models/<type>.sh`, its `MODEL_ARGS` array, read
    by sourcing the file in bash (as slime's helpers do before `python3 train.py`);
    otherwise `--model-type <type>`, which names a preset of this repository's trainer.
    """
    root = REPO_ROOT if root is None else root
    script = root / "scripts" / "models" / f"{megatron_model_type}.sh"
    if not script.is_file():
        return ["--model-type", megatron_model_type]
    # NUL-separated so that arguments with spaces survive; the last piece is empty.
    done = subprocess.run(["bash", "-c", 'source "$0" && printf "%s\\0" "${MODEL_ARGS[@]}"', str(script)],
                          capture_output=True, text=True, env=dict(_env(env)), cwd=root,
                          timeout=60, check=False)
    if done.returncode != 0:
        raise CommandFailed(f"source {script}", done.returncode, _tail(done.stderr))
    return [arg for arg in done.stdout.split("\0") if arg]


def _repo_path(path: str | Path) -> Path:
    """A script path as slime's helpers take it: absolute, else relative to the working
    directory (where slime's scripts run them), else to this repository."""
    given = Path(path)
    if given.is_absolute():
        return given
    here = Path.cwd() / given
    return here if here.exists() else REPO_ROOT / given


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


@dataclass
class ExecuteTrainConfig:
    """Options of `execute_train`, as in slime's scripts (which may subclass it with their own fields).

    Not frozen: scripts extend it with plain `@dataclass` subclasses, which a frozen base forbids.
    `num_nodes` is for the script's own arguments (`--actor-num-nodes`); `extra_env_vars` is
    JSON or `NAME=value NAME=value` text, added to the job's environment.
    """

    cuda_core_dump: bool = False
    num_nodes: int = field(default_factory=lambda: int(os.environ.get("SLURM_JOB_NUM_NODES") or "1"))
    extra_env_vars: str = ""


def parse_extra_env_vars(text: str) -> dict[str, str]:
    """`{"A": "1"}` (JSON) or `A=1 B=two` (whitespace-separated) as a dict of strings."""
    text = text.strip()
    if not text:
        return {}
    if text.startswith("{"):
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise ValueError(f"extra_env_vars {text!r}: not valid JSON ({exc})") from None
        if not isinstance(loaded, dict):
            raise ValueError(f"extra_env_vars {text!r}: JSON must be an object of NAME: value")
        return {str(k): str(v) for k, v in loaded.items()}
    out = {}
    for item in text.split():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValueError(f"extra_env_vars item {item!r}: write NAME=value (or a JSON object)")
        out[name] = value
    return out


Hook = Callable[[], None] | Callable[[RayHead], None]


def _hook_caller(hook: Hook | None) -> Callable[[RayHead | None], None] | None:
    """Adapt a `before_ray_job_submit` hook: slime's take no argument, ours take the RayHead."""
    if hook is None:
        return None
    if not callable(hook):
        raise TypeError(f"before_ray_job_submit must be callable, got {type(hook).__name__}")
    try:
        sig = inspect.signature(hook)
    except (TypeError, ValueError):
        raise TypeError(f"before_ray_job_submit {hook!r}: its signature cannot be read; "
                        "pass a function taking no argument or one (the RayHead)") from None
    for args in ((object(),), ()):
        try:
            sig.bind(*args)
        except TypeError:
            continue
        if args:
            return lambda head: hook(head) if head is not None else None  # type: ignore[call-arg]
        return lambda head: hook()  # type: ignore[call-arg]
    raise TypeError(f"before_ray_job_submit{sig}: take no argument (slime's scripts) "
                    "or one (the RayHead)")


def _config_parts(
    config: ExecuteTrainConfig | Mapping[str, Any] | None,
) -> tuple[list[str], dict[str, str], bool]:
    """(extra train flags, extra env vars, core dump) from either kind of `config`."""
    if config is None:
        return [], {}, False
    if isinstance(config, ExecuteTrainConfig):
        return [], parse_extra_env_vars(config.extra_env_vars), bool(config.cuda_core_dump)
    if isinstance(config, Mapping):
        flags: list[str] = []
        for key, value in config.items():
            flag = "--" + key.replace("_", "-")
            if value is True:
                flags.append(flag)
            elif value not in (None, False):
                flags += [flag, str(value)]
        return flags, {}, False
    raise TypeError(f"config must be an ExecuteTrainConfig or a mapping of flags, "
                    f"got {type(config).__name__}")


def execute_train(
    train_args: str | Sequence[str],
    num_gpus_per_node: int,
    megatron_model_type: str | None = None,
    train_script: str = "train.py",
    before_ray_job_submit: Hook | None = None,
    extra_env_vars: Mapping[str, str] | None = None,
    config: ExecuteTrainConfig | Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    head_record: list[HeadRecord] | None = None,
) -> str:
    """Run `train_script` as a Ray job on a private head (or SLIME_SCRIPT_EXTERNAL_RAY); return the job id.

    `train_args` as a string is put on the job's shell command line as written (as the
    original does); a sequence is quoted word by word. `megatron_model_type` names the model:
    the script gets its `model_args` first. `before_ray_job_submit` runs once
    the head is up: with no argument (as slime's scripts write it) or with the RayHead.
    `config` is an `ExecuteTrainConfig` (core dumps, extra env vars) or a mapping whose
    items become `--key value` flags (True alone as `--key`). The head is stopped on every
    exit path; `head_record` (tests) receives the pids it ran.
    """
    env = _env(env)
    hook = _hook_caller(before_ray_job_submit)
    flags, config_env, core_dump = _config_parts(config)
    script = _repo_path(train_script)
    head = [sys.executable, str(script)]
    if megatron_model_type:
        head += model_args(megatron_model_type, env=env)
    if isinstance(train_args, str):
        # As the original: the string goes onto the job's shell command line as written, so
        # quoting and `$VAR` expansion mean what they meant there (Ray runs it with a shell).
        entrypoint = " ".join(filter(None, [shlex.join(head), train_args.strip(), shlex.join(flags)]))
    else:
        entrypoint = shlex.join([*head, *train_args, *flags])
    extra = {**(extra_env_vars or {}), **config_env}
    master_addr = env.get("MASTER_ADDR", "127.0.0.1")
    external = _external_address(env)
    if external is not None:
        env_vars = train_env_vars(env=env, nvlink=_detect_nvlink(), master_addr=master_addr,
                                  master_port=None, extra=extra, cuda_core_dump=core_dump)
        if hook is not None:
            hook(None)  # a zero-argument hook runs here too; there is no private head to pass
        return submit_and_wait(external, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)
    ports: RayPorts = ports_from_env(env)
    env_vars = train_env_vars(env=env, nvlink=_detect_nvlink(), master_addr=master_addr,
                              master_port=ports.master, extra=extra, cuda_core_dump=core_dump)
    with private_head(num_gpus=num_gpus_per_node, env=env, ports=ports, record=head_record) as head:
        if hook is not None:
            hook(head)
        try:
            return submit_and_wait(head.address, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)
        except TrainJobFailed as exc:
            evidence = worker_crash_lines(head.temp_dir)
            if evidence:
                # A worker that died (signal, fatal error) says why only in its own log.
                print("--- what the head's worker logs say about dying workers ---\n" + "\n".join(evidence),
                      flush=True)
            raise exc from None


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


MULTINODE_MASTER_PORT = 23456  # the port slime's conversion uses across nodes


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


_D = TypeVar("_D")


def dataclass_cli(func: Callable[[_D], Any], env_var_prefix: str = "SLIME_SCRIPT_") -> Callable[..., Any]:
    """Turn `func(config: SomeDataclass)` into a function of the dataclass's fields, as slime's scripts use.

    The wrapper's signature lists the fields (so a CLI library such as typer can build
    options from it); a field not passed is read from `<prefix><FIELD>` when set, converted
    to the field's type (bool: true/1), else takes its default.
    """
    params = list(inspect.signature(func).parameters.values())
    cls = params[0].annotation if params else None
    if isinstance(cls, str):
        cls = func.__globals__.get(cls)  # type: ignore[attr-defined]
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"dataclass_cli: the first parameter of {func.__name__} must be annotated "
                        "with a dataclass")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}

    @functools.wraps(func)
    def wrapped(**kwargs: Any) -> Any:
        unknown = set(kwargs) - set(fields)
        if unknown:
            raise TypeError(f"{func.__name__}: unknown option(s) {', '.join(sorted(unknown))}")
        for name, spec in fields.items():
            var = f"{env_var_prefix}{name.upper()}"
            if name not in kwargs and var in os.environ:
                kwargs[name] = _convert(os.environ[var], spec.type, name=var)
        data = cls(**kwargs)
        print(f"Execute command with args: {data}", flush=True)
        return func(data)

    init = inspect.signature(cls)
    wrapped.__signature__ = init  # type: ignore[attr-defined]
    return wrapped


def _convert(raw: str, kind: Any, *, name: str) -> Any:
    text = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if text.startswith("bool"):
        return get_bool_env_var(name, env={name: raw})
    if text.startswith("int"):
        return int(raw)
    if text.startswith("float"):
        return float(raw)
    return raw
