"""The commenter's teams, for an access policy that grants commands to teams.

The workflow's own GITHUB_TOKEN cannot read an organisation's team membership, so the
gateway asks GitHub with a token of its own: the optional secret SLIME_CI_TEAMS_TOKEN (a
token with org members:read), given only to the step that authorises. Without it, or when
GitHub refuses it, nothing fails: users and roles still work, and a commenter who could
only be admitted through a team is refused with one line that names the secret.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

TEAMS_SECRET = "SLIME_CI_TEAMS_TOKEN"
API_ENV = "GITHUB_API_URL"  # set by Actions (GitHub Enterprise has its own)
DEFAULT_API = "https://api.github.com"
_TIMEOUT_S = 10.0
# (url, token) -> (HTTP status, JSON body or None); the network call, passed in for tests.
Fetch = Callable[[str, str], tuple[int, object]]


@dataclass(frozen=True, kw_only=True)
class TeamLookup:
    """The teams (of those asked about) the commenter is an active member of."""

    teams: frozenset[str] = frozenset()
    unavailable: str | None = None  # why membership could not be read; None: it was


def no_token() -> str:
    return (f"set the {TEAMS_SECRET} secret (a token with org members:read) so the gateway "
            "can read team membership")


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to the same scheme, host and port: urllib would send the
    Authorization header (the token) along to any host a redirect names."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str,
                         headers: Any, newurl: str) -> urllib.request.Request | None:
        old, new = urllib.parse.urlsplit(req.full_url), urllib.parse.urlsplit(newurl)
        if (old.scheme, old.netloc) != (new.scheme, new.netloc):
            return None  # not followed: the 3xx is the answer
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def same_origin_opener() -> urllib.request.OpenerDirector:
    """An opener that follows redirects within the API's own origin only."""
    return urllib.request.build_opener(_SameOrigin)


_OPENER = same_origin_opener()


def http_fetch(url: str, token: str) -> tuple[int, object]:
    """GET one GitHub API URL; (status, parsed body). A redirect to another host is not
    followed (its status is the answer): the token goes to the API's host only."""
    request = urllib.request.Request(url, headers={
        "Authorization": f"Bearer {token}", "Accept": "application/vnd.github+json",
        "X-GitHub-Api-Version": "2022-11-28", "User-Agent": "slime-ci-gateway"})
    try:
        with _OPENER.open(request, timeout=_TIMEOUT_S) as answer:
            status, data = answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        try:
            status, data = exc.code, exc.read()
        except (OSError, http.client.HTTPException):  # a refusal whose body broke off
            status, data = exc.code, b""
    try:
        return status, json.loads(data) if data else None
    except ValueError:
        return status, None


def lookup(actor: str, org: str, teams: Iterable[str], env: Mapping[str, str],
           fetch: Fetch = http_fetch) -> TeamLookup:
    """Membership of `actor` in each of `teams` (slugs of `org`), one API call a team."""
    wanted = sorted(set(teams))
    if not wanted:
        return TeamLookup()
    token = env.get(TEAMS_SECRET, "").strip()
    if not token:
        return TeamLookup(unavailable=no_token())
    api = (env.get(API_ENV, "").strip() or DEFAULT_API).rstrip("/")
    member: set[str] = set()
    for slug in wanted:
        url = (f"{api}/orgs/{urllib.parse.quote(org, safe='')}/teams/{urllib.parse.quote(slug, safe='')}"
               f"/memberships/{urllib.parse.quote(actor, safe='')}")
        try:
            status, body = fetch(url, token)
        except (OSError, urllib.error.URLError, http.client.HTTPException) as exc:
            # http.client's own errors (a malformed status line, a body cut short) are no
            # OSError: they were a traceback of the gateway.
            return TeamLookup(teams=frozenset(member),
                              unavailable=f"GitHub's API could not be reached ({exc.__class__.__name__})")
        if status == 200 and isinstance(body, dict) and body.get("state") == "active":
            member.add(slug)
        elif status in (401, 403):
            return TeamLookup(teams=frozenset(member),
                              unavailable=f"GitHub refused {TEAMS_SECRET} (HTTP {status}): it needs "
                                          "org members:read")
        elif status not in (200, 404):  # 404: not a member (or no such team); 200 pending: not yet
            return TeamLookup(teams=frozenset(member),
                              unavailable=f"GitHub answered HTTP {status} for team {slug}")
    return TeamLookup(teams=frozenset(member))
