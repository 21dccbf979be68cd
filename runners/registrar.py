"""Just-in-time registrar of the ephemeral GPU runners (`runners/README.md`).

Run it on a control machine that the GPU host's jobs cannot reach, never on the GPU host:
it holds the one credential that can register runners (a fine-grained token with
"Administration: read and write" on this repository). For each runner slot it asks GitHub
for a one-use just-in-time configuration (`POST /repos/{repo}/actions/runners/
generate-jitconfig`), starts the `runner` service of `docker-compose.yml` on the GPU host
with that configuration and nothing else (`docker compose run`, DOCKER_HOST pointing at
the host), waits for the container to exit after its one job, removes the registration,
and starts the next. Slot N's runner runs as slot N's user of `runners/setup_slots.py`
(uid `--slot-uid-base` + N) with that slot's rootless engine socket and work folder: the
docker CLI gets the slot's number, uid and work directory, which docker-compose.yml reads.
The token never leaves this process: not in the container, not in the environment of the
docker CLI, not in a log line. Nor does any other long-lived secret of the caller's
environment: the docker CLI gets a short list of variables it needs (`child_env`), never
WANDB_API_KEY or a cloud key, so no job can read one.

Standard library only, so the control machine needs Python 3.10+ and the docker CLI.
Exit codes: 0 done (`--once`) or stopped by a signal, 1 GitHub or docker failed (`--once`),
2 bad input (one line, nothing started).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import stat
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

API_URL = "https://api.github.com"
API_VERSION = "2022-11-28"
SERVICE = "runner"  # the service of docker-compose.yml each runner container is made from
RUN_SH = "/home/runner/run.sh"  # the actions-runner image's entry point
BACKOFF_S = 30.0  # between failed attempts of one slot, so a bad token never hammers the API
SLOT_UID_BASE = 61000  # runners/setup_slots.py's --uid-base: slot N is uid BASE + N
# What the docker CLI may take from the caller's environment: where the GPU host's engine is
# and how to reach it, the locale, and the data directory docker-compose.yml reads. Anything
# else (a WANDB_API_KEY, cloud keys, tokens) stays here: compose could pass it into a runner.
CLI_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "SSH_AUTH_SOCK",
                     "DOCKER_HOST", "DOCKER_CONTEXT", "DOCKER_CONFIG", "DOCKER_CERT_PATH",
                     "DOCKER_TLS_VERIFY", "XDG_CONFIG_HOME", "XDG_RUNTIME_DIR", "SLIME_CI_DATA_DIR"})
HERE = Path(__file__).resolve().parent


class BadInput(Exception):
    """Wrong flags or an unsafe token file: one line, exit 2."""


class Failed(Exception):
    """GitHub or docker refused: one line (exit 1 with --once, a retry otherwise)."""


@dataclass(frozen=True, kw_only=True)
class Config:
    repo: str
    runners: int
    labels: tuple[str, ...]
    group: int
    work_dir: str
    uid_base: int
    compose_file: Path
    api_url: str
    prefix: str
    once: bool
    dry_run: bool
    reset: tuple[str, ...] = ()  # --reset-command's words, `{slot}` in them; () for none


@dataclass(frozen=True, kw_only=True)
class Registration:
    runner_id: int
    name: str
    jit_config: str


def read_token(path: Path) -> str:
    """The admin token from a file only its owner can read (never from the environment,
    where every child process would inherit it)."""
    try:
        # O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise BadInput(f"--token-file {path}: cannot open it ({exc.strerror})") from None
    try:  # the descriptor itself: a directory or a FIFO is refused before any read
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadInput(f"--token-file {path}: not a regular file")
        if st.st_mode & 0o077:
            raise BadInput(f"--token-file {path}: readable by others (mode {st.st_mode & 0o777:o}); "
                           f"chmod 600 {path}")
        if st.st_uid != os.geteuid():
            raise BadInput(f"--token-file {path}: owned by uid {st.st_uid}, not by you")
        try:
            token = os.read(fd, 4096).decode("utf-8").strip()
        except (OSError, UnicodeDecodeError):
            raise BadInput(f"--token-file {path}: not a UTF-8 text file holding the token") from None
    finally:
        os.close(fd)
    if not token or any(c.isspace() for c in token) or not token.isprintable():
        raise BadInput(f"--token-file {path}: holds no single token")
    return token


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port: urllib would carry the
    Authorization header (the admin token) to any host a redirect names."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if (old.scheme, old.netloc) != (new.scheme, new.netloc):
            return None  # not followed: the 3xx is GitHub's answer
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_SameOrigin)


def _github_message(raw: bytes, token: str) -> str:
    """GitHub's own one-line `message` of an error answer, never the raw body: a server (or a
    proxy) that echoes the request would put the Authorization header in the log."""
    try:
        message = json.loads(raw).get("message")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(message, str) or token in message or "Bearer" in message:
        return ""
    text = "".join(c for c in message if c.isprintable())[:200]
    return text


def _request(cfg: Config, token: str, method: str, path: str, body: object | None = None) -> object:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{cfg.api_url}{path}", data=data, method=method, headers={
        "Accept": "application/vnd.github+json", "Authorization": f"Bearer {token}",
        "X-GitHub-Api-Version": API_VERSION, "Content-Type": "application/json"})
    try:
        with _OPENER.open(req, timeout=30) as resp:  # https, or a test's loopback stand-in
            raw = resp.read(1 << 20)
    except urllib.error.HTTPError as exc:
        if method == "DELETE" and exc.code == 404:
            return None  # the runner unregistered itself after its job
        message = _github_message(exc.read(4096), token)
        raise Failed(f"GitHub answered {exc.code} to {method} {path}"
                     + (f": {message}" if message else "")) from None
    except (urllib.error.URLError, OSError) as exc:
        raise Failed(f"cannot reach {cfg.api_url} ({getattr(exc, 'reason', exc)})") from None
    try:
        return json.loads(raw) if raw else None
    except ValueError:  # also a body that is not UTF-8
        raise Failed(f"GitHub's answer to {method} {path} is not JSON") from None


def register(cfg: Config, token: str, slot: int) -> Registration:
    """One runner registered just in time: its id, name and one-use configuration."""
    name = f"{cfg.prefix}-{slot}-{uuid.uuid4().hex[:8]}"
    body = {"name": name, "runner_group_id": cfg.group, "labels": list(cfg.labels),
            "work_folder": f"{cfg.work_dir}/{slot}"}
    answer = _request(cfg, token, "POST", f"/repos/{cfg.repo}/actions/runners/generate-jitconfig", body)
    runner = answer.get("runner") if isinstance(answer, Mapping) else None
    jit = answer.get("encoded_jit_config") if isinstance(answer, Mapping) else None
    if not isinstance(runner, Mapping) or not isinstance(runner.get("id"), int) or not isinstance(jit, str):
        raise Failed("GitHub's generate-jitconfig answer has no runner id or encoded_jit_config")
    return Registration(runner_id=runner["id"], name=name, jit_config=jit)


def runner_argv(cfg: Config, slot: int, jit_config: str) -> list[str]:
    """The docker CLI call that starts one runner for one job (pure)."""
    return ["docker", "compose", "-f", str(cfg.compose_file), "run", "--rm", "--no-deps",
            "--name", f"{cfg.prefix}-{slot}", SERVICE, RUN_SH, "--jitconfig", jit_config]


def slot_env(cfg: Config, slot: int) -> dict[str, str]:
    """What docker-compose.yml needs to run slot N's runner as slot N (pure): its number, its
    user's uid (whose rootless engine socket and tmpfs it gets) and the work directory."""
    return {"SLIME_CI_SLOT": str(slot), "SLIME_CI_SLOT_UID": str(cfg.uid_base + slot),
            "SLIME_CI_WORK_DIR": cfg.work_dir}


