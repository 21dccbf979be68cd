"""`python -m ci changed`: the test files a branch adds, modifies or renames vs its base.

The original CI found them with a shell glob whose `*` crossed `/` (helpers ran as
8-GPU tests), that never saw `tests/utils/` or renamed files, and that read
`NUM_GPUS: int = 0` as "undeclared". Here the diff comes from git (merge base of
HEAD and the base, rename detection on), test files are picked by the registry's
own rule (`ci.select.discover.is_test_file`) and GPU counts are read by the AST reader.
`--affected` adds the tests that import a changed module, through the import graph.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal

from ci.args import Parser, existing_dir
from ci.errors import NothingRegistered, UsageError
from ci.registry.loader import REGISTRY_PATHS, Registry, load_registry
from ci.select.discover import MAX_SOURCE_BYTES, TestFile, discover, is_test_file, read_test_file
from ci.select.entries import ResolvedEntry, resolve
from ci.select.import_graph import affected_chains, describe_chain

if TYPE_CHECKING:
    import git

DEFAULT_BASE = "origin/main"
DEFAULT_GPUS = 8  # as the original: an undeclared file gets a whole machine
# Files whose change can alter the outcome of any test: packaging, sessions, the
# registry, pytest configuration. With --affected they select the whole CPU tier.
GLOBAL_FILES = frozenset({"pyproject.toml", "setup.py", "setup.cfg", "noxfile.py", *REGISTRY_PATHS})
GLOBAL_NAMES = frozenset({"conftest.py"})
EVERYTHING_SUITE = "cpu_unit"

Status = Literal["added", "modified", "renamed", "deleted"]


@dataclass(frozen=True, kw_only=True)
class Change:
    """One file of the diff; `path` is the new path (the old one for deletions)."""

    path: str
    status: Status
    old_path: str | None = None  # renames only


@dataclass(frozen=True, kw_only=True)
class ChangedSelection:
    """What `changed` selected, and against which commits."""

    base: str
    merge_base: str
    head: str
    entries: tuple[ResolvedEntry, ...]


def _stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


# --- the diff --------------------------------------------------------------------------

_STATUS: dict[str, Status] = {"A": "added", "C": "added", "M": "modified", "T": "modified",
                              "R": "renamed", "D": "deleted"}


def parse_name_status(raw: bytes) -> list[Change]:
    """Parse `git diff-tree -r -M --name-status -z` output (paths may hold any character)."""
    fields = raw.split(b"\0")
    if fields and fields[-1] == b"":
        fields.pop()
    changes: list[Change] = []
    i = 0
    while i < len(fields):
        letter = fields[i].decode("ascii")[:1]
        status = _STATUS.get(letter)
        two_paths = letter in ("R", "C")
        paths = [f.decode("utf-8", "surrogateescape") for f in fields[i + 1 : i + 2 + two_paths]]
        i += 2 + two_paths
        if status is None:  # "U" (unmerged) or an unknown letter: nothing to select
            continue
        if letter == "R":
            changes.append(Change(path=paths[1], status=status, old_path=paths[0]))
        else:
            changes.append(Change(path=paths[-1], status=status))
    return changes


def _git_error(exc: Exception) -> UsageError:
    # GitPython wraps git's stderr as "\n  stderr: '<text>'" (one quote each side: the text
    # may end in a quote of its own); git's last line says what failed.
    text = str(getattr(exc, "stderr", "") or exc).strip().removeprefix("stderr:").strip()
    text = text.removeprefix("'").removesuffix("'")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return UsageError(f"git failed: {lines[-1] if lines else type(exc).__name__}")


def _require_git() -> None:
    """GitPython importable, or one line that says which profile brings it (exit 2)."""
    try:
        import git  # lazy: GitPython costs ~0.1 s and `--help` must stay fast
    except ModuleNotFoundError as exc:
        if exc.name != "git":
            raise
        # The toolkit's own extra: right in any repository (it never installs a framework).
        raise UsageError("GitPython is not installed: pip install 'slime-ci[git]' "
                         "(or pip install GitPython)") from None
    except ImportError as exc:  # GitPython present, but no git executable on PATH
        # Its message is a page of advice on environment variables: its first line is the fact.
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UsageError(f"cannot use git ({first}); install git and "
                         f"`pip install GitPython`") from None
    del git


def _open_repo(root: Path) -> git.Repo:
    _require_git()
    import git

    try:
        return git.Repo(root)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise UsageError(f"{root} is not a git repository: run this in a clone of the "
                         f"project, or pass --root <clone>") from None


def _rev(repo: git.Repo, ref: str) -> str | None:
    import git

    try:
        out: str = repo.git.rev_parse("--verify", "--quiet", f"{ref}^{{commit}}")
    except git.GitCommandError as exc:
        if exc.status == 1:
            return None
        raise _git_error(exc) from None
    return out.strip() or None


def _is_shallow(repo: git.Repo) -> bool:
    return (Path(repo.git_dir) / "shallow").exists()


def _missing_base(repo: git.Repo, base: str) -> UsageError:
    remote, _, branch = base.partition("/")
    known_remotes = {r.name for r in repo.remotes}
    if branch and remote in known_remotes:
        fix = f"run git fetch {remote} {branch}"
    elif branch and remote == "origin":
        fix = (f"this clone has no remote 'origin': run git remote add origin <url> && "
               f"git fetch origin {branch}, or pass --base <ref>")
    else:
        fix = f"fetch it, or pass --base <ref> (default {DEFAULT_BASE})"
    if _is_shallow(repo):
        fix += "; this clone is shallow: in Actions, check out with fetch-depth: 0"
    return UsageError(f"base {base!r} does not exist here: {fix}")


def diff_vs_base(root: Path, base: str = DEFAULT_BASE) -> tuple[str, str, list[Change]]:
    """(merge base, HEAD, changes) of HEAD against the merge base of HEAD and `base`."""
    _require_git()
    import git

    if not base or base.startswith("-"):
        raise UsageError(f"--base {base!r}: expected a git ref such as {DEFAULT_BASE}")
    repo = _open_repo(root)
    try:
        head = _rev(repo, "HEAD")
        if head is None:
            raise UsageError(f"{root}: HEAD has no commit yet; commit something first")
        base_sha = _rev(repo, base)
        if base_sha is None:
            raise _missing_base(repo, base)
        bases = repo.merge_base(head, base_sha)
        if not bases:
            if _is_shallow(repo):
                raise UsageError(
                    f"no merge base of HEAD and {base} in this shallow clone: fetch with "
                    f"fetch-depth: 0 (actions/checkout), or run git fetch --unshallow")
            raise UsageError(f"HEAD and {base} share no history; pass --base <the branch "
                             f"this one grew from>")
        merge_base = bases[0].hexsha  # the one `git diff base...HEAD` uses
        raw = repo.git.diff_tree("-r", "-M", "--no-color", "--name-status", "-z",
                                 merge_base, head, stdout_as_string=False)
    except git.GitCommandError as exc:
        raise _git_error(exc) from None
    finally:
        repo.close()
    return merge_base, head, parse_name_status(raw)


# --- selection (pure) -------------------------------------------------------------------

def edited_tests(changes: Iterable[Change]) -> dict[str, str]:
    """Test files the diff adds, modifies or renames (new path) -> why; deletions dropped."""
    chosen: dict[str, str] = {}
    for change in changes:
        if change.status == "deleted" or not is_test_file(change.path):
            continue
        if change.status == "renamed" and change.old_path is not None:
            chosen[change.path] = f"renamed from {change.old_path}"
        else:
            chosen[change.path] = "added" if change.status == "added" else "edited"
    return chosen


def global_changes(changes: Iterable[Change]) -> list[str]:
    """Changed paths that affect every test (packaging, sessions, registry, conftest)."""
    found: set[str] = set()
    for change in changes:
        for path in (change.path, change.old_path):
            if path is not None and (path in GLOBAL_FILES
                                     or PurePosixPath(path).name in GLOBAL_NAMES):
                found.add(path)
    return sorted(found)


def touched_paths(changes: Iterable[Change]) -> set[str]:
    """Every path the diff touches, old and new: a deleted module still affects its importers."""
    paths: set[str] = set()
    for change in changes:
        paths.add(change.path)
        if change.old_path is not None:
            paths.add(change.old_path)
    return paths


def affected_test_chains(root: Path, changes: Sequence[Change]) -> dict[str, tuple[str, ...]]:
    """Test files that import a changed file, directly or not -> the shortest import chain
    `(test, via_1, …, changed)`: its length less one is the test's import distance."""
    touched = {p for p in touched_paths(changes) if p.endswith(".py")}
    if not touched:
        return {}
    gone = [c.path for c in changes if c.status == "deleted"]
    gone += [c.old_path for c in changes if c.old_path is not None]
    chains = affected_chains(root, touched, also_known=gone)
    return {node: chain for node, chain in sorted(chains.items())
            if is_test_file(node) and (root / node).is_file()}


