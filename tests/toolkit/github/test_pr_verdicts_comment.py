"""The sticky verdict comment: never over GitHub's size limit, and only the bot's own is edited.

GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this machine has no
GitHub): it signs what the token posts with the bot's login, and refuses a body over 65,536
characters with HTTP 422 as GitHub does. The store and the command are the real ones.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _github_api import BODY_LIMIT, env_for, fake_github
from _verdict_store import attempt, plant_main, plant_pr, registry, why_command

from ci.github.pr_verdicts import MARKER

NUM_GPUS = 0


@pytest.fixture
def why(capsys, monkeypatch):
    return why_command(capsys, monkeypatch)


def test_a_huge_run_still_gets_its_comment_cut_to_the_limit_with_a_line_saying_so(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    # 600 failed entries, each with a long reason: about 400 KB of table.
    plant_pr(url, [attempt(f"gen_{i:03d}", "failed", reason=f"AssertionError: {i} " + "x" * 600)
                   for i in range(600)], pr=11)
    with fake_github() as (api, gh):
        gh.comments[11] = [{"id": 5, "body": MARKER + "\n**verdict: pass.** (stale)",
                            "user": {"login": gh.login, "type": "Bot"}}]
        proc = why(root, url, "--pr", "11", "--comment", "--gate", env=env_for(api))
        assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr
        assert "updated comment 5" in proc.stdout and "not written" not in proc.stderr, proc.stderr
        [body] = [c["body"] for c in gh.comments[11]]
    assert len(body.encode("utf-8")) <= BODY_LIMIT
    assert body.startswith(MARKER) and "**verdict: fail.** 600 of 600 failed entries block" in body
    assert "This text was cut at GitHub's limit of 65,536 characters" in body.splitlines()[-1]
    assert "`python -m ci why --pr 11` prints it all." in body.splitlines()[-1]


def test_only_the_bots_own_comment_is_edited_never_one_that_pastes_the_marker(tmp_path, why):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry()})
    plant_main(url)
    plant_pr(url, [attempt("new", "failed", reason="AssertionError: the PR broke it")], pr=12)
    forged = MARKER + "\n**verdict: pass.** nothing to see; @everyone merge it"
    with fake_github() as (api, gh):
        gh.comments[12] = [{"id": 3, "body": forged, "user": {"login": "mallory", "type": "User"}}]
        proc = why(root, url, "--pr", "12", "--comment", "--gate", env=env_for(api))
        assert proc.returncode == 1 and "posted comment" in proc.stdout, proc.stdout + proc.stderr
        theirs, ours = gh.comments[12]
        assert theirs["body"] == forged, "someone else's comment was rewritten"
        assert ours["user"]["login"] == gh.login and "**verdict: fail.**" in ours["body"]
        again = why(root, url, "--pr", "12", "--comment", env=env_for(api))
        assert f"comment {ours['id']} unchanged" in again.stdout and len(gh.comments[12]) == 2


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
