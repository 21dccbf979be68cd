"""`python -m ci history pull`: main's trusted snapshot, from the artifact the ingest job publishes,
into the place `python -m ci why --last` reads (.ci-cache/history-trusted.sqlite).

It needs a token that may read the repository's Actions artifacts and nothing more (`actions:
read`; a fine-grained personal token, or `gh auth token`). Only an artifact of a run of the
repository's own default branch counts: any run, a pull request's included, may upload an
artifact of the same name, and a fork's run reports the fork's head branch, which may be called
`main` too, so the artifact's run must also be of this repository's own code
(`head_repository_id`). The zip is read in memory, bounded, and its one member must open as a
history store of a schema this toolkit knows before it replaces the snapshot there.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from ci.errors import EXIT_OK, StoreError, UsageError
from ci.github.rest_client import GitHub, GitHubError
from ci.github.why_last import SNAPSHOT_FILE
from ci.history.ingest import SNAPSHOT_ARTIFACT
from ci.history.store import open_store

EXIT_NO_SNAPSHOT = 4  # as a store that cannot be used: nothing was written
MAX_ZIP_BYTES = 256 << 20
MEMBER = "history.sqlite"  # what the ingest job uploads (HISTORY_FILE's name)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `python -m ci history pull --help`)")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ci history pull", allow_abbrev=False,
                description="Download main's trusted history snapshot (the ingest job's artifact "
                            f"{SNAPSHOT_ARTIFACT}) to {SNAPSHOT_FILE}, where `python -m ci why --last` "
                            "reads it. Needs GITHUB_TOKEN with read access to Actions artifacts.",
                epilog="Exit codes: 0 pulled (or --dry-run), 2 bad input (no token, no repository), "
                       "4 no snapshot to pull (GitHub unreachable, none published, a bad file); "
                       "nothing is written then.")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="repository root (default: .)")
    p.add_argument("--repo", metavar="OWNER/NAME", help="the repository (default: GITHUB_REPOSITORY)")
    p.add_argument("--branch", default="main",
                   help="the default branch whose snapshot counts (default: main)")
    p.add_argument("--dry-run", action="store_true",
                   help="say which artifact it would download; write nothing")
    return p


def _of_branch(item: Any, branch: str) -> bool:
    """An unexpired artifact of a run of this repository's own `branch`."""
    if not isinstance(item, dict) or item.get("expired") is not False or not isinstance(item.get("id"), int):
        return False
    run = item.get("workflow_run")
    if not isinstance(run, dict):
        return False
    ours = run.get("repository_id")
    own = isinstance(ours, int) and run.get("head_repository_id") == ours
    return own and run.get("head_branch") == branch


def newest(items: Sequence[Any], branch: str) -> dict[str, Any] | None:
    """The newest artifact that counts (by its creation time, then its id), or None."""
    good = [a for a in items if _of_branch(a, branch)]
    return max(good, key=lambda a: (str(a.get("created_at", "")), a["id"]), default=None)


def _member(data: bytes) -> bytes:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            names = [i for i in z.infolist() if not i.is_dir()]
            if len(names) != 1 or names[0].filename != MEMBER:
                raise ValueError(f"it holds {', '.join(i.filename[:60] for i in names[:3]) or 'nothing'}, "
                                 f"not the one file {MEMBER}")
            if names[0].file_size > MAX_ZIP_BYTES:
                raise ValueError(f"its {MEMBER} is larger than {MAX_ZIP_BYTES >> 20} MiB")
            with z.open(names[0]) as fh:
                out = fh.read(MAX_ZIP_BYTES + 1)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:  # a corrupt member is a BadZipFile or EOF
        raise ValueError(f"it is not a readable zip ({exc.__class__.__name__})") from None
    if len(out) > MAX_ZIP_BYTES:
        raise ValueError(f"its {MEMBER} is larger than {MAX_ZIP_BYTES >> 20} MiB")
    return out


def _install(data: bytes, target: Path) -> int:
    """Check the file opens as a store of a known schema, then put it in place; its run count."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    try:
        with open_store(f"sqlite:///{tmp}", create=False) as store:
            runs = store.counts()["runs"]
    except StoreError as exc:
        tmp.unlink(missing_ok=True)
        raise ValueError(str(exc)) from None
    tmp.replace(target)
    return runs


def pull(gh: GitHub, root: Path, *, branch: str, dry_run: bool, say: Any, fail: Any) -> bool:
    """Fetch and install the newest snapshot; False (said in one line) when there is none to pull."""
    try:
        listing = gh.call("GET", f"/actions/artifacts?name={SNAPSHOT_ARTIFACT}&per_page=100")
        items = listing.get("artifacts") if isinstance(listing, dict) else None
        found = newest(items if isinstance(items, list) else [], branch)
        if found is None:
            fail(f"history pull: no artifact {SNAPSHOT_ARTIFACT} of a run of {gh.repo}'s own {branch} "
                "(has the ingest job run since a push to it, within the artifacts' retention?); "
                "nothing pulled")
            return False
        run = found["workflow_run"]
        what = (f"artifact {found['id']} of run {run.get('id', '?')} at {str(run.get('head_sha', ''))[:10]}, "
                f"made {str(found.get('created_at', '?'))[:19]}")
        if dry_run:
            say(f"history pull: would download {what} to {SNAPSHOT_FILE}")
            return True
        data = gh.download(f"/actions/artifacts/{found['id']}/zip", limit=MAX_ZIP_BYTES)
    except GitHubError as exc:
        fail(f"history pull: nothing pulled ({exc})")
        return False
    try:
        runs = _install(_member(data), root / SNAPSHOT_FILE)
    except (ValueError, OSError) as exc:
        fail(f"history pull: {what} is no snapshot ({str(exc).splitlines()[0][:300]}); nothing pulled")
        return False
    say(f"history pull: {runs} trusted runs of {branch} ({what}) in {SNAPSHOT_FILE}; "
        "`python -m ci why --last` judges against them")
    return True


def main(argv: Sequence[str], env: Mapping[str, str] | None = None) -> int:
    args = build_parser().parse_args(list(argv))
    try:
        gh = GitHub.from_env(os.environ if env is None else env, args.repo)
    except UsageError as exc:
        raise UsageError(f"history pull: {str(exc).split(', or use')[0]}: a token that may read this "
                         "repository's Actions artifacts is enough (`GITHUB_TOKEN=$(gh auth token)`)") \
            from None
    started = time.monotonic()
    ok = pull(gh, args.root.resolve(), branch=args.branch, dry_run=args.dry_run,
              say=print, fail=lambda line: print(line, file=sys.stderr))
    if ok and not args.dry_run:
        print(f"history pull: done in {time.monotonic() - started:.1f} s")
    return EXIT_OK if ok else EXIT_NO_SNAPSHOT