def affected_tests(root: Path, changes: Sequence[Change]) -> dict[str, str]:
    """Test files that import a changed file of this repository, directly or not -> why."""
    return {node: describe_chain(chain) for node, chain in affected_test_chains(root, changes).items()}


# --- entries ----------------------------------------------------------------------------

def _read(root: Path, rel: str, head: str) -> TestFile:
    # The work tree is what runs; the committed blob is the fallback when it is missing
    # (deleted but not committed, a sparse checkout). It is judged as the work tree's file
    # would be, by the same reader: size cap, UTF-8 or "not UTF-8", never a lenient decode.
    if (root / rel).is_file():
        return read_test_file(root, rel)
    with tempfile.TemporaryDirectory(prefix="slime-ci-changed-") as scratch:
        copy = Path(scratch) / rel
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_bytes(_blob(root, head, rel, MAX_SOURCE_BYTES + 1))
        return read_test_file(Path(scratch), rel)


def _blob(root: Path, head: str, rel: str, size: int) -> bytes:
    """At most `size` bytes of `rel` as commit `head` has it."""
    repo = _open_repo(root)
    try:  # rel comes from the diff into `head`, so `head` has it: no KeyError to catch
        data: bytes = (repo.commit(head).tree / rel).data_stream.read(size)
    finally:
        repo.close()
    return data


