"""`python -m ci bisect` end to end on a planted repository of 32 commits (tests/toolkit/_bisect_repo.py):
real git, real worktrees, each step a real `python -m ci run` of the planted entry."""

import json
import re
import shlex
import sqlite3
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _bisect_repo as planted
from _ci import run_ci
from _gitrepo import Clone

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
VALUE = "tests/unit/test_value.py"
FAST = "--run-arg=--no-prefork"  # a fresh interpreter per step: cheaper than a forking worker here


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return planted.build(tmp_path_factory.mktemp("planted"))


@pytest.fixture
def repo(template, tmp_path):
    clone, shas = template
    return Clone.copy_of(clone, tmp_path), shas


def snapshot(clone):
    """Everything a user would notice: HEAD, branch, status, worktrees, every file's bytes."""
    files = {p.relative_to(clone.root).as_posix(): p.read_bytes()
             for p in sorted(clone.root.rglob("*")) if p.is_file() and ".git" not in p.parts}
    return (clone.git("rev-parse", "HEAD"), clone.git("branch", "--show-current"),
            clone.git("status", "--porcelain", "--ignored"), clone.git("worktree", "list"), files)


def record(url, uid, suite, entry, sha, outcome, started):
    with open_store(url) as store:
        store.record(RunRecord(uid=uid, suite=suite, commit=sha, branch="main", event="push",
                               started_at=started, ended_at=started + 1,
                               exit_code=0 if outcome in ("passed", "flaky") else 1,
                               attempts=(AttemptRecord(entry_id=entry, path=entry, attempt=1, final=True,
                                                       outcome=outcome, seconds=1.0),)))


def rounds(stdout):
    return re.findall(r"^round (\d+):", stdout, re.M)


