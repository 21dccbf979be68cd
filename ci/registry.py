"""The registry a command works on, loaded once from the checkout at `--root`.

Every command (`run`, `audit`, `changed`, `plan`, `workflows`) calls `load_registry(root)`
and passes the result on, so `--root` means the same thing everywhere: the checkout's
own `ci/suites.py` when it has one, else this toolkit's. The toolkit's own file is the
imported `ci.suites`; another checkout's file is executed in a fresh module object.
Planning (`ci.plan`) only ever sees the resulting tuple of suites.
"""

from __future__ import annotations

import itertools
import sys
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ci import suites as suites_module
from ci.errors import UsageError
from ci.suites import SUITES, Suite

REGISTRY = "ci/suites.py"
_serial = itertools.count()  # a distinct module name per load (threads, repeated loads)


@dataclass(frozen=True, kw_only=True)
class Registry:
    """The suites of one checkout, in declaration order."""

    suites: tuple[Suite, ...]
    source: Path | None = None  # the file they were read from; None: the toolkit's own

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


def read_suites(path: Path) -> tuple[Suite, ...] | None:
    """The `SUITES` a registry file declares; None when it declares none.

    A broken registry is a one-line error (exit 2), never a traceback.
    """
    if path.resolve() == Path(suites_module.__file__ or "").resolve():
        return SUITES  # this toolkit's own registry, already imported
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
    suites = getattr(module, "SUITES", None)
    return tuple(suites) if suites is not None else None


def own_registry(root: Path) -> Registry | None:
    """The checkout's own registry; None when it has no `ci/suites.py` (or no SUITES in it)."""
    path = root / REGISTRY
    if not path.is_file():
        return None
    suites = read_suites(path)
    return Registry(suites=suites, source=path) if suites is not None else None


def load_registry(root: Path) -> Registry:
    """The registry that governs the checkout at root: its own, or the toolkit's."""
    return own_registry(root) or Registry(suites=SUITES)
