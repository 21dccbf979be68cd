"""Whether a commit is on a branch, checked with git in a checkout, never taken from a name.

The trust of a run (the ingest job) and the range of a bisect started from the history both
rest on "this commit is on the default branch". GitHub's `head_branch` is a name, and a tag
can carry the same name as the branch (a pushed tag `main` reports `head_branch: main`), so
the answer comes from the commit graph: the commit must be an ancestor of the branch's own
ref, named in full (`refs/remotes/origin/<branch>`, else `refs/heads/<branch>`), so that
no tag of the same name can stand in for it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from ci.errors import UsageError

SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")  # a full SHA-1 or SHA-256 object name


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=120,
                              check=False)
    except FileNotFoundError:
        raise UsageError("git is not installed; whether a commit is on a branch needs it") from None
    except subprocess.TimeoutExpired:
        raise UsageError(f"git {args[0]} in {root} did not answer within 120 s") from None


def branch_ref(root: Path, branch: str) -> str:
    """The full ref of `branch` in the checkout at `root`: the remote's copy, else the local one.

    A UsageError when there is none, or when the checkout is shallow (an ancestor missing
    from a shallow clone would look like a commit off the branch).
    """
    if _git(root, "rev-parse", "--is-inside-work-tree").stdout.strip() != "true":
        raise UsageError(f"{root} is not a git checkout: whether a commit is on {branch} is read "
                         "from its history; pass --root")
    if _git(root, "rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        raise UsageError(f"{root} is a shallow clone: whether a commit is on {branch} needs its "
                         "whole history (actions/checkout with fetch-depth: 0)")
    for ref in (f"refs/remotes/origin/{branch}", f"refs/heads/{branch}"):
        if _git(root, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode == 0:
            return ref
    raise UsageError(f"{root} has no branch {branch!r} (neither refs/remotes/origin/{branch} nor "
                     f"refs/heads/{branch}); check out the default branch with fetch-depth: 0")


def on_branch(root: Path, sha: str, branch: str) -> bool:
    """Whether commit `sha` (a full object name) is `branch`'s tip or one of its ancestors."""
    ref = branch_ref(root, branch)
    if not SHA.fullmatch(sha):
        return False
    if _git(root, "cat-file", "-e", f"{sha}^{{commit}}").returncode != 0:
        return False  # not in a full clone of the branch: on no branch we fetched
    return _git(root, "merge-base", "--is-ancestor", sha, ref).returncode == 0
