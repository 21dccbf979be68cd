"""`slime-ci adopt REPO`: switch a repository shaped like slime's to this toolkit, in one command.

It reads the matrix of `.github/workflows/pr-test.yml.j2` (Jinja2's parser; nothing is
rendered) and the template's body for what its jobs did (CPU install list, Python version,
runner labels, cache mounts, secrets), then writes:

  .slime-ci/suites.py      the registry (never a `ci/` folder: it would shadow the toolkit)
  noxfile.py               sessions from that registry through the toolkit (ci.adopt.sessions)
  slime/utils/external_utils/   U: every file ci.registry.u_files.U_FILES lists
  .github/workflows/pr-test.yml, .github/actionlint.yaml   generated from the registry

and retires the template's generator (removed; the template keeps a banner). It ends with
a report: what it wrote, what it changed, what is left to do by hand. Re-running changes
nothing; a file it did not write is kept unless --force; bad input writes nothing (exit 2).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from ci.adopt.import_workflow import GENERATED_MARK, MatrixJob, build, read_matrix, read_template, suite_name
from ci.errors import EXIT_OK, UsageError
from ci.github.job_plan import CHECK_SESSION, Job, table
from ci.github.workflow import render
from ci.github.yaml_writer import MARKER
from ci.registry.loader import ADOPTED_REGISTRY, Registry, read_registry
from ci.registry.u_files import U_DIR, packaged
from ci.registry.workflow_style import NOX_VERSION

TEMPLATE = ".github/workflows/pr-test.yml.j2"
GENERATOR = ".github/workflows/generate_github_workflows.py"
ADOPT_MARK = "Written by `slime-ci adopt`"
RETIRED = "{# Retired by `slime-ci adopt`: .slime-ci/suites.py is the matrix now and " \
          "`python -m ci workflows` writes pr-test.yml; this template drives nothing. #}\n"
CHECK_JOB = "workflows-check"
# The wall time each adopted CPU suite's job aims for, set-up included: its shard count is
# computed from the committed durations (ci/select/shard_count.py), as this toolkit's own is.
CPU_TARGET_MINUTES = 7
CHANGED_LABEL = "run-ci-changed"
CHANGED_JOB = "e2e-test-changed"
# The template's docker mounts a session reproduces through these variables (ci.backends.docker_argv).
MOUNT_VARS = {"/root/models": "SLIME_CI_MODELS_DIR", "/root/datasets": "SLIME_CI_DATASETS_DIR"}


def _fail(message: str) -> NoReturn:
    raise UsageError(message)


@dataclass(frozen=True, kw_only=True)
class Body:
    """What the template's job bodies say, beyond the matrix."""

    title: str
    python: str
    cpu_install: tuple[str, ...]
    torch_index: str | None
    hosted_runner: str
    gpu_runner: str
    mounts: tuple[tuple[str, str], ...]  # host -> container, workspace excluded
    secrets: tuple[str, ...]
    commit_name: str | None  # the GITHUB_COMMIT_NAME expression


def read_body(text: str) -> Body:
    """The non-matrix facts of the template, read line by line (its YAML is not valid YAML
    until rendered, so no YAML parser can read it)."""
    def first(pattern: str, default: str | None = None) -> str | None:
        m = re.search(pattern, text, re.MULTILINE)
        return m.group(1).strip().strip("'\"") if m else default

    install: list[str] = []
    index = None
    for m in re.finditer(r"^\s*pip install (.+)$", text, re.MULTILINE):
        words = m.group(1).split()
        if "<<" in m.group(1) or "-e" in words or "--break-system-packages" in words:
            continue  # per-job extras (read from the matrix) and the repository's own install
        if "--index-url" in words:
            index = words[words.index("--index-url") + 1]
            words = [w for i, w in enumerate(words) if w != "--index-url" and
                     (i == 0 or words[i - 1] != "--index-url")]
        install += [w for w in words if not w.startswith("-") and w not in install]
    mounts = []
    for m in re.finditer(r"-v\s+\"?([^\s\"]+):([^\s\"]+)\"?", text):
        host, inside = m.group(1), m.group(2)
        if "GITHUB_WORKSPACE" not in host and (host, inside) not in mounts:
            mounts.append((host, inside))
    runners = re.findall(r"^\s*runs-on:\s*(\S+)\s*$", text, re.MULTILINE)
    return Body(
        title=first(r"^name:\s*(.+)$", "PR Test") or "PR Test",
        python=first(r"python-version:\s*(\S+)", "3.10") or "3.10",
        cpu_install=tuple(install), torch_index=index,
        hosted_runner=next((r for r in runners if not r.startswith("self-hosted")), "ubuntu-latest"),
        gpu_runner=next((r for r in runners if r.startswith("self-hosted")), "self-hosted"),
        mounts=tuple(mounts),
        secrets=tuple(dict.fromkeys(re.findall(r"\$\{\{\s*secrets\.(\w+)\s*\}\}", text))),
        commit_name=first(r"^\s*GITHUB_COMMIT_NAME:\s*(.+)$"),
    )