def entry_for(tf: TestFile, *, why: str, timeout: float,
              warn: Callable[[str], None]) -> ResolvedEntry:
    """A planned entry for one selected file; an undeclared GPU count becomes 8, loudly."""
    gpus = tf.num_gpus
    if gpus is None:
        problem = tf.num_gpus_problem or "NUM_GPUS is not declared"
        warn(f"{tf.path}: {problem}; running it on {DEFAULT_GPUS} GPUs "
             f"(`python -m ci audit` stops such files from landing)")
        gpus = DEFAULT_GPUS
    return ResolvedEntry(id=tf.path, path=tf.path, timeout=timeout, num_gpus=gpus, kind=tf.kind,
                        why=why)


def _everything(root: Path, reason: str, registry: Registry,
                warn: Callable[[str], None] = _stderr) -> list[ResolvedEntry]:
    suite = registry.get(EVERYTHING_SUITE)
    if suite is None:
        return []
    files = discover(root)
    # A branch that renames a registered file has not always updated the registry yet (the
    # plain diff handles the rename): the missing path is left out, loudly, not fatal.
    missing = [e.path for e in suite.entries if e.path not in files]
    for path in missing:
        warn(f"{suite.name}: registered file {path} does not exist in this checkout (renamed or "
             "deleted on this branch?); left out; `python -m ci audit` reports it")
    if missing:
        suite = dataclasses.replace(suite, entries=tuple(e for e in suite.entries if e.path in files))
    try:
        planned = resolve(suite, files, registry=registry.name)
    except NothingRegistered:
        return []
    return [dataclasses.replace(e, why=reason) for e in planned]


