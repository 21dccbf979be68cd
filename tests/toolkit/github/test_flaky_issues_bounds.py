"""`python -m ci issues` within bounds: a capped number of new issues a run, one issue for an entry
two suites run, a body GitHub takes, and one refused change that stops nothing else.

GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this machine has no
GitHub), which refuses a body over 65,536 characters (HTTP 422) and answers 410 for an issue an
admin deleted, as GitHub does. The store, the registry and the command are the real ones.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _github_api import BODY_LIMIT, env_for, fake_github
from _verdict_store import in_process

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
T0 = time.time() - 100_000
SHARED = "tests/e2e/test_shared.py"


@pytest.fixture
def issues(capsys, monkeypatch):
    return in_process(capsys, monkeypatch, "issues")


def registry(entries, *, two_suites=False):
    listed = ", ".join(f'Entry(path="{e}")' for e in entries)
    other = (f'\n            Suite(name="image", tier="gpu", purpose="p", profile="e2e", label="run-ci-image", '
             f'entries=(Entry(path="{SHARED}"),)),') if two_suites else ""
    return f"""
        from ci.registry import Entry, Suite

        SUITES = (
            Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu",
                  entries=({listed},)),{other}
        )
    """


def failing_on_main(url, suite, entries, *, reason="AssertionError: broken", runs=3):
    with open_store(url) as store:
        for n in range(runs):
            tries = tuple(AttemptRecord(entry_id=e, path=e, attempt=1, final=True, outcome="failed",
                                        seconds=1.0, reason=reason) for e in entries)
            store.record(RunRecord(uid=f"{suite}-{Path(entries[0]).stem}-{n}", suite=suite, commit=f"{n:02d}" + "ab" * 19,
                                   branch="main", event="push", hardware="cuda", started_at=T0 + n * 100,
                                   ended_at=T0 + n * 100 + 1, exit_code=1, attempts=tries))


def test_a_run_opens_at_most_ten_issues_and_the_rest_wait(tmp_path, issues):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    names = [f"tests/e2e/test_crafted_{i:03d}.py" for i in range(40)]
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry(names[:1])})
    failing_on_main(url, "gpu", names)  # 40 names in the history, one of them registered
    with fake_github() as (api, gh):
        first = issues(root, url, env=env_for(api))
        assert first.returncode == 0, first.stderr
        assert len(gh.issues) == 10, len(gh.issues)
        assert first.stdout.count("for a later run (10 issues opened this run already") == 30
        second = issues(root, url, env=env_for(api))
        assert second.returncode == 0 and len(gh.issues) == 20
        assert "updated" not in second.stdout, "an issue that says the same is not rewritten"


def test_an_entry_two_suites_run_gets_one_issue_written_once_a_run(tmp_path, issues):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry([SHARED], two_suites=True)})
    failing_on_main(url, "gpu", [SHARED])
    failing_on_main(url, "image", [SHARED])
    with fake_github() as (api, gh):
        for _ in range(3):
            proc = issues(root, url, env=env_for(api))
            assert proc.returncode == 0, proc.stderr
        assert len(gh.issues) == 1, [i["title"] for i in gh.issues]
        [issue] = gh.issues
        assert issue["title"] == f"Failing on main: {SHARED} (gpu, image)"
        assert "(suite `gpu`)" in issue["body"] and "(suite `image`)" in issue["body"]
        assert issue["body"].count("<!-- slime-ci:entry=") == 1
        writes = [c for c in gh.calls if c[0] != "GET"]
        assert writes == [("POST", "/repos/acme/slime/issues")], writes


def test_an_oversize_body_is_cut_and_a_refused_change_stops_no_other(tmp_path, issues):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    huge, plain, gone = ("tests/e2e/test_huge.py", "tests/e2e/test_plain.py", "tests/e2e/test_gone.py")
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": registry([huge, plain, gone])})
    failing_on_main(url, "gpu", [huge], reason="E   AssertionError: " + "tensor mismatch " * 8000, runs=5)
    failing_on_main(url, "gpu", [gone, plain])
    with fake_github() as (api, gh):
        # An issue of the bot's that an admin since deleted: GitHub answers 410 to every change.
        gh.issues.append({"number": 1, "title": "t", "body": f"<!-- slime-ci:entry={gone} kind=broken-main -->",
                          "labels": ["slime-ci"], "assignees": [], "state": "open", "state_reason": None,
                          "closed_at": None, "user": {"login": gh.login, "type": "Bot"}})
        gh.gone.add(1)
        proc = issues(root, url, env=env_for(api))
        bodies = {i["body"].split("entry=")[1].split(" ")[0]: i["body"] for i in gh.issues}
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert set(bodies) == {gone, huge, plain}, "the refused change stopped the others"
    assert all(len(b.encode("utf-8")) <= BODY_LIMIT for b in bodies.values())
    assert "could not update #1" in proc.stderr and "HTTP 410" in proc.stderr, proc.stderr
    assert "issues: write" not in proc.stderr, "a 410 is no missing permission"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
