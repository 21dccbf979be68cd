"""`dataclass_cli`: a script's `main(config: SomeDataclass)` as a function of the dataclass's
fields, each also read from a `SLIME_SCRIPT_<FIELD>` variable."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import os
from collections.abc import Callable
from typing import Any, TypeVar

from ._env import get_bool_env_var

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
                kwargs[name] = _field_value(os.environ[var], spec.type, name=var)
        data = cls(**kwargs)
        print(f"Execute command with args: {data}", flush=True)
        return func(data)

    init = inspect.signature(cls)
    wrapped.__signature__ = init  # type: ignore[attr-defined]
    return wrapped


def _field_value(raw: str, kind: Any, *, name: str) -> Any:
    text = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
    if text.startswith("bool"):
        return get_bool_env_var(name, env={name: raw})
    if text.startswith("int"):
        return int(raw)
    if text.startswith("float"):
        return float(raw)
    return raw