def toolkit_requirement() -> str:
    """The toolkit that runs `adopt`, as a pip requirement (its exact version)."""
    try:
        return f"slime-ci=={importlib.metadata.version('slime-ci')}"
    except importlib.metadata.PackageNotFoundError:
        return "slime-ci"  # run from a source tree that is not installed


def _profile_name(job: MatrixJob) -> str:
    if not job.cpu:
        return "e2e"
    return f"{suite_name(job.name)}" if job.extra_pip_deps else "cpu"


def registry_text(root: Path, template_text: str, body: Body,
                  spec: str) -> tuple[str, list[str], dict[str, str]]:
    """(the registry file, the import's findings, suite -> original job name)."""
    matrix = read_matrix(template_text, source=TEMPLATE)
    job_ids = {suite_name(j.name): j.name for j in matrix.jobs}
    profiles: dict[str, list[str]] = {"cpu": list(body.cpu_install), "e2e": list(body.cpu_install)}
    for job in matrix.jobs:
        if job.cpu and job.extra_pip_deps:
            profiles[_profile_name(job)] = [*body.cpu_install, *job.extra_pip_deps.split()]
    extra_suites = []
    if CHANGED_LABEL in template_text:
        # The template's hand-written changed job: the files a PR adds or modifies, each on
        # the NUM_GPUS it declares, in the framework image.
        job_ids["changed"] = CHANGED_JOB
        extra_suites.append(
            "    Suite(\n        name='changed',\n        tier='gpu',\n"
            f"        purpose={CHANGED_JOB + ' of ' + TEMPLATE + ': test files a PR adds or modifies'!r},\n"
            f"        profile='e2e',\n        label={CHANGED_LABEL!r},\n"
            "        image='slimerl/slime:latest',\n        dynamic=True,\n        timeout=3600.0,\n    ),")
    host_env = {}
    for host, inside in body.mounts:
        var = MOUNT_VARS.get(inside, "SLIME_CI_DATA_DIR")
        host_env[var] = host if inside in MOUNT_VARS else f"{host}:{inside}"
    suite_env = {"GITHUB_COMMIT_NAME": body.commit_name} if body.commit_name else {}
    workflow = {
        "title": body.title, "python": body.python, "hosted_runner": [body.hosted_runner],
        "gpu_runner": [body.gpu_runner], "job_ids": job_ids, "own_jobs": False, "check_job": CHECK_JOB,
        "install": f"python -m pip install nox=={NOX_VERSION} {shlex.quote(spec)}",
        "suite_env": suite_env,
        "gpu_env": {name: "${{ secrets." + name + " }}" for name in body.secrets},
        "source": f"{ADOPTED_REGISTRY} (slime-ci adopt)",
    }
    tail = [
        "# Install profiles of the sessions: the template's CPU install list, plus each job's",
        "# extra_pip_deps (torch from SLIME_CI_TORCH_INDEX when set: the CPU index in CI).",
        f"PROFILES: dict[str, tuple[str, ...]] = {_pretty({k: tuple(v) for k, v in profiles.items()})}",
        "",
        "# Host defaults of the sessions (the template's docker mounts); the environment wins.",
        f"HOST_ENV: dict[str, str] = {_pretty(host_env)}",
        "",
        "# How `python -m ci workflows` renders .github/workflows/pr-test.yml here (ci/registry/"
        "workflow_style.py).",
        f"WORKFLOW = {_pretty(workflow)}",
        "",
    ]
    imported = build(matrix, root, template=TEMPLATE, profile_of=_profile_name, tail=tail,
                     extra_suites=extra_suites, cpu_target=CPU_TARGET_MINUTES)
    text = imported.text.replace(GENERATED_MARK, f"{GENERATED_MARK}; {ADOPT_MARK}", 1).replace(
        "Edit the template and import again; or edit this file and stop importing.",
        "This file is the matrix now: edit it, then run `slime-ci workflows`. Re-running\n"
        "`slime-ci adopt` re-imports the retired template over it (it carries the mark above).", 1)
    return text, list(imported.findings), job_ids


