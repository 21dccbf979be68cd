"""A loopback stand-in for the GitHub REST endpoints the generated workflows call (aiohttp).

This machine cannot reach GitHub. Jobs under act talk to this server through `GITHUB_API_URL`
(the toolkit's REST client, and the `gh` stand-in): a PR's comments (list, create, edit: the
sticky verdict), reactions, labels, issues (the monitor's), check runs, a PR's head, a team
membership, workflow dispatches, and a run's artifacts (listed from the state folder the
upload stand-in writes; a download redirected, when asked, to a signed-URL host on another
port, as GitHub redirects it to its blob storage). It keeps everything in memory and records
every request, so what CI asked GitHub for is part of the answer of `python -m ci actions`.
It binds 127.0.0.1 only. As GitHub does, it signs what the token writes with the token's bot
user (`login`), refuses a body over 65,536 characters with HTTP 422, and answers 410 to a
change of a deleted issue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REQUEST_FIELDS = ("method", "path", "body")
BOT = "github-actions[bot]"  # who GitHub says wrote what a job's token posts
BODY_LIMIT = 65_536  # characters of an issue or comment body; GitHub answers 422 past it
SUMMARY_LIMIT = 65_535  # characters of a check run's output.summary
ANNOTATIONS_PER_REQUEST = 50  # the Checks API's cap; an update's annotations are appended
_ANNOTATION_KEYS = {"path", "start_line", "end_line", "annotation_level", "message"}


@dataclass
class GitHubState:
    """What the stand-in holds; tests and the harness read it after a run."""

    repo: str
    token: str
    artifacts: Path | None = None  # <state>/artifacts/<run id>/<name>.zip
    # Where an artifact's zip download is redirected, as GitHub answers it: a 302 to a signed
    # address on another host (`serve_blobs`); empty: the zip is served directly.
    blob_url: str = ""
    blob_requests: list[dict[str, Any]] = field(default_factory=list)  # path, authorization
    # The run each artifact folder is of, as the repository-wide listing describes it
    # (`workflow_run`: head_branch, head_sha, repository_id, head_repository_id); run id -> it.
    artifact_runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    pulls: dict[int, dict[str, Any]] = field(default_factory=dict)
    comments: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    issues: list[dict[str, Any]] = field(default_factory=list)
    labels: dict[int, list[str]] = field(default_factory=dict)
    check_runs: list[dict[str, Any]] = field(default_factory=list)
    jobs: dict[tuple[int, int], list[dict[str, Any]]] = field(default_factory=dict)  # (run id, attempt)
    dispatches: list[dict[str, Any]] = field(default_factory=list)
    team_members: dict[str, set[str]] = field(default_factory=dict)  # "org/team" -> logins
    requests: list[dict[str, Any]] = field(default_factory=list)
    refuse_writes: bool = False  # a fork's read-only token: every write is a 403
    login: str = BOT
    gone: set[int] = field(default_factory=set)  # issues an admin deleted: every change is a 410
    _next: int = 1000
    lock: threading.Lock = field(default_factory=threading.Lock)

    def new_id(self) -> int:
        self._next += 1
        return self._next

    @property
    def calls(self) -> list[tuple[str, str]]:
        """(method, path with query) of every request, in order."""
        return [(r["method"], r["path"]) for r in self.requests]

    def author(self) -> dict[str, str]:
        return {"login": self.login, "type": "Bot"}

    def artifact_files(self) -> list[tuple[int, str, Path]]:
        """(id, run id, zip) of every uploaded artifact; ids are stable for one folder."""
        if self.artifacts is None or not self.artifacts.is_dir():
            return []
        found = sorted(self.artifacts.glob("*/*.zip"))
        return [(i + 1, z.parent.name, z) for i, z in enumerate(found)]


def _edit(items: list[dict[str, Any]], key: str, value: int, changes: dict[str, Any]) -> tuple[int, Any]:
    found = [i for i in items if i[key] == value]
    if not found:
        return 404, {"message": "Not Found"}
    found[0].update(changes)
    return 200, found[0]


def _route(state: GitHubState, method: str, parts: list[str], query: dict[str, str],
           body: Any) -> tuple[int, Any]:
    """One request under /repos/OWNER/NAME, already split on `/` (pure over the state)."""
    page, per = int(query.get("page", 1)), int(query.get("per_page", 30))
    n = len(parts)
    if isinstance(body, dict) and len(str(body.get("body", ""))) > BODY_LIMIT:
        return 422, {"message": "Validation Failed",
                     "errors": [{"field": "body", "code": "custom",
                                 "message": f"body is too long (maximum is {BODY_LIMIT} characters)"}]}
    if method != "GET" and parts[:1] == ["issues"] and n >= 2 and parts[1].isdigit() \
            and int(parts[1]) in state.gone:
        return 410, {"message": "This issue was deleted"}
    if parts[:1] == ["pulls"] and n == 2 and method == "GET":
        pull = state.pulls.get(int(parts[1]))
        return (200, pull) if pull is not None else (404, {"message": "Not Found"})
    if parts[:1] == ["issues"] and n == 3 and parts[2] == "comments":
        number = int(parts[1])
        if method == "GET":
            return 200, state.comments.get(number, [])[(page - 1) * per:page * per]
        comment = {"id": state.new_id(), "body": body.get("body", ""), "user": state.author()}
        state.comments.setdefault(number, []).append(comment)
        return 201, comment
    if parts[:2] == ["issues", "comments"] and n == 3 and method == "PATCH":
        for items in state.comments.values():
            for c in items:
                if c["id"] == int(parts[2]):
                    c["body"] = body.get("body", "")
                    return 200, c
        return 404, {"message": "Not Found"}
    if parts[:2] == ["issues", "comments"] and n == 4 and parts[3] == "reactions":
        return 201, {"id": state.new_id(), "content": body.get("content")}
    if parts[:1] == ["issues"] and n == 3 and parts[2] == "labels" and method == "POST":
        names = state.labels.setdefault(int(parts[1]), [])
        names += [x for x in body.get("labels", []) if x not in names]
        return 200, [{"name": x} for x in names]
    if parts == ["issues"] and method == "GET":
        label, wanted = query.get("labels"), query.get("state", "open")
        items = [i for i in state.issues if (label is None or label in i["labels"])
                 and (wanted == "all" or i["state"] == wanted)]
        out = [{**i, "labels": [{"name": x} for x in i["labels"]]} for i in items]
        return 200, out[(page - 1) * per:page * per]
    if parts == ["issues"] and method == "POST":
        issue = {"number": len(state.issues) + 1, "title": body["title"], "body": body.get("body", ""),
                 "labels": list(body.get("labels", [])), "assignees": list(body.get("assignees", [])),
                 "state": "open", "state_reason": None, "closed_at": None, "user": state.author()}
        state.issues.append(issue)
        return 201, issue
    if parts[:1] == ["issues"] and n == 2 and method == "PATCH":
        kept = {k: v for k, v in body.items() if k in ("title", "body", "state", "state_reason")}
        if "state" in body:
            kept["closed_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) \
                if body["state"] == "closed" else None
        return _edit(state.issues, "number", int(parts[1]), kept)
    if parts[:1] == ["check-runs"]:
        return _check_run(state, method, parts, body)
    if parts[:2] == ["actions", "runs"] and n == 6 and parts[3] == "attempts" and parts[5] == "jobs":
        listed = state.jobs.get((int(parts[2]), int(parts[4])), [])
        return 200, {"total_count": len(listed), "jobs": listed[(page - 1) * per:page * per]}
    if parts[:2] == ["actions", "workflows"] and n == 4 and parts[3] == "dispatches":
        state.dispatches.append({"workflow": parts[2], **body})
        return 204, None
    if parts[:2] == ["actions", "runs"] and n == 4 and parts[3] == "artifacts":
        listed = [{"id": i, "name": z.stem, "expired": False, "size_in_bytes": z.stat().st_size}
                  for i, run, z in state.artifact_files() if run == parts[2]]
        return 200, {"total_count": len(listed), "artifacts": listed}
    if parts == ["actions", "artifacts"] and method == "GET":  # the repository's, by name, newest first
        named = [(i, run, z) for i, run, z in state.artifact_files()
                 if "name" not in query or z.stem == query["name"]]
        named.sort(key=lambda x: (x[2].stat().st_mtime, x[0]), reverse=True)
        listed = [{"id": i, "name": z.stem, "expired": False, "size_in_bytes": z.stat().st_size,
                   "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(z.stat().st_mtime)),
                   "workflow_run": {"id": int(run) if run.isdigit() else run,
                                    **state.artifact_runs.get(run, {})}}
                  for i, run, z in named]
        return 200, {"total_count": len(listed), "artifacts": listed[(page - 1) * per:page * per]}
    if parts[:2] == ["actions", "artifacts"] and n == 4 and parts[3] == "zip":
        for i, _, z in state.artifact_files():
            if i == int(parts[2]):
                if state.blob_url:
                    return 302, {"Location": f"{state.blob_url}/artifacts/{i}.zip?sig={_signature(i)}"}
                return 200, z.read_bytes()
        return 404, {"message": "Not Found"}
    return 404, {"message": "Not Found"}


def _signature(ident: int) -> str:
    return f"signed-{ident:08d}"


def _check_run(state: GitHubState, method: str, parts: list[str], body: Any) -> tuple[int, Any]:
    """Create or update a check run, with the Checks API's limits (422 past them, as GitHub)."""
    output = body.get("output", {}) if isinstance(body, dict) else {}
    notes = list(output.get("annotations", []))
    if len(notes) > ANNOTATIONS_PER_REQUEST or len(str(output.get("summary", ""))) > SUMMARY_LIMIT:
        return 422, {"message": f"Validation Failed: at most {ANNOTATIONS_PER_REQUEST} annotations a "
                                f"request; Only {SUMMARY_LIMIT} characters are allowed in the summary"}
    if any(not set(a) >= _ANNOTATION_KEYS for a in notes):
        return 422, {"message": "Validation Failed: an annotation lacks a required field"}
    shown = ("id", "name", "head_sha", "status", "conclusion", "title", "summary", "requests", "html_url")
    if parts == ["check-runs"] and method == "POST":
        if not body.get("name") or not body.get("head_sha"):
            return 422, {"message": "Validation Failed: name and head_sha are required"}
        ident = state.new_id()
        run = {"id": ident, "name": body["name"], "head_sha": body["head_sha"], "status": body.get("status"),
               "conclusion": body.get("conclusion"), "title": output.get("title"),
               "summary": output.get("summary", ""), "annotations": notes, "requests": 1,
               "html_url": f"https://github.test/{state.repo}/runs/{ident}"}
        state.check_runs.append(run)
        return 201, {k: run[k] for k in shown}
    if len(parts) == 2 and parts[1].isdigit() and method == "PATCH":
        found = next((r for r in state.check_runs if r["id"] == int(parts[1])), None)
        if found is None:
            return 404, {"message": "Not Found"}
        found["annotations"] += notes
        found["requests"] += 1
        found.update({k: body[k] for k in ("status", "conclusion") if k in body})
        return 200, {k: found[k] for k in shown}
    return 404, {"message": "Not Found"}


