"""Command-line checks every `python -m ci` command shares: one-line parse errors, sane numbers.

Standard library only (`lock-gpus` imports it and must run with nothing but Python).
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NoReturn

from ci.errors import UsageError


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line and exit 2 (a UsageError), never a usage dump."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def seconds(flag: str, value: float, *, zero: bool = False, forever: bool = False,
            most: float | None = None) -> float:
    """A duration given on the command line: a number, > 0 (>= 0 with `zero`).

    NaN is always refused: every comparison with it is false, so it silently meant
    "never" for a timeout or a grace period. `inf` is accepted only where waiting
    forever is a meaning the flag documents (`forever`).
    """
    if math.isnan(value):
        raise UsageError(f"{flag} nan: give a number of seconds")
    if math.isinf(value) and not (forever and value > 0):
        raise UsageError(f"{flag} {value:g}: give a finite number of seconds")
    if value < 0 or (value == 0 and not zero):
        bound = "0 or more" if zero else "more than 0"
        raise UsageError(f"{flag} {value:g}: must be {bound} seconds")
    if most is not None and value > most and not math.isinf(value):
        raise UsageError(f"{flag} {value:g}: must be at most {most:g} seconds")
    return value


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables a command needs to start or find its code: handing it GPU ids in one of them
# breaks it in a way that looks like a bug of the command (PATH=0,1 -> exit 127).
_RESERVED_ENV = {"PATH", "HOME", "SHELL", "USER", "LOGNAME", "PWD", "TMPDIR", "LANG", "TERM",
                 "IFS", "ENV", "BASH_ENV"}
_RESERVED_ENV_PREFIXES = ("LD_", "PYTHON", "BASH_FUNC_", "DYLD_")


def env_name(flag: str, name: str) -> str:
    """A variable name to hand GPU ids in: an identifier, not one a process needs to run."""
    if not _ENV_NAME.fullmatch(name):
        raise UsageError(f"{flag} {name!r}: a variable name is letters, digits and _ "
                         "(not starting with a digit), e.g. CUDA_VISIBLE_DEVICES")
    if name in _RESERVED_ENV or name.startswith(_RESERVED_ENV_PREFIXES):
        raise UsageError(f"{flag} {name}: the command needs that variable to run; name the one "
                         "it reads its GPUs from, e.g. CUDA_VISIBLE_DEVICES")
    return name


def existing_dir(flag: str, path: Path) -> Path:
    """A directory given on the command line, resolved; one that does not exist is bad input."""
    try:
        resolved = path.resolve()
        if resolved.is_dir():
            return resolved
        what = "is not a directory" if resolved.exists() else "does not exist"
    except OSError as exc:  # a name too long, a loop of links: is_dir() raises those
        what = f"cannot be used ({exc.strerror})"
    raise UsageError(f"{flag} {one_line(str(path))}: {what}; pass the repository root")


def installed(name: str, env: Mapping[str, str]) -> str | None:
    """A tool a wheel installs (uv, act): beside this interpreter, else on PATH; None if neither."""
    here = Path(sys.executable).with_name(name)
    if here.is_file():
        return str(here)
    return shutil.which(name, path=env.get("PATH"))


def one_line(text: str) -> str:
    """`text` with line breaks and other control characters escaped: an error stays one line
    even when it quotes an argument that holds a newline."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == " " else repr(ch)[1:-1] for ch in text)