def test_the_monitors_streak_becomes_the_first_bad_commit(repo, tmp_path):
    """The monitor saw the entry pass at the good end and fail three times at the tip: the
    bisect takes that range, finds commit 20 in ⌈log2 32⌉ + 1 rounds, and writes its answer to
    the history, the step summary and the streak issue's body; the checkout is untouched."""
    clone, shas = repo
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    record(url, "pass", "unit", VALUE, shas[0], "passed", 1)
    for n in range(3):
        record(url, f"fail{n}", "unit", VALUE, shas[32], "failed", 2 + n)
    before = snapshot(clone)
    summary = tmp_path / "summary.md"
    work = tmp_path / "steps"
    work.mkdir()
    proc = run_ci("bisect", "--from-monitor", "--entry", VALUE, "--history", url, "--root", str(clone.root),
                  FAST, "--answer-dir", str(tmp_path / "answer"), "--trigger", "monitor",
                  "--work-dir", str(work),
                  env={"GITHUB_STEP_SUMMARY": str(summary)}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    culprit = shas[planted.BREAK]
    assert (f"first bad commit: {culprit[:10]} Simplify the answer (#120) (CI Test, PR #120)"
            in proc.stdout)
    assert len(rounds(proc.stdout)) <= 6, proc.stdout  # ⌈log2 32⌉ + 1
    assert f"reproduce: git worktree add --detach /tmp/bisect-{culprit[:10]} {culprit}" in proc.stdout
    assert snapshot(clone) == before
    assert list(work.iterdir()) == []  # the steps' worktrees were there, and are gone
    assert "**first bad commit:" in summary.read_text()
    body = (tmp_path / "answer" / "tests_unit_test_value.py.md").read_text()
    assert body.startswith(f"<!-- slime-ci:entry={VALUE} kind=broken-main -->\n")
    assert json.loads((tmp_path / "answer" / "tests_unit_test_value.py.json").read_text())["pr"] == 120
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:
        row = conn.execute("select kind, \"commit\", good, bad, trigger, rounds from bisects").fetchone()
    assert row[:5] == ("first-bad", culprit, shas[0], shas[32], "monitor") and row[5] <= 6


def test_a_good_end_that_already_fails_is_refused_in_one_line(repo):
    clone, shas = repo
    before = snapshot(clone)
    proc = run_ci("bisect", "--suite", "unit", "--entry", VALUE, "--good", shas[25], "--bad", shas[32],
                  "--history", "off", "--root", str(clone.root), FAST, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "the good end already fails" in proc.stderr
    assert len(rounds(proc.stdout)) == 1
    assert snapshot(clone) == before


def test_a_commit_that_does_not_install_is_skipped_and_said_so(repo):
    """Commits 18..26 with --install: the first probe (21) does not install; the search steps
    around it and still names commit 20."""
    clone, shas = repo
    before = snapshot(clone)
    proc = run_ci("bisect", "--suite", "unit", "--entry", VALUE, "--good", shas[17], "--bad", shas[26],
                  "--install", "python install.py", "--history", "off", "--root", str(clone.root), FAST, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    no_install = shas[planted.NO_INSTALL][:10]
    assert f"{no_install} skipped: does not install: python install.py exited 1" in proc.stdout
    assert re.search(rf"{no_install}\s+change 21\s+skipped \(does not install", proc.stdout)
    assert f"first bad commit: {shas[planted.BREAK][:10]}" in proc.stdout
    assert snapshot(clone) == before  # the install ran in the step's worktree, not here


def test_dry_run_prints_the_plan_and_runs_nothing(repo):
    clone, shas = repo
    before = snapshot(clone)
    proc = run_ci("bisect", "--suite", "unit", "--entry", "tests/unit/test_flaky.py", "--good", shas[0],
                  "--bad", shas[32], "--flake-rate", "0.4", "--dry-run", "--root", str(clone.root))
    assert proc.returncode == 0, proc.stderr
    assert "flake rate 40%: 10 attempts per commit, each verdict at 99.40%" in proc.stdout
    assert "at most 7 round(s)" in proc.stdout  # both ends, then ⌈log2 32⌉
    plain = re.findall(r"^ +\d+  \w{10} change \d+ \(CI Test\)$", proc.stdout, re.M)
    assert len(plain) == 29  # 32, less the two named ones and the bad end
    assert "Simplify the answer (#120) (CI Test, PR #120)" in proc.stdout and "(bad end)" in proc.stdout
    assert "each step: " in proc.stdout and "--only tests/unit/test_flaky.py" in proc.stdout
    assert "round 1" not in proc.stdout
    assert snapshot(clone) == before


def test_a_budget_below_the_confidence_is_said_before_anything_runs(repo):
    clone, shas = repo
    proc = run_ci("bisect", "--suite", "unit", "--entry", "tests/unit/test_flaky.py", "--good", shas[0],
                  "--bad", shas[32], "--flake-rate", "0.4", "--max-attempts", "4", "--dry-run",
                  "--root", str(clone.root))
    assert proc.returncode == 0, proc.stderr
    assert ("flake rate 40%: 4 attempts per commit, each verdict at 87.04% -- 99% needs 10; "
            "--max-attempts 4 caps it, so the answer is weaker than asked") in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--good", "{32}", "--bad", "{0}"), "is not an ancestor"),
    (("--good", "{0}", "--bad", "nope"), "--bad 'nope' is no commit"),
    (("--good", "{0}", "--entry", "tests/unit/test_nothing.py"), "has no entry"),
    (("--good", "{0}", "--confidence", "1.5"), "--confidence"),
    (("--from-monitor", "--history", "off"), "--from-monitor reads the history"),
    (("--good", "{0}", "--install", "pip install 'unbalanced"), "--install \"pip install 'unbalanced\": "
                                                                "No closing quotation"),
    (("--good", "{0}", "--flake-rate", "1e-300"), "more than 1,000,000 attempts"),  # log(1 - r) is 0.0
])
def test_bad_input_is_one_line_and_exit_2(repo, args, message):
    clone, shas = repo
    argv = [a.format(*shas) for a in args]
    if "--entry" not in argv:
        argv += ["--entry", VALUE]
    proc = run_ci("bisect", "--suite", "unit", *argv, "--root", str(clone.root), "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_the_monitors_streak_must_lie_on_the_branch(repo, tmp_path):
    """The history names the commits a bisect runs: a streak whose bad end is a commit of no
    branch (a forged record, a tag's run) is refused before any of it is checked out."""
    clone, shas = repo
    clone.git("checkout", "--quiet", "--detach", shas[32])
    off = clone.commit("not reviewed", {"calc.py": planted.calc(0)})
    clone.git("checkout", "--quiet", "main")
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    record(url, "pass", "unit", VALUE, shas[0], "passed", 1)
    for n in range(3):
        record(url, f"fail{n}", "unit", VALUE, off, "failed", 2 + n)
    proc = run_ci("bisect", "--from-monitor", "--entry", VALUE, "--history", url, "--root", str(clone.root),
                  "--dry-run")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1
    assert f"the streak's bad end '{off[:12]}' is not a commit of main" in proc.stderr
    assert "round 1" not in proc.stdout and "commits:" not in proc.stdout
    # The bisect workflow's explicit range (a /bisect comment, a dispatch) is held the same way;
    # by hand, any range of the checkout can still be bisected.
    given = ("bisect", "--suite", "unit", "--entry", VALUE, "--good", shas[0], "--bad", off,
             "--root", str(clone.root), "--history", "off", "--dry-run")
    held = run_ci(*given, "--branch-only")
    assert held.returncode == 2 and held.stderr.count("\n") == 1, held.stdout + held.stderr
    assert f"--bad '{off}' ({off[:10]}) is not a commit of main" in held.stderr
    assert run_ci(*given).returncode == 0


def test_from_monitor_never_makes_a_store_at_a_mistyped_path(repo, tmp_path):
    clone, _ = repo
    typo = tmp_path / "histroy" / "h.sqlite"
    proc = run_ci("bisect", "--from-monitor", "--entry", VALUE, "--history", f"sqlite:///{typo}",
                  "--root", str(clone.root), "--dry-run")
    assert proc.returncode == 4, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and f"no history store at {typo}" in proc.stderr
    assert not typo.parent.exists()


def test_no_step_holds_the_stores_url_or_the_jobs_tokens(repo, tmp_path):
    """Each step runs `--history off`; the bisect alone records its answer. What a step (its
    install command here) sees of the job's environment: no store URL under any name, no token."""
    clone, shas = repo
    url = f"sqlite:///{tmp_path / 'h.sqlite'}"
    probe = tmp_path / "env.jsonl"
    dump = f"import json, os; open({str(probe)!r}, 'a').write(json.dumps(dict(os.environ)) + chr(10))"
    secrets = {"SLIME_CI_HISTORY_URL": url, "DATABASE_URL": url, "GITHUB_TOKEN": "ghs_job",
               "GH_TOKEN": "ghs_job", "ACTIONS_RUNTIME_TOKEN": "rt", "ACTIONS_ID_TOKEN_REQUEST_TOKEN": "oidc"}
    proc = run_ci("bisect", "--suite", "unit", "--entry", VALUE, "--good", shas[19], "--bad", shas[20],
                  "--install", shlex.join([sys.executable, "-c", dump]), "--root", str(clone.root), FAST,
                  env={**secrets, "PATH_MARK": "kept"}, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = [json.loads(line) for line in probe.read_text().splitlines()]
    assert seen and all(env.get("PATH_MARK") == "kept" for env in seen)  # the rest passes through
    for env in seen:
        assert not set(secrets) & set(env), sorted(set(secrets) & set(env))
        assert not any(url in value for value in env.values())
    with sqlite3.connect(tmp_path / "h.sqlite") as conn:  # the bisect itself still records
        assert conn.execute("select count(*) from bisects").fetchone() == (1,)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