def _app(state: GitHubState) -> Any:
    from aiohttp import web

    prefix = f"/repos/{state.repo}/"

    async def serve(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"_raw": raw.decode(errors="replace")}
        with state.lock:
            state.requests.append({"method": request.method, "path": request.path_qs, "body": body})
            if request.headers.get("Authorization") != f"Bearer {state.token}":
                return web.json_response({"message": "Bad credentials"}, status=401)
            if request.method != "GET" and state.refuse_writes:
                return web.json_response({"message": "Resource not accessible by integration"}, status=403)
            path = request.path
            if path.startswith("/orgs/") and "/memberships/" in path:
                _, _, org, _, team, _, user = path.split("/")[:7]
                if user in state.team_members.get(f"{org}/{team}", set()):
                    return web.json_response({"state": "active", "role": "member"})
                return web.json_response({"message": "Not Found"}, status=404)
            if not path.startswith(prefix):
                return web.json_response({"message": "Not Found"}, status=404)
            code, answer = _route(state, request.method, path[len(prefix):].strip("/").split("/"),
                                  dict(request.query), body)
        if isinstance(answer, bytes):
            return web.Response(body=answer, status=code, content_type="application/zip")
        if code == 302:
            return web.Response(status=code, headers=answer)
        if answer is None:
            return web.Response(status=code)
        return web.json_response(answer, status=code)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", serve)
    return app