def _pretty(value: object) -> str:
    import pprint

    return pprint.pformat(value, width=100, sort_dicts=False)


NOXFILE = '''"""Sessions of this repository, from .slime-ci/suites.py through the slime-ci toolkit.

{mark}; re-run it to update. `nox -l` lists the sessions.
"""

from ci.adopt.sessions import register

# The toolkit each session installs (pip requirement, local path or VCS URL).
TOOLKIT = {spec!r}

register(__file__, toolkit=TOOLKIT)
'''


@dataclass(frozen=True, kw_only=True)
class Adoption:
    """Everything adopt would do, decided before anything is written."""

    writes: dict[str, str]  # path -> text
    removes: tuple[str, ...]
    kept: tuple[str, ...]  # files it did not write and would not replace (no --force)
    findings: tuple[str, ...]
    report: tuple[str, ...]  # what changed in behaviour, and what to do by hand
    unsaved: tuple[str, ...] = ()  # files with uncommitted edits it would replace or remove


def decide(root: Path, spec: str, *, force: bool) -> Adoption:
    """What adopting the repository at root means (pure: reads, writes nothing)."""
    if not root.is_dir():
        _fail(f"{root} is not a directory: pass the root of the repository to adopt")
    if not (root / ".git").exists():
        _fail(f"{root} is not a git repository (no .git): pass the root of a clone")
    template = root / TEMPLATE
    if not template.is_file():
        _fail(f"{root} has no {TEMPLATE}: adopt imports that template's matrix")
    _check_inside(root, TEMPLATE)  # read, then rewritten with its banner: never through a link
    try:
        text = read_template(template)  # a regular file of bounded size
    except (OSError, UnicodeDecodeError) as exc:
        _fail(f"{template}: cannot read the template ({exc.__class__.__name__}: {exc})")
    if not (root / "tests").is_dir():
        _fail(f"{root} has no tests/ directory: is this the repository's root?")
    body = read_body(text)
    registry, findings, job_ids = registry_text(root, text, body, spec)
    files: dict[str, str] = {ADOPTED_REGISTRY: registry,
                             "noxfile.py": NOXFILE.format(mark=ADOPT_MARK, spec=spec)}
    files |= {f"{U_DIR}/{name}": content for name, content in packaged().items()}
    # The workflow, from the registry just built (as `python -m ci workflows` will).
    reg = _registry_of(root, registry)
    jobs = table(reg.suites, reg.style, root=root)
    files |= render(jobs, reg.style)
    if not text.startswith(RETIRED):
        files[TEMPLATE] = RETIRED + text
    for rel in [*files, ".gitignore", GENERATOR]:
        _check_inside(root, rel)
    edited = uncommitted(root, [*files, GENERATOR])
    writes, kept, unsaved = {}, [], []
    for rel, content in files.items():
        path = root / rel
        current = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
        if current == content:
            continue
        ours = current is None or ADOPT_MARK in current or MARKER in current or rel.startswith(U_DIR) \
            or rel == TEMPLATE or _rendered_by_template(rel, current)
        if rel in edited and not force:
            unsaved.append(rel)  # even a file adopt owns: its edits would be lost
        elif ours or force:
            writes[rel] = content
        else:
            kept.append(rel)
    ignore = gitignore_with_cache(root / ".gitignore")
    if ignore is not None:  # theirs, but only a line is added: no --force needed
        writes[".gitignore"] = ignore
    removes: tuple[str, ...] = ()
    if (root / GENERATOR).is_file():
        if GENERATOR in edited and not force:
            unsaved.append(GENERATOR)
        else:
            removes = (GENERATOR,)
    return Adoption(writes=writes, removes=removes, kept=tuple(kept), findings=tuple(findings),
                    report=tuple(_report(body, job_ids, reg, jobs)), unsaved=tuple(unsaved))


