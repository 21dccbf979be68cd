"""Training through a Ray job: `execute_train` on a private head (or an external cluster),
the job's environment, its options (`ExecuteTrainConfig`, extra env vars, the hook run
before submission), and `submit_and_wait`, which follows the job to its end."""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from ._dirs import output_dir
from ._env import REPO_ROOT, _env, _repo_path, get_bool_env_var
from ._hardware import check_has_nvlink
from ._shell import _tail, model_args
from .ray_head import HeadRecord, RayHead, RayPorts, ports_from_env, private_head

# Words `_external_address` accepts for SLIME_SCRIPT_EXTERNAL_RAY besides an address.
_TRUE = {"1", "true", "yes", "on", "y"}
_FALSE = {"0", "false", "no", "off", "n", ""}


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


# Where `execute_train` finds the cluster and the GPU check: the facade (U) registers its own
# namespace when it is imported, so that replacing `U.submit_and_wait` or `U.check_has_nvlink`
# (a test, a script) reaches it as it did when U was one module; the facade imports this
# module, never the reverse. Alone, this module's own.
_FACADE: list[ModuleType] = []


def _register_facade(facade: ModuleType) -> None:
    _FACADE[:] = [facade]


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
    # See _register_facade: U's names when U is loaded, else this module's.
    submit = _FACADE[0].submit_and_wait if _FACADE else submit_and_wait
    has_nvlink = _FACADE[0].check_has_nvlink if _FACADE else check_has_nvlink
    env = _env(env)
    hook = _hook_caller(before_ray_job_submit)
    flags, config_env, core_dump = _config_parts(config)
    script = _repo_path(train_script)
    command = [sys.executable, str(script)]
    if megatron_model_type:
        command += model_args(megatron_model_type, env=env)
    if isinstance(train_args, str):
        # As the original: the string goes onto the job's shell command line as written, so
        # quoting and `$VAR` expansion mean what they meant there (Ray runs it with a shell).
        entrypoint = " ".join(filter(None, [shlex.join(command), train_args.strip(), shlex.join(flags)]))
    else:
        entrypoint = shlex.join([*command, *train_args, *flags])
    extra = {**(extra_env_vars or {}), **config_env}
    master_addr = env.get("MASTER_ADDR", "127.0.0.1")
    external = _external_address(env)
    if external is not None:
        env_vars = train_env_vars(env=env, nvlink=has_nvlink(), master_addr=master_addr,
                                  master_port=None, extra=extra, cuda_core_dump=core_dump)
        if hook is not None:
            hook(None)  # a zero-argument hook runs here too; there is no private head to pass
        return submit(external, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)
    ports: RayPorts = ports_from_env(env)
    env_vars = train_env_vars(env=env, nvlink=has_nvlink(), master_addr=master_addr,
                              master_port=ports.master, extra=extra, cuda_core_dump=core_dump)
    with private_head(num_gpus=num_gpus_per_node, env=env, ports=ports, record=head_record) as head:
        if hook is not None:
            hook(head)
        try:
            return submit(head.address, entrypoint=entrypoint, env_vars=env_vars, timeout=timeout)
        except TrainJobFailed as exc:
            evidence = worker_crash_lines(head.temp_dir)
            if evidence:
                # A worker that died (signal, fatal error) says why only in its own log.
                print("--- what the head's worker logs say about dying workers ---\n" + "\n".join(evidence),
                      flush=True)
            raise exc from None
