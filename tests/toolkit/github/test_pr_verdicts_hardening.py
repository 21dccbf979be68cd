"""`python -m ci why` against bad input, and its REST client against a redirect to another host.

Each case was a hole: `--base=--output=FILE` made git write FILE; a mistyped `--history` path
made an empty store and the gate passed; `--pr 10**20` was a traceback. The client is driven
against two loopback servers (this machine has no GitHub): one stands in for the API and
redirects, the other records what reached it, and must never see the token.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import loopback_server, run_ci, write
from _verdict_store import plant_main, registry, why_command

from ci.github.rest_client import GitHub, GitHubError

NUM_GPUS = 0


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


@pytest.fixture
def repo(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    plant_main(url)
    return root, url


def test_a_base_that_looks_like_an_option_never_reaches_git_as_one(repo, tmp_path, why):
    root, url = repo
    planted = tmp_path / "written-by-git"
    for base in (f"--output={planted}", "-p", "--no-such"):
        proc = why(root, url, "--pr", "7", f"--base={base}", "--gate")
        assert proc.returncode == 2 and "--base" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not planted.exists(), "git took the merge base for --output and wrote the file"


def test_a_mistyped_store_is_an_error_not_an_empty_store_that_passes(tmp_path, repo, why):
    root, _ = repo
    typo = tmp_path / "hsitory.sqlite"
    proc = why(root, f"sqlite:///{typo}", "--pr", "7", "--gate")
    assert proc.returncode == 4 and "no history store at" in proc.stderr, proc.stdout + proc.stderr
    assert not typo.exists(), "a reading command made a store"
    # The verdict job before any snapshot exists, on the default path: the jobs' results speak.
    failed = json.dumps({"lint": {"result": "failure"}})
    proc = why(root, None, "--pr", "7", "--gate", "--needs", failed)
    assert proc.returncode == 1 and "only the jobs' results were judged" in proc.stdout, proc.stdout
    assert not (root / ".ci-cache/history.sqlite").exists()


def test_a_pull_request_number_out_of_range_is_one_line(repo, why):
    root, url = repo
    proc = run_ci("why", "--history", url, "--root", str(root), "--pr", str(10**20))  # as a user runs it
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--pr" in proc.stderr, proc.stderr
    for number in ("0", "-3", "2147483648", "1e3"):
        proc = why(root, url, f"--pr={number}")
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--pr" in proc.stderr, proc.stderr


def test_the_rest_client_never_carries_the_token_to_another_host():
    token = "ghs_" + "R3d1r" * 8
    reached = []

    class Elsewhere(BaseHTTPRequestHandler):
        def do_GET(self):
            reached.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"[]")

        def log_message(self, *args):
            pass

    with loopback_server(Elsewhere) as elsewhere:
        class Api(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(302)
                self.send_header("Location", f"{elsewhere}/stolen{self.path}")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        with loopback_server(Api) as api:
            gh = GitHub(api=api, repo="acme/slime", token=token)
            with pytest.raises(GitHubError, match="HTTP 302") as refused:
                gh.call("GET", "/issues/1/comments")
    assert reached == [], "the token went to the host the redirect named"
    assert refused.value.status == 302 and token not in str(refused.value)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
