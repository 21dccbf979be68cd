"""The event a run of `python -m ci actions` answers: its payload, and the clone it runs in.

act runs host-mode jobs from a checkout, and a job's steps write into it; so every run works
in a fresh clone of the checkout under a temporary folder, never in the user's tree. For a
pull request the clone gets what GitHub makes: the head (the checkout's HEAD, or a commit on
the base touching exactly the paths given by --paths/--paths-from) and the merge commit of
that head into the base, which is what `github.sha` names and the `plan` job diffs.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ci.errors import UsageError

ActEvent = Literal["pull_request", "push", "workflow_dispatch", "schedule", "issue_comment", "workflow_run"]
REPO = "acme/slime"  # the repository the payloads name; a fork is FORK
FORK = "someone/slime"
BASE_BRANCH = "main"
PR_NUMBER = 7
HEAD_BRANCH = "feature"
COMMENT_ID = 4242


@dataclass(frozen=True, kw_only=True)
class EventSpec:
    """What the command line says about the event (the same flags as `python -m ci plan`)."""

    name: ActEvent
    labels: tuple[str, ...] = ()
    action: str | None = None
    added: str | None = None
    fork: bool = False
    paths: tuple[str, ...] | None = None  # None: the checkout's own diff against the base
    patch: Path | None = None  # the PR's change as a diff applied on the base (a planted break, say)
    cron: str | None = None
    comment: str | None = None
    actor: str = "octocat"
    association: str = "MEMBER"
    inputs: Mapping[str, str] = field(default_factory=dict)
    run_id: int = 1


@dataclass(frozen=True, kw_only=True)
class Shas:
    """The commits of the event, as made in the clone."""

    base: str
    head: str
    sha: str  # github.sha: the merge commit of a pull request, else the head


def _git(clone: Path, *args: str) -> str:
    done = subprocess.run(["git", "-C", str(clone), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"git {' '.join(args)} in the clone failed: {done.stderr.strip()[:200]}; "
                         "check the checkout's branches (a local `main` is the base)")
    return done.stdout.strip()


def make_clone(root: Path, dest: Path) -> Path:
    """A clone of the checkout's HEAD with every branch (uncommitted changes stay behind).

    `--shared` borrows the checkout's objects read-only: the clone writes only its own .git.
    """
    done = subprocess.run(["git", "clone", "-q", "--shared", str(root), str(dest)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"{root}: cannot clone it ({done.stderr.strip()[:200]}); run from a git checkout")
    # The checkout stand-in fetches commits by sha, as actions/checkout does from GitHub.
    _git(dest, "config", "uploadpack.allowAnySHA1InWant", "true")
    _git(dest, "config", "user.email", "ci@example.invalid")
    _git(dest, "config", "user.name", "slime-ci actions")
    return dest


def _base(root: Path, clone: Path) -> str:
    """The PR's base: where HEAD left `main` (the checkout's origin/main, else its main).

    Read in the checkout, not the clone: a clone of a clone lists the checkout's own branches
    only, and a fresh clone on a feature branch has `main` as origin/main alone. The objects
    are shared, so the clone finds the commit.
    """
    for ref in (f"origin/{BASE_BRANCH}", BASE_BRANCH):
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--verify", "-q", ref + "^{commit}"],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return _git(clone, "merge-base", "HEAD", done.stdout.strip())
    raise UsageError(f"the checkout has no {BASE_BRANCH} branch to be the PR's base; "
                     "create it or pass --paths")


def touch_paths(clone: Path, base: str, paths: Sequence[str]) -> str:
    """A head commit on `base` that changes exactly `paths` (pure git; the clone only)."""
    _git(clone, "checkout", "-q", "--detach", base)
    for path in paths:
        target = clone / path
        if target.is_dir():
            raise UsageError(f"--paths: {path} is a folder; name files")
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("a", encoding="utf-8") as out:
            out.write("\n# changed by python -m ci actions --paths\n")
    _git(clone, "add", "-A", "--", *paths)
    _git(clone, "commit", "-q", "--allow-empty", "-m", "the pull request's change (from --paths)")
    return _git(clone, "rev-parse", "HEAD")


def apply_patch(clone: Path, base: str, patch: Path) -> str:
    """A head commit on `base` made of `patch` (`git apply`: text before its first diff, such
    as a plant's header lines, is skipped; the clone only)."""
    _git(clone, "checkout", "-q", "--detach", base)
    done = subprocess.run(["git", "-C", str(clone), "apply", "--index", str(patch.resolve())],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise UsageError(f"--patch {patch}: it does not apply on the base "
                         f"({done.stderr.strip()[:200]}); rebase the patch")
    _git(clone, "commit", "-q", "-m", f"the pull request's change (from --patch {patch.name})")
    return _git(clone, "rev-parse", "HEAD")


def prepare(root: Path, clone: Path, spec: EventSpec) -> Shas:
    """Make the event's commits in the clone and leave HEAD (and its branch) where act reads them."""
    head = _git(clone, "rev-parse", "HEAD")
    if spec.name == "pull_request":
        # The checkout's HEAD stands for `main`, as it does for every other event: the PR's
        # code is this checkout's (its workflow and its `python -m ci plan` agree, as they do
        # on GitHub, where both come from the merge commit), its diff exactly the patch or
        # the `paths`.
        if spec.patch is not None:
            base = head
            head = apply_patch(clone, base, spec.patch)
        elif spec.paths is not None:
            base = head
            head = touch_paths(clone, base, spec.paths)
        else:
            base = _base(root, clone)
        # A clone of a checkout on `main` has `main` checked out, and git moves no checked-out
        # branch: detach first (a fresh clone of main is exactly that case).
        _git(clone, "checkout", "-q", "--detach", head)
        _git(clone, "branch", "-f", HEAD_BRANCH, head)
        _git(clone, "branch", "-f", BASE_BRANCH, base)  # what a job's `ref: main` checks out
        _git(clone, "checkout", "-q", "--detach", base)
        _git(clone, "merge", "-q", "--no-ff", "--no-edit", "-m", f"Merge {head[:12]} into {base[:12]}", head)
        sha = _git(clone, "rev-parse", "HEAD")
        _git(clone, "update-ref", f"refs/pull/{PR_NUMBER}/merge", sha)
        return Shas(base=base, head=head, sha=sha)
    # Every other event runs on the default branch's tip: the checkout's HEAD stands for it.
    _git(clone, "checkout", "-q", "-B", BASE_BRANCH, head)
    return Shas(base=head, head=head, sha=head)


def changed_paths(clone: Path, shas: Shas) -> list[str]:
    """The files the event's head changes against its base, both sides of a rename."""
    out = _git(clone, "diff", "--no-renames", "--name-only", shas.base, shas.head)
    return sorted({x for x in out.splitlines() if x.strip()})


def _repository() -> dict[str, Any]:
    owner, name = REPO.split("/")
    return {"full_name": REPO, "name": name, "owner": {"login": owner}, "default_branch": BASE_BRANCH}


def pull_request(spec: EventSpec, shas: Shas) -> dict[str, Any]:
    """The PR object of a payload (and of GET /pulls/N in the REST stand-in)."""
    head_repo = FORK if spec.fork else REPO
    return {"number": PR_NUMBER, "state": "open", "labels": [{"name": x} for x in spec.labels],
            "head": {"sha": shas.head, "ref": HEAD_BRANCH, "repo": {"full_name": head_repo}},
            "base": {"sha": shas.base, "ref": BASE_BRANCH, "repo": {"full_name": REPO}},
            "user": {"login": spec.actor}}


def payload(spec: EventSpec, shas: Shas, finished: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The `github.event` of the run (pure); `finished` is the run a workflow_run follows."""
    repo = _repository()
    if spec.name == "pull_request":
        body: dict[str, Any] = {"action": spec.action or ("labeled" if spec.added else "synchronize"),
                                "number": PR_NUMBER, "pull_request": pull_request(spec, shas),
                                "repository": repo, "sender": {"login": spec.actor}}
        if spec.added:
            body["label"] = {"name": spec.added}
        return body
    if spec.name == "push":
        return {"ref": f"refs/heads/{BASE_BRANCH}", "before": shas.base, "after": shas.sha,
                "repository": repo, "sender": {"login": spec.actor}}
    if spec.name == "schedule":
        return {"schedule": spec.cron, "repository": repo}
    if spec.name == "workflow_dispatch":
        return {"ref": f"refs/heads/{BASE_BRANCH}", "inputs": dict(spec.inputs), "repository": repo,
                "sender": {"login": spec.actor}}
    if spec.name == "issue_comment":
        return {"action": "created", "repository": repo,
                "issue": {"number": PR_NUMBER, "pull_request": {"url": f"pulls/{PR_NUMBER}"}},
                "comment": {"id": COMMENT_ID, "body": spec.comment or "",
                            "user": {"login": spec.actor}, "author_association": spec.association}}
    run = dict(finished or {})
    return {"action": "completed", "workflow_run": run, "repository": repo}


def finished_run(name: str, event: str, run_id: int, conclusion: str, spec: EventSpec,
                 shas: Shas, *, file: str = "", title: str = "") -> dict[str, Any]:
    """The `workflow_run` object GitHub sends when run `run_id` of workflow `name` ends (pure):
    `file` names the workflow file (its `path`), `title` is the run's name (`display_title`)."""
    pr = event == "pull_request"
    return {"id": run_id, "name": name, "event": event, "status": "completed", "conclusion": conclusion,
            "path": f".github/workflows/{file}", "display_title": title or name,
            "head_sha": shas.head, "head_branch": HEAD_BRANCH if pr else BASE_BRANCH,
            "head_repository": {"full_name": FORK if spec.fork and pr else REPO},
            "repository": {"full_name": REPO},
            "pull_requests": [{"number": PR_NUMBER}] if pr and not spec.fork else [],
            "run_attempt": 1}


_INPUT = re.compile(r"\$\{\{\s*inputs\.([A-Za-z_][A-Za-z0-9_-]*)\s*\}\}")


def run_title(doc: Mapping[str, Any], spec: EventSpec) -> str:
    """A run's name as GitHub shows it: the workflow's `run-name` with its `inputs.X` filled in
    (the one kind of expression the generated run-names use), else the workflow's name (pure)."""
    text = doc.get("run-name")
    if not isinstance(text, str):
        return str(doc.get("name", ""))
    return _INPUT.sub(lambda m: str(spec.inputs.get(m.group(1), "")), text)


def write_payload(path: Path, body: Mapping[str, Any]) -> Path:
    path.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    return path
