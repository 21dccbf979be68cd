"""Install profiles: the extras of pyproject.toml, expanded, with torch split out.

The sessions install a profile's requirements, then the repository with
`--no-deps`, so a session never resolves anything the profile does not name.
Torch comes first and alone, so a hosted runner can point just that install at
the PyTorch CPU index (SLIME_CI_TORCH_INDEX) and keep PyPI for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PROJECT_NAME = "slime-ci"
TORCH_INDEX_ENV = "SLIME_CI_TORCH_INDEX"
_SELF = re.compile(rf"^{re.escape(PROJECT_NAME)}\[(?P<extras>[^\]]+)\]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def requirements(pyproject: Mapping[str, Any], profile: str) -> list[str]:
    """Every requirement of an extra, following `slime-ci[other]` references, in order, once."""
    extras: Mapping[str, list[str]] = pyproject["project"].get("optional-dependencies", {})
    if profile not in extras:
        raise KeyError(f"no install profile {profile!r} in pyproject.toml; known: {', '.join(extras)}")
    out: list[str] = []
    seen: set[str] = set()

    def walk(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for req in extras[name]:
            match = _SELF.match(req.replace(" ", ""))
            if match:
                for extra in match.group("extras").split(","):
                    walk(extra.strip())
            elif req not in out:
                out.append(req)

    walk(profile)
    return out


def split_torch(reqs: list[str]) -> tuple[list[str], list[str]]:
    """(torch requirements, the rest)."""
    def name(req: str) -> str:
        m = _NAME.match(req)
        return m.group(0).lower() if m else ""

    torch = [r for r in reqs if name(r) == "torch"]
    return torch, [r for r in reqs if name(r) != "torch"]


def torch_install_args(torch_reqs: list[str], env: Mapping[str, str]) -> list[str]:
    """pip arguments that install torch, from SLIME_CI_TORCH_INDEX when it is set."""
    if not torch_reqs:
        return []
    index = env.get(TORCH_INDEX_ENV, "").strip()
    return [*torch_reqs, *(["--index-url", index] if index else [])]