def select_changed(root: Path, base: str = DEFAULT_BASE, *, affected: bool = False,
                 timeout: float = 3600.0,
                 warn: Callable[[str], None] = _stderr,
                 registry: Registry | None = None) -> ChangedSelection:
    """Diff HEAD against its merge base with `base` and plan the selected test files.

    `registry` is the checkout's (`load_registry(root)` when not given).
    """
    merge_base, head, changes = diff_vs_base(root, base)
    why = edited_tests(changes)
    chosen: dict[str, ResolvedEntry] = {}
    for rel in sorted(why):
        chosen[rel] = entry_for(_read(root, rel, head), why=why[rel], timeout=timeout, warn=warn)
    if affected:
        everything = global_changes(changes)
        if everything:
            reason = f"affects everything ({', '.join(everything)})"
            for entry in _everything(root, reason, registry or load_registry(root), warn):
                chosen.setdefault(entry.path, entry)
        for rel, reason in affected_tests(root, changes).items():
            if rel not in chosen:
                chosen[rel] = entry_for(_read(root, rel, head), why=reason, timeout=timeout,
                                        warn=warn)
    entries = tuple(chosen[rel] for rel in sorted(chosen))
    return ChangedSelection(base=base, merge_base=merge_base, head=head, entries=entries)


def changed_entries(root: Path, base: str = DEFAULT_BASE, *, affected: bool = False,
                    timeout: float = 3600.0,
                    warn: Callable[[str], None] = _stderr,
                    registry: Registry | None = None) -> list[ResolvedEntry]:
    """The entries `nox -s changed` runs: changed test files (and, with affected, importers)."""
    return list(select_changed(root, base, affected=affected, timeout=timeout, warn=warn,
                             registry=registry).entries)


# --- command line -----------------------------------------------------------------------

def to_json(entries: Iterable[ResolvedEntry]) -> str:
    """The plan as a JSON list for a workflow matrix: path, num_gpus, kind, why."""
    rows = [{"path": e.path, "num_gpus": e.num_gpus, "kind": e.kind, "why": e.why}
            for e in entries]
    return json.dumps(rows)  # ASCII escapes: any file name survives any terminal


def format_table(plan: ChangedSelection) -> str:
    """A readable table: GPUs, kind, file, why."""
    against = f"vs {plan.base} (merge base {plan.merge_base[:10]})"
    if not plan.entries:
        return f"no test files selected {against}: nothing to run"
    width = max(len("file"), *(len(e.path) for e in plan.entries))
    noun = "test file" if len(plan.entries) == 1 else "test files"
    lines = [f"{len(plan.entries)} {noun} selected {against}:",
             f"GPUs  kind    {'file':<{width}}  why"]
    lines += [f"{e.num_gpus:>4}  {e.kind:<6}  {e.path:<{width}}  {e.why}" for e in plan.entries]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="python -m ci changed",
        description="List the test files this branch adds, modifies or renames compared with "
                    "its merge base with --base, each with its NUM_GPUS and why it was "
                    "selected. `nox -s changed` runs them.",
        epilog="exit codes: 0 ok (also when nothing is selected), 2 bad input "
               "(missing base, shallow clone, not a git repository)")
    parser.add_argument("--root", type=Path, default=Path.cwd(),
                        help="repository root (default: the current directory)")
    parser.add_argument("--base", default=DEFAULT_BASE,
                        help=f"ref the branch is compared with (default {DEFAULT_BASE})")
    parser.add_argument("--affected", action="store_true",
                        help="also select tests that import a changed module, directly or "
                             "through other modules; a change to pyproject.toml, noxfile.py, "
                             f"a conftest.py or the registry ({' or '.join(REGISTRY_PATHS)}) "
                             "selects the whole CPU tier")
    parser.add_argument("--json", action="store_true",
                        help="print the plan as JSON (a list of {path, num_gpus, kind, why}) "
                             "for a workflow matrix")
    return parser


def main(argv: list[str]) -> int:
    """Entry point of `python -m ci changed`."""
    args = _parser().parse_args(argv)
    root = existing_dir("--root", args.root)
    plan = select_changed(root, args.base, affected=args.affected, registry=load_registry(root))
    if args.json:
        print(to_json(plan.entries))
    else:
        print(format_table(plan))
    return 0
