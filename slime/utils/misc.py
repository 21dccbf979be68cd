"""Load user plugins named by a path: `pkg.mod:fn`, `pkg.mod:Class.method` or `pkg.mod.fn`."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

_ID = r"[A-Za-z_]\w*"
_PATH = re.compile(rf"{_ID}(?:\.{_ID})*(?::{_ID}(?:\.{_ID})*|\.{_ID})")


_MISSING = object()


class PluginLoadError(ImportError):
    """A plugin path that does not name a callable; the message says which part failed."""


def _split(path: str) -> list[tuple[str, list[str]]]:
    """Candidate (module, attribute chain) readings of a plugin path, most specific first."""
    if ":" in path:
        module, _, attrs = path.partition(":")
        return [(module, attrs.split("."))]
    parts = path.split(".")
    # `a.b.c.fn` may be module `a.b.c` + `fn`, or module `a.b` + `c.fn` (a class method).
    return [(".".join(parts[:i]), parts[i:]) for i in range(len(parts) - 1, 0, -1)]


def load_function(path: str) -> Callable[..., Any]:
    """The callable a plugin path names."""
    if not isinstance(path, str) or not _PATH.fullmatch(path.strip()):
        raise PluginLoadError(f"plugin path {path!r} must look like 'package.module:function'")
    path = path.strip()
    candidates = _split(path)
    first_error: str | None = None
    for module_name, attrs in candidates:
        try:
            obj: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            # Only "this module does not exist" means: try a shorter module path.
            # A missing import *inside* the user's module is their bug: report it.
            missing = exc.name or ""
            if module_name != missing and not module_name.startswith(missing + "."):
                raise PluginLoadError(
                    f"plugin {path!r}: importing {module_name} failed: {exc}"
                ) from exc
            first_error = first_error or f"no module named {module_name!r}"
            continue
        except Exception as exc:  # the plugin module itself raised while importing
            raise PluginLoadError(
                f"plugin {path!r}: importing {module_name} raised {type(exc).__name__}: {exc}"
            ) from exc
        for i, attr in enumerate(attrs):
            if not hasattr(obj, attr):
                owner = ".".join([module_name, *attrs[:i]])
                first_error = first_error or f"{owner} has no attribute {attr!r}"
                obj = _MISSING
                break
            obj = getattr(obj, attr)
        if obj is _MISSING:
            continue
        if not callable(obj):
            raise PluginLoadError(f"plugin {path!r} is a {type(obj).__name__}, not a callable")
        return obj  # type: ignore[no-any-return]
    raise PluginLoadError(f"cannot load plugin {path!r}: {first_error}")
