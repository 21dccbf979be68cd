"""Shell commands: run one in a process group of its own (`exec_command`, `CommandFailed`
when it fails), and read the MODEL_ARGS array a model script sets."""

from __future__ import annotations

import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from ._env import REPO_ROOT, _env

# Stdlib-only copies of the toolkit's process-group code, generated beside this file: U
# runs in images and checkouts where the toolkit is not installed.
from .proc_utils import finish, process_guard, signal_group
from .proc_utils import start as start_group


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