def child_env(env: Mapping[str, str], token: str, slot: Mapping[str, str]) -> dict[str, str]:
    """The docker CLI's environment: CLI_ENV (and LC_*) of the caller's, never a value that
    holds the token, then the slot's variables."""
    kept = {k: v for k, v in env.items()
            if (k in CLI_ENV or k.startswith("LC_")) and token not in v}
    return {**kept, **slot}


def reset_argv(cfg: Config, slot: int) -> list[str]:
    """The --reset-command of one slot (pure)."""
    return [word.replace("{slot}", str(slot)) for word in cfg.reset]


def reset_slot(cfg: Config, token: str, slot: int) -> None:
    """Run the reset command of the slot; a failure is Failed, and nothing is registered."""
    try:
        done = subprocess.run(reset_argv(cfg, slot), env=child_env(os.environ, token, slot_env(cfg, slot)),
                              stdin=subprocess.DEVNULL, check=False, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Failed(f"slot {slot}: the reset command did not run ({exc}); no runner registered") from None
    if done.returncode != 0:
        raise Failed(f"slot {slot}: the reset command exited {done.returncode}; no runner registered")


def serve_slot(cfg: Config, token: str, slot: int, stop: threading.Event, errors: list[str]) -> None:
    """`_serve_slot`, and a slot that ends on anything unforeseen is an error (exit 1 with
    --once), never a thread that died while the registrar exits 0."""
    try:
        _serve_slot(cfg, token, slot, stop, errors)
    except Exception as exc:
        text = f"slot {slot}: stopped by an unexpected {type(exc).__name__}"
        print(f"registrar: {text}", file=sys.stderr, flush=True)
        errors.append(text)


def _serve_slot(cfg: Config, token: str, slot: int, stop: threading.Event, errors: list[str]) -> None:
    """Keep one runner slot filled: reset it (--reset-command), register, run one job,
    unregister; until stopped. No runner is registered on a slot whose reset failed."""
    dirty = bool(cfg.reset)  # also at start: the registrar may have stopped after a job
    while not stop.is_set():
        try:
            if dirty:
                reset_slot(cfg, token, slot)
                dirty = False
            reg = register(cfg, token, slot)
            dirty = bool(cfg.reset)
            print(f"registrar: slot {slot}: runner {reg.name} (id {reg.runner_id}) waiting for a job",
                  flush=True)
            try:
                done = subprocess.run(runner_argv(cfg, slot, reg.jit_config),
                                      env=child_env(os.environ, token, slot_env(cfg, slot)), check=False,
                                      stdin=subprocess.DEVNULL)
            except OSError as exc:
                raise Failed(f"cannot run the docker CLI ({exc.strerror})") from None
            finally:
                _request(cfg, token, "DELETE", f"/repos/{cfg.repo}/actions/runners/{reg.runner_id}")
            print(f"registrar: slot {slot}: runner {reg.name} exited ({done.returncode})", flush=True)
            if done.returncode != 0:
                raise Failed(f"slot {slot}: the runner container exited {done.returncode}")
        except Failed as exc:
            print(f"registrar: {exc}", file=sys.stderr, flush=True)
            errors.append(str(exc))
            if cfg.once:
                return
            stop.wait(BACKOFF_S)
            continue
        if cfg.once:
            return


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise BadInput(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python runners/registrar.py", description=(
        "Keep N ephemeral GPU runners registered just in time: each container gets a one-use "
        "configuration, takes one job and exits. Run on a control machine, never on the GPU host."))
    p.add_argument("--repo", required=True, help="OWNER/NAME of the repository the runners serve")
    p.add_argument("--token-file", type=Path, required=True,
                   help="file (mode 600) with a fine-grained token: Administration read and write")
    p.add_argument("--runners", type=int, default=4, help="runner slots (default 4, one per GPU is good)")
    p.add_argument("--labels", default="gpu", help="comma-separated labels besides self-hosted (default gpu)")
    p.add_argument("--runner-group-id", type=int, default=1,
                   help="runner group (default 1, the default group)")
    p.add_argument("--work-dir", default="/srv/slime-ci/work",
                   help="GPU host directory of the runners' work folders (mounted at the same path)")
    p.add_argument("--slot-uid-base", type=int, default=SLOT_UID_BASE,
                   help="slot N's runner runs as uid BASE+N, with that user's rootless engine "
                        f"(runners/setup_slots.py's --uid-base; default {SLOT_UID_BASE})")
    p.add_argument("--reset-command", default="",
                   help="run before each registration, {slot} replaced by the slot's number; no runner "
                        "is registered on a slot it failed for. E.g. 'ssh ci@gpu-host sudo python3 "
                        "/opt/slime-ci/runners/setup_slots.py reset --slot {slot}': what a job left in "
                        "its slot's engine, home and work folder is gone before the next job")
    p.add_argument("--compose-file", type=Path, default=HERE / "docker-compose.yml")
    p.add_argument("--api-url", default=API_URL, help=argparse.SUPPRESS)  # a test's loopback stand-in
    p.add_argument("--prefix", default="slime-ci-gpu", help="runner and container name prefix")
    p.add_argument("--once", action="store_true", help="one job per slot, then exit")
    p.add_argument("--dry-run", action="store_true",
                   help="print the docker call of each slot; register nothing")
    return p


