"""A small client of GitHub's REST API: the PR comment, the issues of flaky and broken entries.

Standard library only. The token is the job's GITHUB_TOKEN, with the least permissions the
generated workflow grants the job (`pull-requests: write` for the verdict comment, `issues:
write` for the monitor's issues); it is never printed. `GITHUB_API_URL` points it elsewhere
(GitHub Enterprise, or a test's loopback stand-in).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from ci.errors import UsageError
from ci.github.teams import API_ENV, DEFAULT_API, same_origin_opener

TOKEN_ENV = "GITHUB_TOKEN"
REPO_ENV = "GITHUB_REPOSITORY"
_TIMEOUT_S = 20.0
_PAGES = 20  # at most 2000 items of one listing
MAX_NUMBER = 2**31 - 1  # an issue or pull request number (and the store's INTEGER column)
# The token goes to the API's own host only: a redirect elsewhere is not followed.
_OPENER = same_origin_opener()


class _Refuse(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *_args: Any, **_kw: Any) -> None:
        return None  # the 3xx is the answer: `download` follows it itself, without the token


_NO_REDIRECT = urllib.request.build_opener(_Refuse)


def _bounded(answer: Any, limit: int, path: str) -> bytes:
    data = answer.read(limit + 1)
    if len(data) > limit:
        raise GitHubError(f"the download of {path} is larger than {limit >> 20} MiB; not read")
    return bytes(data)


def pr_number(text: str) -> int:
    """An argparse type: a pull request (or issue) number, 1 .. 2**31-1."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a pull request number") from None
    if not 1 <= n <= MAX_NUMBER:
        raise argparse.ArgumentTypeError(f"{text[:40]} is no pull request number (1 .. {MAX_NUMBER})")
    return n


class GitHubError(Exception):
    """GitHub refused or could not be reached; the message is one line, `status` its HTTP status
    (None: no answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GitHub:
    """One repository's REST API, with a token."""

    def __init__(self, *, api: str, repo: str, token: str) -> None:
        self.api = api.rstrip("/")
        self.repo = repo
        self._token = token

    @classmethod
    def from_env(cls, env: Mapping[str, str], repo: str | None = None) -> GitHub:
        """From Actions' variables; a missing token or repository is a UsageError (exit 2)."""
        token = env.get(TOKEN_ENV, "").strip()
        name = (repo or env.get(REPO_ENV, "")).strip()
        if not token:
            raise UsageError(f"set {TOKEN_ENV} (the job's token) to talk to GitHub, or use --dry-run")
        if name.count("/") != 1:
            raise UsageError(f"name the repository as OWNER/NAME (--repo, or {REPO_ENV}); got {name!r}")
        return cls(api=env.get(API_ENV, "").strip() or DEFAULT_API, repo=name, token=token)

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        """One request under /repos/OWNER/NAME (or an absolute API path); the parsed answer."""
        url = path if path.startswith("http") else f"{self.api}/repos/{self.repo}{path}"
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(url, data=data, method=method, headers={
            "Authorization": f"Bearer {self._token}", "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "slime-ci",
            **({"Content-Type": "application/json"} if data is not None else {})})
        try:
            with _OPENER.open(request, timeout=_TIMEOUT_S) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            detail = ""
            with contextlib.suppress(ValueError, AttributeError, OSError, http.client.HTTPException):
                detail = str(json.loads(exc.read() or b"{}").get("message", ""))[:200]
            raise GitHubError(f"GitHub answered HTTP {exc.code} to {method} {urllib.parse.urlsplit(url).path}"
                              + (f": {' '.join(detail.split())}" if detail else ""), exc.code) from None
        except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
            raise GitHubError(f"GitHub's API at {self.api} could not be reached ({exc.__class__.__name__})") \
                from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            raise GitHubError(f"GitHub's answer to {method} {urllib.parse.urlsplit(url).path} is not JSON") \
                from None

    def download(self, path: str, *, limit: int) -> bytes:
        """The bytes GitHub serves at `path` (an artifact's zip), at most `limit` of them.

        GitHub answers such a request with a redirect to a signed address on another host: that
        one is fetched without the token (it needs none, and the token stays with the API)."""
        url = f"{self.api}/repos/{self.repo}{path}"
        request = urllib.request.Request(url, method="GET", headers={
            "Authorization": f"Bearer {self._token}", "Accept": "application/vnd.github+json",
            "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "slime-ci"})
        try:
            try:
                with _NO_REDIRECT.open(request, timeout=_TIMEOUT_S) as answer:
                    return _bounded(answer, limit, path)
            except urllib.error.HTTPError as exc:
                where = exc.headers.get("Location", "") if exc.code in (301, 302, 303, 307, 308) else ""
                if not where:
                    raise GitHubError(f"GitHub answered HTTP {exc.code} to GET {path}", exc.code) from None
                # One redirect, to https (or to the API's own scheme: never a downgrade from
                # https), fetched without the token; a further redirect is not followed.
                target, own = urllib.parse.urlsplit(where), urllib.parse.urlsplit(self.api).scheme
                if target.scheme not in ("https", own) or not target.netloc:
                    raise GitHubError(f"GitHub answered HTTP {exc.code} to GET {path} with a redirect to "
                                      f"{target.scheme or 'no'}:// that is not https; not followed",
                                      exc.code) from None
                blob = urllib.request.Request(where, headers={"User-Agent": "slime-ci"})
                with _NO_REDIRECT.open(blob, timeout=_TIMEOUT_S) as answer:
                    return _bounded(answer, limit, path)
        except urllib.error.HTTPError as exc:
            raise GitHubError(f"GitHub answered HTTP {exc.code} to the download of {path}",
                              exc.code) from None
        except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
            raise GitHubError(f"GitHub's API at {self.api} could not be reached ({exc.__class__.__name__})") \
                from None

    def pages(self, path: str) -> list[Any]:
        """Every item of a listing, page by page (100 a page)."""
        out: list[Any] = []
        sep = "&" if "?" in path else "?"
        for page in range(1, _PAGES + 1):
            items = self.call("GET", f"{path}{sep}per_page=100&page={page}")
            if not isinstance(items, list):
                raise GitHubError(f"GitHub's answer to GET {path} is not a list")
            out += items
            if len(items) < 100:
                break
        return out
