"""Install profiles: the dependency groups and extras of pyproject.toml, expanded, with torch split out.

The sessions install a profile's requirements, then the repository with
`--no-deps`, so a session never resolves anything the profile does not name.
Torch comes first and alone, so a hosted runner can point just that install at
the PyTorch CPU index (SLIME_CI_TORCH_INDEX) and keep PyPI for the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from ci.errors import UsageError

PROJECT_NAME = "slime-ci"
TORCH_INDEX_ENV = "SLIME_CI_TORCH_INDEX"
_SELF = re.compile(rf"^{re.escape(PROJECT_NAME)}\[(?P<extras>[^\]]+)\]$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


def _table(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise UsageError(f"pyproject.toml: {where} must be a table, got {type(value).__name__}")
    return value


def _lists(table: Mapping[str, Any], where: str, *, includes: bool) -> Mapping[str, list[Any]]:
    """The table's profiles, each checked to be a list of requirement strings (a group's may
    also hold `{include-group = "name"}`): a string would be read letter by letter."""
    for name, reqs in table.items():
        if not isinstance(reqs, list):
            raise UsageError(f'pyproject.toml: {where}.{name} must be a list of requirements such as '
                             f'["numpy>=1.26"], got {type(reqs).__name__}')
        for req in reqs:
            if isinstance(req, str) and req.strip():
                continue
            if includes and isinstance(req, Mapping) and set(req) == {"include-group"} \
                    and isinstance(req["include-group"], str):
                continue
            raise UsageError(f"pyproject.toml: {where}.{name} holds {req!r}: each item must be a "
                             "requirement string" + (' or {include-group = "name"}' if includes else ""))
    return table


def _tables(pyproject: Mapping[str, Any]) -> tuple[Mapping[str, list[Any]], Mapping[str, list[Any]]]:
    """(dependency groups, extras): this repository's session profiles are groups, the
    toolkit's own needs are extras; a profile name is looked up in both. Each is checked:
    a malformed table is a UsageError naming the key."""
    groups = _lists(_table(pyproject.get("dependency-groups", {}), "[dependency-groups]"),
                    "dependency-groups", includes=True)
    project = _table(pyproject.get("project", {}), "[project]")
    extras = _lists(_table(project.get("optional-dependencies", {}), "[project.optional-dependencies]"),
                    "project.optional-dependencies", includes=False)
    return groups, extras


def names(pyproject: Mapping[str, Any]) -> list[str]:
    """Every profile a session can install: dependency groups, then extras."""
    groups, extras = _tables(pyproject)
    return [*groups, *(e for e in extras if e not in groups)]


def requirements(pyproject: Mapping[str, Any], profile: str) -> list[str]:
    """Every requirement of a profile, following `{include-group = …}` and `slime-ci[other]`
    references, in order, once."""
    groups, extras = _tables(pyproject)
    if profile not in groups and profile not in extras:
        raise KeyError(f"no install profile {profile!r} in pyproject.toml; known: "
                       f"{', '.join(names(pyproject))}")
    out: list[str] = []
    seen: set[str] = set()
    # `<this project>[extra]` refers to another profile (slime-ci here, any name elsewhere).
    own = pyproject.get("project", {}).get("name", PROJECT_NAME)
    self_ref = _SELF if own == PROJECT_NAME else re.compile(rf"^{re.escape(own)}\[(?P<extras>[^\]]+)\]$")

    def walk(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        for req in groups.get(name, extras.get(name, [])):
            if isinstance(req, Mapping):
                included = str(req.get("include-group", ""))
                # uv refuses a missing group when it installs; the check must not pass first.
                if included not in groups:
                    raise UsageError(f"pyproject.toml: dependency-groups.{name} includes the group "
                                     f"{included!r}, which does not exist; known groups: "
                                     f"{', '.join(groups)}")
                walk(included)
                continue
            match = self_ref.match(req.replace(" ", ""))
            if match:
                for extra in match.group("extras").split(","):
                    if extra.strip() not in groups and extra.strip() not in extras:
                        raise UsageError(f"pyproject.toml: {name} names {req!r}, but there is no "
                                         f"profile {extra.strip()!r}; known: {', '.join(names(pyproject))}")
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


def torch_install_args(torch_reqs: list[str], env: Mapping[str, str], *,
                       find_links: Sequence[str] = ()) -> list[str]:
    """Installer arguments that install torch, from SLIME_CI_TORCH_INDEX when it is set.

    `find_links` are the folders pip is configured to look in (`pip_find_links`), passed on
    to an installer that does not read pip's configuration (uv): a machine that provides
    the CPU build of the pin that way gives it to both installers.
    """
    if not torch_reqs:
        return []
    index = env.get(TORCH_INDEX_ENV, "").strip()
    links = [arg for link in find_links for arg in ("--find-links", link)]
    return [*torch_reqs, *(["--index-url", index] if index else []), *links]


def pip_find_links(config_list: str) -> list[str]:
    """The find-links of pip's configuration, from the output of `pip config list`.

    Every source pip reads counts (its configuration files, PIP_FIND_LINKS as `:env:`), in
    the order pip lists them; a value may hold several, separated by white space.
    """
    links: list[str] = []
    for line in config_list.splitlines():
        key, sep, value = line.partition("=")
        if not sep or key.strip().rpartition(".")[2] != "find-links":
            continue
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        links += [link for link in value.split() if link not in links]
    return links
