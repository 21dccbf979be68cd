"""A real PostgreSQL server for the history tests: `.ci/run`'s, or one started here on loopback.

`SLIME_CI_TEST_POSTGRES_URL` (set by `.ci/run` once it started a server) wins. Otherwise
Debian's server binaries start a private cluster in a temporary directory, on a free
loopback port, as an unprivileged user when the tests run as root (PostgreSQL refuses
root). Each caller gets its own fresh database. When no server can start, `skip_reason`
says why and the tests skip with it.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

URL_ENV = "SLIME_CI_TEST_POSTGRES_URL"
NOBODY = 65534


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_user(argv: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return argv
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root and setpriv is missing: cannot drop to another user")
    return [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *argv]


@contextmanager
def server() -> Iterator[str]:
    """A server URL (its `postgres` database); raises RuntimeError when none can start."""
    given = os.environ.get(URL_ENV, "").strip()
    if given:
        yield given
        return
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise RuntimeError("no PostgreSQL server binaries (apt-get install postgresql)")
    base = Path(tempfile.mkdtemp(prefix="slime-ci-pg-"))
    data, log = base / "data", base / "server.log"
    if os.geteuid() == 0:
        os.chown(base, NOBODY, NOBODY)
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    try:
        done = subprocess.run(_as_user([initdb, "-D", str(data), "-U", "postgres", "--auth=trust",
                                        "--no-sync", "-E", "UTF8"]),
                              capture_output=True, text=True, env=env, timeout=120, check=False)
        if done.returncode:
            raise RuntimeError(f"initdb failed: {(done.stderr or done.stdout).strip()[-300:]}")
        opts = f"-c listen_addresses=127.0.0.1 -c port={port} -k {base} -c fsync=off -c max_connections=60"
        started = subprocess.run(_as_user([pg_ctl, "-D", str(data), "-l", str(log), "-o", opts,
                                           "-w", "-t", "60", "start"]),
                                 capture_output=True, text=True, env=env, timeout=90, check=False)
        if started.returncode:
            tail = log.read_text(errors="replace")[-300:] if log.exists() else started.stderr
            raise RuntimeError(f"pg_ctl start failed: {tail.strip()}")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
        finally:
            subprocess.run(_as_user([pg_ctl, "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True, env=env, timeout=60, check=False)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def fresh_database(url: str) -> str:
    """A new, empty database on the server at `url`; its URL."""
    import psycopg

    name = f"slime_ci_{uuid.uuid4().hex[:12]}"
    plain = url.replace("postgresql+psycopg://", "postgresql://")
    for attempt in range(20):
        try:
            with psycopg.connect(plain, autocommit=True, connect_timeout=5) as conn:
                conn.execute(f'CREATE DATABASE "{name}"')
            break
        except psycopg.OperationalError:
            if attempt == 19:
                raise
            time.sleep(0.5)
    head, _, _db = plain.rpartition("/")
    return f"{head}/{name}"
