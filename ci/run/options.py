"""The run command's options, parsed and resolved: what every stage of the pipeline reads.

`ci.run.command.parse` makes them from argv; `ci.run.pipeline` takes them from there.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from ci.gpu.allocator import DEFAULT_TIMEOUT as DEFAULT_LOCK_TIMEOUT
from ci.registry.loader import Registry
from ci.registry.model import Suite


@dataclass(frozen=True, kw_only=True)
class RunArgs:
    """The command line of `python -m ci run`, validated, with its defaults resolved."""

    suite: str
    paths: tuple[str, ...] = ()
    keyword: str | None = None
    jobs: int | None = None
    dry_run: bool = False
    package: tuple[str, ...] = ()
    only: tuple[str, ...] = ()  # an entry is kept when it matches any of them
    shard: str | None = None
    timeout: float | None = None
    retries: int = 0
    gpus: int | None = None
    emulate_gpus: bool = False
    no_docker: bool = False
    image: str | None = None
    pull: str | None = None
    lock_path_pattern: str | None = None
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT  # --lock-timeout, else LOCK_TIMEOUT_ENV, else the default
    base: str = "origin/main"
    affected: bool = False
    junit: Path | None = None
    durations: Path | None = None
    history: str | None = None
    history_url: str | None = None  # --history resolved against the environment and the root; None: off
    include_quarantined: bool = False
    order: str = "auto"
    keep_outputs: bool = False
    no_prefork: bool = False
    ray_address: str | None = None  # --ray-address, else ADDRESS_ENV
    record_executed: bool = False  # --record-executed
    by_executed: str | None = None  # --by-executed BASE: only entries the branch's diff reaches
    root: Path = Path(".")

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace, **resolved: object) -> RunArgs:
        """The parsed namespace as typed fields; `resolved` overrides what parse() resolved."""
        values = {f: getattr(ns, f) for f in cls.__dataclass_fields__ if hasattr(ns, f)}
        values.update(paths=tuple(ns.paths), package=tuple(ns.package), only=tuple(ns.only))
        values.update(resolved)
        return cls(**values)


@dataclass(frozen=True, kw_only=True)
class Options:
    """Parsed and validated command line."""

    suite: Suite
    args: RunArgs
    pytest_args: tuple[str, ...]
    root: Path
    registry: Registry
