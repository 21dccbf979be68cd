"""The local stand-ins act runs instead of GitHub's actions and tools, written into a state folder.

This machine cannot fetch `actions/checkout` and friends, and the jobs call `gh` and
`pip install nox`. Each pinned action the generated workflows use is replaced, by its exact
pinned ref (`act --local-repository owner/repo@<sha>=<dir>`), with a composite action that calls
`stand_in.py`; `nox`, `gh` and `python` on the job's PATH are shims calling the same script.
A `uses:` that names an action no stand-in maps, or one that is not pinned to a full commit,
is an error naming it: the run would otherwise try GitHub and fail far from the cause.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.errors import UsageError
from ci.github.pages_workflow import DEPLOY_PAGES, UPLOAD_PAGES
from ci.github.yaml_writer import CACHE_RESTORE, CACHE_SAVE, CHECKOUT, SETUP_PYTHON, UPLOAD_ARTIFACT


@dataclass(frozen=True, kw_only=True)
class StandIn:
    """One pinned action and the stand-in verb (stand_in.py) that does its part here."""

    uses: str  # owner/repo[/subpath], as in `uses:`
    ref: str  # the full commit the workflows pin
    verb: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ()

    @property
    def repo(self) -> str:
        return "/".join(self.uses.split("/")[:2])

    @property
    def subpath(self) -> str:
        return "/".join(self.uses.split("/")[2:])


STAND_INS: tuple[StandIn, ...] = (
    StandIn(uses=CHECKOUT[0], ref=CHECKOUT[1], verb="checkout",
            inputs=("ref", "fetch-depth", "persist-credentials", "repository", "path")),
    StandIn(uses=SETUP_PYTHON[0], ref=SETUP_PYTHON[1], verb="setup-python", inputs=("python-version",)),
    StandIn(uses=CACHE_RESTORE[0], ref=CACHE_RESTORE[1], verb="cache-restore",
            inputs=("path", "key", "restore-keys"),
            outputs=("cache-hit", "cache-matched-key", "cache-primary-key")),
    StandIn(uses=CACHE_SAVE[0], ref=CACHE_SAVE[1], verb="cache-save", inputs=("path", "key")),
    StandIn(uses=UPLOAD_ARTIFACT[0], ref=UPLOAD_ARTIFACT[1], verb="upload-artifact",
            inputs=("name", "path", "if-no-files-found", "retention-days")),
    # The HUD's Pages jobs: the site as the `github-pages` artifact (a tar, as GitHub's is), and
    # a deployment that is recorded, never published.
    StandIn(uses=UPLOAD_PAGES[0], ref=UPLOAD_PAGES[1], verb="upload-pages-artifact",
            inputs=("name", "path", "retention-days")),
    StandIn(uses=DEPLOY_PAGES[0], ref=DEPLOY_PAGES[1], verb="deploy-pages",
            inputs=("token", "artifact_name", "timeout"), outputs=("page_url",)),
)
TOOLS = ("nox", "gh", "python", "python3")
_USES = re.compile(r"^([\w.-]+/[\w.-]+(?:/[\w./-]+)?)@([\w.-]+)$")
SCRIPT = "stand_in.py"


def action_yaml(stand_in: StandIn, python: str, script: Path) -> str:
    """The composite action.yml of one stand-in (pure): each input reaches the script as INPUT_*."""
    name = json.dumps(f"{stand_in.uses} (stand-in: {stand_in.verb}, by python -m ci actions)")
    lines = [f"name: {name}", 'description: "a local stand-in: this machine cannot reach GitHub"', "inputs:"]
    lines += [f"  {name}:\n    default: ''" for name in stand_in.inputs]
    if stand_in.outputs:
        lines.append("outputs:")
        lines += [f"  {name}:\n    value: ${{{{ steps.s.outputs.{name} }}}}" for name in stand_in.outputs]
    lines += ["runs:", "  using: composite", "  steps:", "    - id: s", "      shell: bash", "      env:"]
    lines += [f"        INPUT_{name.upper()}: ${{{{ inputs.{name} }}}}" for name in stand_in.inputs]
    lines.append(f"      run: {json.dumps(shlex.join([python, str(script), stand_in.verb]))}")
    return "\n".join(lines) + "\n"


def shim(tool: str, python: str, script: Path) -> str:
    """The shell script that stands for `tool` on the job's PATH (pure)."""
    verb = "python" if tool.startswith("python") else tool
    return f'#!/bin/sh\nexec "{python}" "{script}" {verb} "$@"\n'


def used_actions(workflows: Mapping[str, Mapping[str, object]]) -> list[tuple[str, str, str]]:
    """Every (workflow, uses, ref) of the workflows' steps, in order."""
    out: list[tuple[str, str, str]] = []
    for name, doc in workflows.items():
        jobs = doc.get("jobs")
        for job in (jobs.values() if isinstance(jobs, dict) else []):
            for step in job.get("steps", []) if isinstance(job, dict) else []:
                uses = step.get("uses") if isinstance(step, dict) else None
                if not isinstance(uses, str):
                    continue
                m = _USES.match(uses.strip())
                if m is None:
                    raise UsageError(f"{name}: `uses: {uses}` is not owner/repo@ref; pin it to a commit")
                out.append((name, m.group(1), m.group(2)))
    return out


def check_mapped(used: Iterable[tuple[str, str, str]], stand_ins: Sequence[StandIn] = STAND_INS) -> None:
    """Fail on the first action no stand-in maps by its exact pinned ref."""
    known = {(s.uses, s.ref) for s in stand_ins}
    for workflow, uses, ref in used:
        if (uses, ref) in known:
            continue
        if not re.fullmatch(r"[0-9a-f]{40}", ref):
            raise UsageError(f"{workflow}: `uses: {uses}@{ref}` is not pinned to a full commit; pin it")
        raise UsageError(f"{workflow}: no local stand-in for `uses: {uses}@{ref}`; add one to "
                         "ci/actions/stand_ins.py (STAND_INS) or use a mapped action")


def local_repository_args(folder: Path, stand_ins: Sequence[StandIn] = STAND_INS) -> list[str]:
    """act's --local-repository pairs: one per pinned repository and ref (pure)."""
    seen: dict[str, None] = {}
    for s in stand_ins:
        seen.setdefault(f"{s.repo}@{s.ref}={folder / s.repo / s.ref}")
    return [a for pair in seen for a in ("--local-repository", pair)]


def write(folder: Path, python: str, stand_ins: Sequence[StandIn] = STAND_INS) -> Path:
    """Write the stand-ins under `folder`: actions/, bin/ (the shims) and the script; bin's path."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / SCRIPT
    shutil.copyfile(Path(__file__).with_name(SCRIPT), script)
    for s in stand_ins:
        where = folder / s.repo / s.ref / s.subpath
        where.mkdir(parents=True, exist_ok=True)
        (where / "action.yml").write_text(action_yaml(s, python, script), encoding="utf-8")
    bin_dir = folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(shim(tool, python, script), encoding="utf-8")
        path.chmod(0o755)
    return bin_dir
