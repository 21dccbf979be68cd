"""The comment gateway against what a stranger can type, and its parser against its trigger.

The parser must read as a command exactly the comments the gateway workflow starts on: its
rule is read from the generated `.github/workflows/ci-comment.yml` and both are driven with
Hypothesis. A path spelled `./tests/…`, `//`, `/./` or with a trailing `/` resolves to the
registered file (it raised KeyError); a reply never quotes markdown or an unbounded word;
team lookups never carry the token to another host (two loopback stand-ins for GitHub's
API: one that redirects, one that records what reached it), and an answer that breaks off (a
malformed status line, a body shorter than it said, from a raw loopback socket) is one line,
not a traceback. A Unicode line separator GitHub shows inside a line reads as a space.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, loopback_server

from ci.github.comment_commands import COMMANDS, Command, parse_comment
from ci.github.job_plan import main
from ci.github.teams import TEAMS_SECRET, lookup

NUM_GPUS = 0
SHA = "0123456789abcdef0123456789abcdef01234567"


def _trigger_prefix() -> str:
    """The body prefix the generated gateway workflow's decide job starts on (its `if:`)."""
    workflow = yaml.safe_load((REPO / ".github/workflows/ci-comment.yml").read_text())
    condition = workflow["jobs"]["decide"]["if"]
    found = re.findall(r"startsWith\(github\.event\.comment\.body, '([^']*)'\)", condition)
    assert len(found) == 1, condition
    # Only the PR check and this test stand beside it: nothing else filters the body.
    assert re.sub(r"\s+", " ", condition).strip() == (
        f"github.event.issue.pull_request && startsWith(github.event.comment.body, '{found[0]}')")
    return found[0]


PREFIX = _trigger_prefix()


def _starts(body: str) -> bool:
    # GitHub's startsWith ignores case.
    return body.casefold().startswith(PREFIX.casefold())


_words = st.sampled_from([*(f"/{c}" for c in COMMANDS), "/", "//", "/x", "tests/t.py", "run-ci-ckpt",
                          "![i](http://h/i.png)", " ", "\t", "\n", "\r\n", "\u2028", "\x0b", "    "])
_bodies = st.one_of(st.text(max_size=30), st.lists(st.one_of(_words, st.text(max_size=6)), max_size=6).map("".join))


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=_bodies)
@example(body="\n/help")  # a blank first line: the workflow never starts on it
@example(body="    /rerun-failed")  # an indented code block: neither
@example(body="/help")
def test_the_parser_reads_a_command_exactly_when_the_workflow_starts(body: str) -> None:
    assert (parse_comment(body) is not None) == _starts(body), repr(body)


# Characters str.splitlines() ends a line at and GitHub does not: it shows them inside the line.
_NOT_A_NEWLINE = ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e"]


@settings(max_examples=300, deadline=None, database=None)
@given(first=st.sampled_from([*(f"/{c}" for c in COMMANDS), "/run-ci run-ci-ckpt", "/rerun-test tests/t.py"]),
       sep=st.sampled_from(_NOT_A_NEWLINE),
       second=st.sampled_from([*(f"/{c}" for c in COMMANDS), "/rerun-test tests/t.py", "x"]))
@example(first="/rerun-failed", sep="\u2028", second="/run-ci run-ci-ckpt")
def test_a_unicode_line_separator_is_inside_the_line_as_github_shows_it(first: str, sep: str,
                                                                        second: str) -> None:
    # GitHub shows "/rerun-failed<U+2028>/run-ci x" as one line: one command with two extra words.
    assert parse_comment(first + sep + second) == parse_comment(first + " " + second)
    assert parse_comment(first + "\n" + second) == parse_comment(first), "a real newline ends the line"