def parse(argv: Sequence[str]) -> tuple[Config, Path]:
    p = _parser()
    args = p.parse_args(list(argv))
    owner, _, name = args.repo.partition("/")
    if not owner or not name or "/" in name:
        raise BadInput(f"--repo {args.repo!r}: give OWNER/NAME")
    if not 1 <= args.runners <= 64:
        raise BadInput(f"--runners {args.runners}: give 1 to 64")
    labels = tuple(x.strip() for x in args.labels.split(",") if x.strip())
    if not labels or "self-hosted" in labels:
        raise BadInput("--labels: name the labels besides self-hosted (GitHub adds that one)")
    if not args.work_dir.startswith("/"):
        raise BadInput(f"--work-dir {args.work_dir}: give an absolute path on the GPU host")
    if not 1000 <= args.slot_uid_base <= 2**31 - 100:
        raise BadInput(f"--slot-uid-base {args.slot_uid_base}: give 1000 or more, "
                       "as runners/setup_slots.py's --uid-base")
    try:
        reset = tuple(shlex.split(args.reset_command))
    except ValueError as exc:
        raise BadInput(f"--reset-command: {exc}") from None
    if reset and not any("{slot}" in word for word in reset):
        raise BadInput("--reset-command: name the slot with {slot}, so one slot's reset never stops "
                       "another slot's job")
    if not args.compose_file.is_file():
        raise BadInput(f"--compose-file {args.compose_file}: no such file")
    cfg = Config(repo=args.repo, runners=args.runners, labels=labels, group=args.runner_group_id,
                 work_dir=args.work_dir.rstrip("/"), uid_base=args.slot_uid_base,
                 compose_file=args.compose_file, api_url=args.api_url,
                 prefix=args.prefix, once=args.once, dry_run=args.dry_run, reset=reset)
    return cfg, args.token_file


def main(argv: Sequence[str]) -> int:
    try:
        cfg, token_file = parse(argv)
        if cfg.dry_run:
            for slot in range(1, cfg.runners + 1):
                env = " ".join(f"{k}={v}" for k, v in slot_env(cfg, slot).items())
                if cfg.reset:
                    print(shlex.join(reset_argv(cfg, slot)))
                print(env, shlex.join(runner_argv(cfg, slot, "<one-use JIT config>")))
            return 0
        token = read_token(token_file)
    except BadInput as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        # Stop registering; a container in the middle of a job finishes it.
        signal.signal(sig, lambda *_: stop.set())
    errors: list[str] = []
    threads = [threading.Thread(target=serve_slot, args=(cfg, token, slot, stop, errors), daemon=True)
               for slot in range(1, cfg.runners + 1)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads) and not stop.is_set():
        for t in threads:
            t.join(timeout=0.5)
    return 1 if errors and cfg.once else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
