"""`python -m ci issues`: the lifecycle of the issues of held and main-breaking entries, on planted
histories in a real SQLite file and a real PostgreSQL server.

GitHub's API is the loopback stand-in of tests/toolkit/_github_api.py (this machine has no
GitHub); the store, the registry, CODEOWNERS and the command are the real ones.
"""

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write
from _github_api import REPO, env_for, fake_github
from _verdict_store import in_process

from ci.github.flaky_issues import LABEL, codeowners, owner_of, wanted_issues
from ci.history.record import read_before
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store
from ci.registry.loader import load_registry

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu", entries=(
            Entry(path="tests/e2e/test_flaky.py"), Entry(path="tests/e2e/test_broken.py"),
            Entry(path="tests/e2e/test_steady.py"),
            Entry(path="tests/e2e/test_pinned.py", quarantine="hangs on H100, see #12", owner="@alice"))),
    )
"""
CODEOWNERS = "# who answers for what\n*  @fallback\n/tests/e2e/  @gpu-owner @acme/rl-team\n"
FLAKY, BROKEN, STEADY, PINNED = (f"tests/e2e/test_{n}.py" for n in ("flaky", "broken", "steady", "pinned"))
T0 = time.time() - 100_000




@pytest.fixture
def issues(capsys, monkeypatch):
    """`python -m ci issues …` through the command table, in this process."""
    return in_process(capsys, monkeypatch, "issues")


def record(url, n, at, outcomes, pr=None):
    tries = [AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o, seconds=1.0,
                           reason="" if o == "passed" else f"{p}: AssertionError")
             for p, o in outcomes.items()]
    with open_store(url) as store:
        store.record(RunRecord(uid=f"main-{n}" if pr is None else f"pr-{pr}-{n}", suite="gpu", commit=sha(n),
                               branch="main" if pr is None else "feature", event="push", hardware="cuda",
                               started_at=at, ended_at=at + 1, exit_code=0, attempts=tuple(tries),
                               trusted=pr is None, pr=pr))


def sha(n):
    return f"{n:02d}" + "c0ffee" * 6 + "aa"


def plant(url):
    """Twelve runs on main: test_flaky flakes 3 times (25 %), test_broken fails the last three."""
    for n in range(12):
        record(url, n, T0 + n * 100, {FLAKY: "flaky" if n % 4 == 1 else "passed",
                                      BROKEN: "failed" if n >= 9 else "passed", STEADY: "passed",
                                      PINNED: "passed"})
    for n in range(4):  # a PR's own runs, where test_steady flakes: never a reason to hold it
        record(url, 100 + n, T0 + n * 100 + 50, {STEADY: "flaky"}, pr=5)


def held(url):
    return set(read_before(url, suite="gpu", hardware="cuda", branch="main", quarantine_rate=0.1,
                           min_runs=10, warn=print, clean_runs=10).quarantined)


def test_open_stay_open_close_after_clean_runs_reopen_on_a_new_flake(store_url, tmp_path, issues):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, ".github/CODEOWNERS": CODEOWNERS})
    plant(store_url)
    with fake_github() as (api, gh):
        env = env_for(api)
        first = issues(root, store_url, env=env)
        assert first.returncode == 0, first.stderr
        by_entry = {i["body"].split("entry=")[1].split(" kind=")[0]: i for i in gh.issues}
        assert set(by_entry) == {FLAKY, BROKEN, PINNED}
        flaky, broken, pinned = by_entry[FLAKY], by_entry[BROKEN], by_entry[PINNED]
        assert flaky["body"].startswith(f"<!-- slime-ci:entry={FLAKY} kind=flaky -->")
        assert broken["body"].startswith(f"<!-- slime-ci:entry={BROKEN} kind=broken-main -->")
        assert all(i["labels"] == [LABEL] for i in gh.issues)
        assert "flake rate 25% (3 of 12 runs)" in flaky["body"]
        assert "owner: @gpu-owner @acme/rl-team" in flaky["body"] and flaky["assignees"] == ["gpu-owner"]
        assert "owner: @alice" in pinned["body"] and "hangs on H100" in pinned["body"]
        assert f"range to bisect: `{sha(8)}..{sha(9)}`" in broken["body"]
        assert f"https://github.com/{REPO}/commit/{sha(11)}" in broken["body"], "the failures link their commits"
        assert held(store_url) == {FLAKY}, "the quarantine holds the entry its issue names"

        again = issues(root, store_url, env=env)  # still flaky: one issue each, still open, unchanged
        assert again.returncode == 0 and len(gh.issues) == 3
        assert all(i["state"] == "open" for i in gh.issues)
        assert "updated" not in again.stdout, "an issue that would say the same is not rewritten"

        for n in range(12, 22):  # ten clean runs; main passes test_broken again
            record(store_url, n, T0 + n * 100, {FLAKY: "passed", BROKEN: "passed", STEADY: "passed",
                                                PINNED: "passed"})
        assert held(store_url) == set(), "ten clean runs let the entry go"
        closing = issues(root, store_url, env=env)
        assert (flaky["state"], broken["state"], pinned["state"]) == ("closed", "closed", "open")
        assert f"closed #{flaky['number']}: {FLAKY} (its last 12 runs passed at the first try" in closing.stdout
        assert f"main passed it again at {sha(21)[:10]}" in closing.stdout
        assert "Closing: its last 12 runs passed" in gh.comments[flaky["number"]][0]["body"]

        pinned["state"], pinned["closed_at"] = "closed", "2020-01-01T00:00:00Z"  # closed by hand
        issues(root, store_url, env=env)  # nothing new since: closed stays closed
        assert (flaky["state"], pinned["state"]) == ("closed", "closed") and len(gh.issues) == 3

        record(store_url, 22, time.time() + 5, {FLAKY: "flaky", BROKEN: "passed", STEADY: "passed",
                                                PINNED: "passed"})
        reopened = issues(root, store_url, env=env)
        assert flaky["state"] == "open" and len(gh.issues) == 3, "the same issue comes back, not a new one"
        assert f"reopened #{flaky['number']}" in reopened.stdout
        assert "Reopened: flaked again" in gh.comments[flaky["number"]][-1]["body"]


def test_closing_the_issue_by_hand_lifts_the_quarantine_until_it_flakes_again(store_url, tmp_path, issues):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY})
    plant(store_url)
    with fake_github() as (api, gh):
        env = env_for(api)
        issues(root, store_url, env=env)
        flaky = next(i for i in gh.issues if f"entry={FLAKY} " in i["body"])
        flaky["state"], flaky["closed_at"] = "closed", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        assert held(store_url) == {FLAKY}, "closed on GitHub, but the store does not know yet"
        lifted = issues(root, store_url, env=env)
        assert f"lifted the quarantine of {FLAKY} (#{flaky['number']} was closed by hand" in lifted.stdout
        assert held(store_url) == set(), "a person closed it: the entry is trusted again"
        with open_store(store_url) as store:
            assert set(store.lifts()) == {("gpu", FLAKY)}
        quiet = issues(root, store_url, env=env)
        assert flaky["state"] == "closed" and "lifted" not in quiet.stdout and len(gh.issues) == 3
        now = time.time()
        for n in range(30, 42):  # it flakes again after the lift: 3 of 12
            record(store_url, n, now + n, {FLAKY: "flaky" if n % 4 == 0 else "passed", BROKEN: "passed",
                                           STEADY: "passed", PINNED: "passed"})
        assert held(store_url) == {FLAKY}
        again = issues(root, store_url, env=env)
        assert flaky["state"] == "open" and f"reopened #{flaky['number']}" in again.stdout


def test_dry_run_changes_nothing_and_bad_input(tmp_path, issues):
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY})
    plant(url)
    dry = issues(root, url, "--dry-run")
    assert dry.returncode == 0 and "would open an issue: flaky tests/e2e/test_flaky.py" in dry.stdout
    assert "3 action(s), none taken (--dry-run)" in dry.stdout
    with open_store(url) as store:  # every run, a PR's too: its flakes of test_steady count for nothing
        every = store.attempts()
    assert {r.entry_id for r in every if not r.trusted} == {STEADY}
    wanted = wanted_issues(every, load_registry(root).suites, root, repo=REPO)
    assert {(w.entry_id, w.kind) for w in wanted} == {(FLAKY, "flaky"), (PINNED, "flaky"), (BROKEN, "broken-main")}
    no_token = issues(root, url, env={"GITHUB_TOKEN": ""})
    assert no_token.returncode == 2 and "set GITHUB_TOKEN" in no_token.stderr
    gone = issues(root, f"sqlite:///{tmp_path / 'not-a-db.sqlite'}", "--dry-run", "--unreachable-ok")
    assert gone.returncode == 0  # an empty new store: nothing to track
    (tmp_path / "junk.sqlite").write_bytes(b"not a database" * 100)
    junk = issues(root, f"sqlite:///{tmp_path / 'junk.sqlite'}", "--dry-run", "--unreachable-ok")
    assert junk.returncode == 0 and "skipped, the history store cannot be used" in junk.stderr


def test_owner_comes_from_the_registry_then_the_last_matching_codeowners_rule(tmp_path):
    write(tmp_path, {".github/CODEOWNERS": CODEOWNERS + "docs/ @writer\n*.md @docs\n/slime/rollout/ @rl\n"})
    rules = codeowners(tmp_path)
    assert owner_of("tests/e2e/test_x.py", "", "", rules) == "@gpu-owner @acme/rl-team"
    assert owner_of("tests/unit/test_y.py", "", "", rules) == "@fallback"
    assert owner_of("a/docs/x.txt", "", "", rules) == "@writer", "a bare name matches at any depth"
    assert owner_of("slime/rollout/sglang.py", "", "", rules) == "@rl"
    assert owner_of("x/slime/rollout/a.py", "", "", rules) == "@fallback", "a leading / anchors at the root"
    assert owner_of("tests/e2e/test_x.py", "@entry", "@suite", rules) == "@entry"
    assert owner_of("tests/e2e/test_x.py", "", "@suite", rules) == "@suite"
    assert owner_of("x.py", "", "", []) == ""


def _bisect_answer(url, *, bad, commit, kind, at):
    """A row of the `bisects` table as `python -m ci bisect` writes it (ci.bisect.answer.record_answer);
    written directly: this test is about the issue, the bisect's own tests run real searches."""
    import uuid

    from ci.history import schema

    with open_store(url) as store, store.engine.begin() as conn:
        conn.execute(schema.bisects.insert().values(
            uid=uuid.uuid4().hex, suite="gpu", entry_id=BROKEN, good=sha(8), bad=bad, kind=kind, commit=commit,
            candidates=commit, confidence=0.99, attempts_per_commit=2, width=1, rounds=2, steps=4,
            trigger="monitor", started_at=at, ended_at=at + 1, summary=f"{kind}: {commit[:10] or 'none'}"))


def test_the_broken_main_issue_names_the_commit_a_bisect_of_its_streak_found(store_url, tmp_path, issues):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, ".github/CODEOWNERS": CODEOWNERS})
    plant(store_url)
    _bisect_answer(store_url, bad=sha(11), commit=sha(9), kind="first-bad", at=T0 + 2000)
    # A newer answer of an older range (its bad end passed on main since): not this streak's.
    _bisect_answer(store_url, bad=sha(3), commit=sha(2), kind="first-bad", at=T0 + 3000)
    with fake_github() as (api, gh):
        done = issues(root, store_url, env=env_for(api))
        assert done.returncode == 0, done.stderr
        [broken] = [i for i in gh.issues if f"entry={BROKEN} " in i["body"]]
    culprit = f"- **culprit**: [{sha(9)[:10]}](https://github.com/{REPO}/commit/{sha(9)}), found by"
    assert culprit in broken["body"], broken["body"]
    assert sha(2) not in broken["body"], "an answer whose bad end is outside the streak was taken"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
