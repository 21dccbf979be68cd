"""The loopback GitHub REST stand-in for the verdict comment, check run and issue tests: the
one that `python -m ci actions` serves (ci/actions/github_api.py), on a free port of 127.0.0.1.

This machine has no GitHub; the stand-in keeps its state in memory, checks the token on every
call and records each request, so a test sees what the toolkit asked for. What the token writes
is signed, as on GitHub, by its bot user (`login`); a body over GitHub's 65,536 characters is
refused with HTTP 422, and so is a check run request past the Checks API's caps (50 annotations
a request, 65,535 characters a summary); an update's annotations are appended.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from ci.actions.github_api import (
    ANNOTATIONS_PER_REQUEST,
    BODY_LIMIT,
    BOT,
    SUMMARY_LIMIT,
    GitHubState,
    serve,
    serve_blobs,
)

TOKEN = "ghs_" + "V3rd1ct" * 5  # a fake job token
REPO = "acme/slime"
__all__ = ["ANNOTATIONS_PER_REQUEST", "BODY_LIMIT", "BOT", "REPO", "SUMMARY_LIMIT", "TOKEN", "env_for",
           "fake_github", "serve_blobs"]


@contextlib.contextmanager
def fake_github() -> Iterator[tuple[str, GitHubState]]:
    """The stand-in's base URL (as GITHUB_API_URL) and its state."""
    state = GitHubState(repo=REPO, token=TOKEN)
    with serve(state) as url:
        yield url, state


def env_for(url: str) -> dict[str, str]:
    """What a job's step has: the token, the repository, the API's address."""
    return {"GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": url}
