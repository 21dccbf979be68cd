"""A loopback stand-in for the parts of GitHub's REST API the verdict comment and the issue
tracker use: a PR's comments (list, post, edit), a repository's issues (list, create,
edit, comment), a workflow run's jobs (list) and check runs (create, update: the Checks API's caps of 50 annotations a
request and 65,535 characters a summary answer 422, as GitHub's do; an update's annotations
are appended). This machine has no GitHub; the stand-in keeps its state in memory, checks the
token on every call and records each call, so a test sees what the toolkit asked for. What the
token writes is signed, as on GitHub, by its bot user (`login`); a body over GitHub's 65,536
characters is refused with HTTP 422, as GitHub refuses it.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from _ci import loopback_server

TOKEN = "ghs_" + "V3rd1ct" * 5  # a fake job token
REPO = "acme/slime"
BOT = "github-actions[bot]"  # who GitHub says wrote what the job's token posts
BODY_LIMIT = 65_536
SUMMARY_LIMIT = 65_535  # a check run's output.summary
ANNOTATIONS_PER_REQUEST = 50


@dataclass
class FakeGitHub:
    """What the stand-in holds: comments per issue/PR number, issues, and every call made."""

    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    check_runs: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[tuple[int, int], list[dict[str, Any]]] = field(default_factory=dict)  # (run id, attempt)
    calls: list[tuple[str, str]] = field(default_factory=list)
    refuse_writes: bool = False  # a fork's read-only token: every write is a 403
    login: str = BOT
    gone: set[int] = field(default_factory=set)  # issues an admin deleted: every change is a 410
    _next: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_id(self) -> int:
        self._next += 1
        return self._next

    def issue(self, number: int) -> dict[str, Any]:
        return next(i for i in self.issues if i["number"] == number)


def _handler(state: FakeGitHub) -> type[BaseHTTPRequestHandler]:
    prefix = f"/repos/{REPO}"

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _serve(self, method: str) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else {}
            with state.lock:
                state.calls.append((method, self.path))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    return self._answer(401, {"message": "Bad credentials"})
                if method != "GET" and state.refuse_writes:
                    return self._answer(403, {"message": "Resource not accessible by integration"})
                if not url.path.startswith(prefix):
                    return self._answer(404, {"message": "Not Found"})
                parts = url.path[len(prefix):].strip("/").split("/")
                if len(str(body.get("body", ""))) > BODY_LIMIT:
                    return self._answer(422, {"message": "Validation Failed",
                                              "errors": [{"field": "body", "code": "custom",
                                                          "message": "body is too long (maximum is 65536 "
                                                                     "characters)"}]})
                if method != "GET" and len(parts) >= 2 and parts[1].isdigit() and int(parts[1]) in state.gone:
                    return self._answer(410, {"message": "This issue was deleted"})
                code, answer = self._route(method, parts, query, body)
                return self._answer(code, answer)

        def _route(self, method: str, parts: list[str], query: dict[str, str],
                   body: dict[str, Any]) -> tuple[int, Any]:
            page, per = int(query.get("page", 1)), int(query.get("per_page", 30))
            if parts[:2] == ["actions", "runs"] and len(parts) == 6 and parts[3] == "attempts" and method == "GET":
                listed = state.jobs.get((int(parts[2]), int(parts[4])), [])
                return 200, {"total_count": len(listed), "jobs": listed[(page - 1) * per:page * per]}
            if parts[0] == "check-runs":
                return self._check_run(method, parts, body)
            if parts[0] != "issues":
                return 404, {"message": "Not Found"}
            if len(parts) == 3 and parts[2] == "comments" and method == "GET":
                items = state.comments.get(int(parts[1]), [])
                return 200, items[(page - 1) * per:page * per]
            if len(parts) == 3 and parts[2] == "comments" and method == "POST":
                c = {"id": state.new_id(), "body": body["body"], "user": {"login": state.login, "type": "Bot"}}
                state.comments.setdefault(int(parts[1]), []).append(c)
                return 201, c
            if len(parts) == 3 and parts[1] == "comments" and method == "PATCH":
                for items in state.comments.values():
                    for c in items:
                        if c["id"] == int(parts[2]):
                            c["body"] = body["body"]
                            return 200, c
                return 404, {"message": "Not Found"}
            if len(parts) == 1 and method == "GET":
                label, wanted = query.get("labels"), query.get("state", "open")
                items = [i for i in state.issues if (label is None or label in i["labels"])
                         and (wanted == "all" or i["state"] == wanted)]
                out = [{**i, "labels": [{"name": n} for n in i["labels"]]} for i in items]
                return 200, out[(page - 1) * per:page * per]
            if len(parts) == 1 and method == "POST":
                issue = {"number": len(state.issues) + 1, "title": body["title"], "body": body.get("body", ""),
                         "labels": list(body.get("labels", [])), "assignees": list(body.get("assignees", [])),
                         "state": "open", "state_reason": None, "closed_at": None,
                         "user": {"login": state.login, "type": "Bot"}}
                state.issues.append(issue)
                return 201, issue
            if len(parts) == 2 and method == "PATCH":
                issue = state.issue(int(parts[1]))
                issue.update({k: v for k, v in body.items() if k in ("title", "body", "state", "state_reason")})
                if "state" in body:
                    closed = body["state"] == "closed"
                    issue["closed_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) if closed else None
                return 200, issue
            return 404, {"message": "Not Found"}

        def _check_run(self, method: str, parts: list[str], body: dict[str, Any]) -> tuple[int, Any]:
            output = body.get("output", {})
            notes = list(output.get("annotations", []))
            if len(notes) > ANNOTATIONS_PER_REQUEST or len(str(output.get("summary", ""))) > SUMMARY_LIMIT:
                return 422, {"message": "Validation Failed: at most 50 annotations a request; "
                                        "Only 65535 characters are allowed in the summary"}
            if any(not {"path", "start_line", "end_line", "annotation_level", "message"} <= set(a)
                   for a in notes):
                return 422, {"message": "Validation Failed: an annotation lacks a required field"}
            if len(parts) == 1 and method == "POST":
                if not body.get("name") or not body.get("head_sha"):
                    return 422, {"message": "Validation Failed: name and head_sha are required"}
                ident = state.new_id()
                run = {"id": ident, "name": body["name"], "head_sha": body["head_sha"],
                       "status": body.get("status"), "conclusion": body.get("conclusion"),
                       "title": output.get("title"), "summary": output.get("summary", ""),
                       "annotations": notes, "requests": 1,
                       "html_url": f"https://github.test/{REPO}/runs/{ident}"}
                state.check_runs.append(run)
                return 201, {k: v for k, v in run.items() if k != "annotations"}
            if len(parts) == 2 and parts[1].isdigit() and method == "PATCH":
                run = next((r for r in state.check_runs if r["id"] == int(parts[1])), None)
                if run is None:
                    return 404, {"message": "Not Found"}
                run["annotations"] += notes
                run["requests"] += 1
                return 200, {k: v for k, v in run.items() if k != "annotations"}
            return 404, {"message": "Not Found"}

        def do_GET(self) -> None:
            self._serve("GET")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def log_message(self, *args: object) -> None:
            pass

    return Handler


@contextlib.contextmanager
def fake_github() -> Iterator[tuple[str, FakeGitHub]]:
    """The stand-in's base URL (as GITHUB_API_URL) and its state."""
    state = FakeGitHub()
    with loopback_server(_handler(state)) as url:
        yield url, state


def env_for(url: str) -> dict[str, str]:
    """What a job's step has: the token, the repository, the API's address."""
    return {"GITHUB_TOKEN": TOKEN, "GITHUB_REPOSITORY": REPO, "GITHUB_API_URL": url}