def _plan(capsys: pytest.CaptureFixture[str], comment: str, actor: str = "alice",
          association: str = "MEMBER") -> dict[str, object]:
    assert main(["--event", "issue_comment", "--root", str(REPO), "--json", "--pr", "7", "--sha", SHA,
                 "--comment", comment, "--actor", actor, "--association", association, "--no-fork"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


@pytest.mark.parametrize("spelled", ["./tests/e2e/test_tiny_ckpt.py", "tests//e2e/test_tiny_ckpt.py",
                                     "tests/./e2e/test_tiny_ckpt.py", "tests/e2e/test_tiny_ckpt.py/"])
def test_a_rerun_test_path_in_another_spelling_dispatches_the_registered_file(
        capsys: pytest.CaptureFixture[str], spelled: str) -> None:
    out = _plan(capsys, f"/rerun-test {spelled}")
    assert out["verdict"] == "allowed" and out["suite"] == "ckpt", out
    assert out["dispatch"]["inputs"]["only"] == "tests/e2e/test_tiny_ckpt.py"  # type: ignore[index]
    assert out["command_line"] == "nox -s ckpt -- --only tests/e2e/test_tiny_ckpt.py"
    assert parse_comment(f"/rerun-test {spelled}") == Command(name="rerun-test", arg=spelled)


@pytest.mark.parametrize("comment", [
    "/![pwned](https://evil.example/i.png)", "/" + "w" * 65_000, "/rerun-test ![x](https://e/i.png)",
    "/rerun-test " + "t" * 65_000 + ".py", "/run-ci [a](https://e)", "/run-ci " + "l" * 65_000,
    "/rerun-test ../../etc/passwd<img src=x>",
])
def test_a_refusal_never_quotes_markdown_or_an_unbounded_word(capsys: pytest.CaptureFixture[str],
                                                              comment: str) -> None:
    out = _plan(capsys, comment, actor="o", association="OWNER")
    assert out["verdict"] == "refused" and out["reaction"] == "confused"
    reply = str(out["reply"])
    assert len(reply) < 300 and "\n" not in reply, reply
    for markup in ("](", "<img", "www", "lll", "ttt", "evil"):
        assert markup not in reply, reply
    assert len(json.dumps(out)) < 1500  # the decision travels through GITHUB_OUTPUT and env


def test_a_plain_unknown_word_is_still_named(capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan(capsys, "/rerun-tests tests/x.py")
    assert str(out["why"]).startswith("unknown command `/rerun-tests`; known: /rerun-test")


def test_team_lookups_never_follow_a_redirect_to_another_host() -> None:
    token = "ghp_" + "Z9" * 18
    reached: list[dict[str, str | None]] = []

    class Elsewhere(BaseHTTPRequestHandler):  # the host a redirect names: must see no token
        def do_GET(self) -> None:
            reached.append({"path": self.path, "auth": self.headers.get("Authorization")})
            body = json.dumps({"state": "active"}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with loopback_server(Elsewhere) as elsewhere:
        class Api(BaseHTTPRequestHandler):  # stand-in for GitHub's API: redirects every team
            def do_GET(self) -> None:
                if self.path.startswith("/moved/"):  # same host: followed, token and all
                    Elsewhere.do_GET(self)  # type: ignore[arg-type]
                    return
                same = "/orgs/acme/teams/same/"
                target = f"/moved{self.path}" if self.path.startswith(same) else f"{elsewhere}{self.path}"
                self.send_response(302)
                self.send_header("Location", target)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        with loopback_server(Api) as api:
            env = {TEAMS_SECRET: token, "GITHUB_API_URL": api}
            found = lookup("dave", "acme", ["gpu-ci"], env)
            assert "HTTP 302" in str(found.unavailable) and not found.teams
            assert reached == [], "the token went to the host a redirect named"
            moved = lookup("dave", "acme", ["same"], env)
            assert moved.teams == {"same"} and moved.unavailable is None
            assert reached == [{"path": "/moved/orgs/acme/teams/same/memberships/dave",
                                "auth": f"Bearer {token}"}]


def _raw_server(answer: bytes):
    """A loopback socket that reads one request and sends `answer` as it is, then closes."""
    sock = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = sock.accept()
        with conn:
            conn.recv(65536)
            conn.sendall(answer)

    threading.Thread(target=serve, daemon=True).start()
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.mark.parametrize("answer", [
    b"HTTP/1.1 banana\r\n\r\n",  # a malformed status line
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n{\"state\":",  # shorter than it said
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 100\r\n\r\n{",  # a refusal cut short
    b"",  # closed without a word
])
def test_a_team_lookup_whose_answer_breaks_off_is_one_line(answer: bytes) -> None:
    sock, api = _raw_server(answer)
    with sock:
        found = lookup("dave", "acme", ["gpu-ci"], {TEAMS_SECRET: "ghp_x", "GITHUB_API_URL": api})
    assert not found.teams
    assert found.unavailable is None or "\n" not in found.unavailable
    if answer.startswith(b"HTTP/1.1 404"):
        assert found.unavailable is None, "a 404 is not a member, whatever its body"
    else:
        assert "could not be reached" in str(found.unavailable), found


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