def _blob_app(state: GitHubState) -> Any:
    """The signed-URL host an artifact download is redirected to: it serves a zip to the right
    signature alone and, as a blob store does, refuses (400) a request that also carries an
    Authorization header; it records each request and the header it came with."""
    from aiohttp import web

    async def blob(request: web.Request) -> web.StreamResponse:
        auth = request.headers.get("Authorization", "")
        with state.lock:
            state.blob_requests.append({"path": request.path_qs, "authorization": auth})
            if auth:
                return web.json_response({"message": "an Authorization header on a signed URL"}, status=400)
            for i, _, z in state.artifact_files():
                if request.path == f"/artifacts/{i}.zip":
                    if request.query.get("sig") != _signature(i):
                        return web.json_response({"message": "signature mismatch"}, status=403)
                    return web.Response(body=z.read_bytes(), content_type="application/zip")
        return web.json_response({"message": "Not Found"}, status=404)

    app = web.Application()
    app.router.add_route("GET", "/{tail:.*}", blob)
    return app


@contextlib.contextmanager
def serve(state: GitHubState) -> Iterator[str]:
    """Run the stand-in on a free loopback port in a thread; its base URL (GITHUB_API_URL)."""
    with _serve(_app(state), "github-stand-in") as url:
        yield url


@contextlib.contextmanager
def serve_blobs(state: GitHubState) -> Iterator[str]:
    """The signed-URL host on another free loopback port (another origin); set `state.blob_url`
    to its URL for artifact downloads to be redirected there."""
    with _serve(_blob_app(state), "github-blob-stand-in") as url:
        yield url


@contextlib.contextmanager
def _serve(app: Any, name: str) -> Iterator[str]:
    from aiohttp import web

    loop = asyncio.new_event_loop()
    ready = threading.Event()
    holder: dict[str, Any] = {}

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        holder["runner"] = runner
        holder["port"] = runner.addresses[0][1]
        ready.set()

    def main() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(start())
        loop.run_forever()

    thread = threading.Thread(target=main, name=name, daemon=True)
    thread.start()
    if not ready.wait(10):
        raise RuntimeError(f"the {name} did not start in 10 s")
    try:
        yield f"http://127.0.0.1:{holder['port']}"
    finally:
        asyncio.run_coroutine_threadsafe(holder["runner"].cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
