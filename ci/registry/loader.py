"""The registry a command works on, loaded once from the checkout at `--root`.

Every command (`run`, `audit`, `changed`, `plan`, `workflows`) calls `load_registry(root)`
and passes the result on, so `--root` means the same thing everywhere: the checkout's
own registry when it has one (`.slime-ci/suites.py` where `adopt` wrote it, else
`ci/registry/repo_suites.py`), else this toolkit's. The toolkit's own file is the
imported `ci.registry.repo_suites`; another checkout's file is executed in a fresh module object.
Planning (`ci.select.entries`) only ever sees the resulting tuple of suites.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import ci.registry.repo_suites as suites_module
from ci.errors import UsageError
from ci.registry.model import Check, SelectionPolicy, ShardPolicy, Smoke, Suite
from ci.registry.repo_suites import SUITES
from ci.registry.workflow_style import Style, style_from

REGISTRY = "ci/registry/repo_suites.py"
# Where `slime-ci adopt` writes an adopting repository's registry: a hidden directory whose
# name is no importable package, so it can never shadow the toolkit's `ci` (as a `ci/`
# folder in their tree would) nor anything of theirs. Looked up before REGISTRY.
ADOPTED_REGISTRY = ".slime-ci/suites.py"
REGISTRY_PATHS = (ADOPTED_REGISTRY, REGISTRY)
_serial = itertools.count()  # a distinct module name per load (threads, repeated loads)


@dataclass(frozen=True, kw_only=True)
class Registry:
    """The suites of one checkout, in declaration order."""

    suites: tuple[Suite, ...]
    source: Path | None = None  # the file they were read from; None: the toolkit's own
    # The file as the checkout names it, for every message that says "fix it in <registry>":
    # an adopting repository's is .slime-ci/suites.py, never this toolkit's ci/registry/repo_suites.py.
    name: str = REGISTRY
    # Sessions that are not suites (SESSIONS: checks such as lint, the GPU smoke).
    sessions: tuple[Check | Smoke, ...] = ()
    # An adopting repository's extras: its workflow's look (ci.registry.workflow_style), its install profiles
    # (name -> requirements) and the host variables its sessions default to (cache mounts).
    workflow: Mapping[str, Any] = field(default_factory=dict)
    profiles: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    host_env: Mapping[str, str] = field(default_factory=dict)
    selection: SelectionPolicy = field(default_factory=SelectionPolicy)  # SELECTION, when set
    sharding: ShardPolicy = field(default_factory=ShardPolicy)  # SHARDING, when set

    @property
    def style(self) -> Style:
        """How this repository's workflow is rendered (its messages name this registry)."""
        return replace(style_from(self.workflow), registry=self.name, sharding=self.sharding,
                       all_entries_label=self.selection.all_entries_label)

    def __iter__(self) -> Iterator[Suite]:
        return iter(self.suites)

    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.suites)

    def get(self, name: str) -> Suite | None:
        return next((s for s in self.suites if s.name == name), None)

    def __getitem__(self, name: str) -> Suite:
        suite = self.get(name)
        if suite is None:
            raise UsageError(f"unknown suite {name!r}; known: {', '.join(self.names())}")
        return suite


def _execute(path: Path) -> types.ModuleType:
    name = f"_checkout_suites_{next(_serial)}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    # Dataclasses declared in the file look their module up in sys.modules while the
    # class statement runs; the entry is removed as soon as the file has executed.
    sys.modules[name] = module
    try:
        code = compile(path.read_bytes(), str(path), "exec")
        exec(code, module.__dict__)  # the checkout's own registry: data declared in Python
    except Exception as exc:
        raise UsageError(f"{path}: cannot load the registry: {exc}") from None
    finally:
        sys.modules.pop(name, None)
    return module


def read_suites(path: Path) -> tuple[Suite, ...] | None:
    """The `SUITES` a registry file declares; None when it declares none.

    A broken registry is a one-line error (exit 2), never a traceback.
    """
    registry = read_registry(path)
    return registry.suites if registry is not None else None


def read_registry(path: Path) -> Registry | None:
    """The registry a file declares (SUITES, and WORKFLOW / PROFILES / HOST_ENV when set)."""
    name = registry_name(path)
    if path.resolve() == Path(suites_module.__file__ or "").resolve():
        return Registry(suites=SUITES, source=path, name=name,  # the toolkit's own, already imported
                        sessions=suites_module.SESSIONS, sharding=suites_module.SHARDING,
                        selection=getattr(suites_module, "SELECTION", None) or SelectionPolicy())
    module = _execute(path)
    suites = getattr(module, "SUITES", None)
    if suites is None:
        return None
    profiles = getattr(module, "PROFILES", {}) or {}
    return Registry(suites=tuple(suites), source=path, name=name,
                    workflow=dict(getattr(module, "WORKFLOW", {}) or {}),
                    profiles={k: tuple(v) for k, v in profiles.items()},
                    host_env=dict(getattr(module, "HOST_ENV", {}) or {}),
                    sessions=tuple(getattr(module, "SESSIONS", ()) or ()),
                    selection=getattr(module, "SELECTION", None) or SelectionPolicy(),
                    sharding=getattr(module, "SHARDING", None) or ShardPolicy())


def registry_name(path: Path) -> str:
    """How messages name a registry file: its place in a checkout (.slime-ci/suites.py or
    ci/registry/repo_suites.py), else the path as given."""
    return next((rel for rel in REGISTRY_PATHS
                 if path.parts[-len(rel.split("/")):] == tuple(rel.split("/"))), str(path))


def registry_path(root: Path) -> Path | None:
    """The checkout's registry file: .slime-ci/suites.py (adopted), else ci/registry/repo_suites.py."""
    return next((root / rel for rel in REGISTRY_PATHS if (root / rel).is_file()), None)


def own_registry(root: Path) -> Registry | None:
    """The checkout's own registry; None when it has none (or no SUITES in it)."""
    path = registry_path(root)
    return read_registry(path) if path is not None else None


def load_registry(root: Path) -> Registry:
    """The registry that governs the checkout at root: its own, or the toolkit's."""
    return own_registry(root) or Registry(suites=SUITES, sessions=suites_module.SESSIONS)