def _check_inside(root: Path, rel: str) -> None:
    """Refuse a path adopt writes, replaces or removes when any part of it under root is a
    symbolic link: through one, a write lands outside the repository."""
    here = root
    for part in Path(rel).parts:
        here = here / part
        if here.is_symlink():
            _fail(f"{here.relative_to(root)} is a symbolic link, and adopt writes {rel} only inside "
                  f"the repository: make it a real {'file' if here == root / rel else 'directory'}, "
                  "then rerun")


def uncommitted(root: Path, rels: Sequence[str]) -> frozenset[str]:
    """Those of `rels` git tracks and that differ from the last commit (edits not committed)."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(root), "status", "--porcelain=v1", "-z",
                               "--untracked-files=no", "--", *rels],
                              capture_output=True, check=False, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        _fail(f"git status in {root} failed ({exc.__class__.__name__}): adopt will not overwrite "
              "edits it cannot see")
    if done.returncode:
        why = done.stderr.decode(errors="replace").strip().splitlines()[:1] or ["no output"]
        _fail(f"git status in {root} failed ({why[0]}): adopt will not overwrite edits it cannot see")
    out = set()
    for record in done.stdout.decode(errors="surrogateescape").split("\0"):
        if len(record) > 3:
            out.add(record[3:])
    return frozenset(out)


CACHE_DIR = ".ci-cache/"
CACHE_IGNORE = ("# slime-ci: run history, durations, JUnit and logs of local runs (slime-ci adopt)\n"
                f"{CACHE_DIR}\n")


def gitignore_with_cache(path: Path) -> str | None:
    """The repository's .gitignore with the toolkit's cache folder added; None if it has it."""
    current = path.read_text(encoding="utf-8", errors="replace") if path.is_file() else ""
    names = {line.strip().strip("/") for line in current.splitlines()}
    if CACHE_DIR.strip("/") in names:
        return None
    return current + ("\n" if current and not current.endswith("\n") else "") + CACHE_IGNORE


def _rendered_by_template(rel: str, current: str) -> bool:
    # The old pr-test.yml: rendered from the template by its generator (its banner says so).
    return rel == ".github/workflows/pr-test.yml" and "generate_github_workflows.py" in current


def _registry_of(root: Path, text: str) -> Registry:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "suites.py"
        path.write_text(text, encoding="utf-8")
        reg = read_registry(path)
    if reg is None:  # pragma: no cover - the text always declares SUITES
        _fail("internal error: the generated registry declares no SUITES")
    return reg


def _report(body: Body, job_ids: dict[str, str], reg: Registry, jobs: Sequence[Job]) -> list[str]:
    lines = [f"workflow name kept: {body.title!r}; job names kept: {', '.join(job_ids.values())}",
             "required status checks: each GPU/CPU job is one job now (the template made one matrix "
             "job per entry, `<job> (<entry>)`); point required checks at the job names above",
             f"runs-on kept: {body.hosted_runner} (CPU), {body.gpu_runner} (GPU); Python kept: {body.python}",
             f"labels kept: {', '.join(sorted({s.label for s in reg.suites if s.label}))}",
             "infinite_run kept: the dispatch input sets SLIME_TEST_ENABLE_INFINITE_RUN in GPU jobs"]
    if body.secrets:
        lines.append(f"secrets kept: {', '.join(body.secrets)} (GPU jobs' environment)")
    if body.commit_name:
        lines.append("GITHUB_COMMIT_NAME kept: set in every suite job")
    if body.mounts:
        lines.append("cache mounts kept: " + ", ".join(f"{h}:{i}" for h, i in body.mounts)
                     + " (HOST_ENV of the registry; sessions default to them)")
    lines += [
        "trigger: a `labeled` event runs only the job of the label just added and never re-runs CPU "
        "jobs (the template restarted the whole run, cancelling GPU jobs, on any label)",
        "trigger (stricter, for security): GPU jobs never run for pull requests from forks on the "
        "self-hosted runners (the template ran them when a fork PR carried the label)",
        "docker flags kept: GPU entries run with container=\"framework\" (--privileged, host network "
        "and IPC, seccomp off); give an entry container=\"minimal\" where it needs none of them "
        "(docs/security.md of slime-ci)",
        "concurrency: one group per job and PR instead of one per workflow (see ci/github/workflow.py)",
        f"new: CPU suites aim for {CPU_TARGET_MINUTES} minutes a job (target_minutes): "
        + ", ".join(f"{j.session} {j.shards} shard(s)" for j in jobs if j.shards_why)
        + "; commit tests/durations.json (a run's .ci-cache/durations.json) and run `slime-ci "
        "workflows` to split them by what they measured",
        f"new job: {CHECK_JOB} (`nox -s {CHECK_SESSION}`: the workflow and U are current with the registry)",
        "new: every suite job records its run (`nox -s history -- record`, also after a failure) and "
        "an hourly `monitor` job reports entries failing 3 runs in a row on main; GPU jobs and the "
        "monitor read the shared store from the secret SLIME_CI_HISTORY_URL of the environment "
        "ci-history (without it GPU jobs keep a local SQLite file and the monitor skips in one line)",
        "to do by hand: create the label run-ci-changed (and every run-ci-* label above) if missing; "
        + (f"set the secret(s) {', '.join(body.secrets)}; " if body.secrets else "")
        + "commit the result; from now on edit .slime-ci/suites.py and run `slime-ci workflows`",
    ]
    return lines


def apply(root: Path, p: Adoption) -> None:
    """Write the plan: each file whole, through a temporary name (never half-written).

    The temporary file is new (O_EXCL, a random name): a file or link planted under a
    predictable name is never written through.
    """
    import os
    import tempfile

    umask = os.umask(0)
    os.umask(umask)
    for rel, content in p.writes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        # The file keeps its mode; a new one gets what a plain write would give it.
        mode = path.stat().st_mode & 0o777 if path.is_file() else 0o666 & ~umask
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".adopt-tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(content)
            os.chmod(tmp, mode)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    for rel in p.removes:
        (root / rel).unlink()


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `slime-ci adopt --help`)")


def main(argv: Sequence[str]) -> int:
    """`slime-ci adopt REPO [--toolkit-requirement SPEC] [--force] [--dry-run]`."""
    p = _Parser(prog="slime-ci adopt", description=(
        "Make a repository shaped like slime's run on this toolkit: import its pr-test.yml.j2 "
        "matrix into .slime-ci/suites.py, write a noxfile, U and the generated workflow, retire "
        "the template's generator, and report what changed and what to do by hand."))
    p.add_argument("repo", type=Path, help="root of the repository to adopt (a git clone)")
    p.add_argument("--toolkit-requirement", metavar="SPEC", default=None,
                   help="what each session installs as the toolkit: a pip requirement, a local "
                        f"path or a VCS URL (default: {toolkit_requirement()})")
    p.add_argument("--force", action="store_true", help="replace files adopt did not write")
    p.add_argument("--dry-run", action="store_true", help="print what would change; write nothing")
    args = p.parse_args(list(argv))
    root = args.repo.resolve()
    spec = args.toolkit_requirement or toolkit_requirement()
    result = decide(root, spec, force=args.force)
    for finding in result.findings:
        print(f"import: {finding}")
    verb = "would write" if args.dry_run else "wrote"
    if not args.dry_run:
        apply(root, result)
    for rel in result.writes:
        print(f"adopt: {verb} {rel}")
    for rel in result.removes:
        print(f"adopt: {'would remove' if args.dry_run else 'removed'} {rel} (the template's generator)")
    for rel in result.kept:
        print(f"adopt: kept {rel} (not written by adopt; --force replaces it)")
    for rel in result.unsaved:
        print(f"adopt: kept {rel} (it has uncommitted edits: commit or stash them and rerun; "
              "--force replaces it)")
    if not result.writes and not result.removes and not result.unsaved:
        print("adopt: everything is up to date")
    for line in result.report:
        print(f"report: {line}")
    return EXIT_OK
