"""The history's trust boundary: a job that ran PR code exports its runs, the ingest job records
them, trusted and PR number from GitHub's event payload, the artifact read as hostile.

Real `python -m ci history` processes on real SQLite files and the real PostgreSQL server; the
`workflow_run` event payload is a file written here (GitHub's own cannot exist in a test).
"""

import json
import os
import sqlite3
import sys
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write
from _gitrepo import Clone
from _postgres import fresh_database

from ci.errors import UsageError
from ci.github.gateway import RUN_FILE_WORKFLOW
from ci.github.ingest_workflow import TRUSTED_PATH
from ci.github.workflow import WORKFLOW_PATH
from ci.history.ingest import (
    MAX_FILE_BYTES,
    MAX_FILES,
    ONE_FILE_WORKFLOW,
    TRUSTED_WORKFLOW,
    Trigger,
    collect,
    parse_record,
    trigger,
)
from ci.history.store import normalise, open_store

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/test_ok.py", cpu_only=True),)),
    )
"""
# A GPU job of a pull request, without GitHub's own variables leaking in from whoever runs this.
JOB_ENV = {"GITHUB_SHA": "c0ffee", "GITHUB_HEAD_REF": "feature", "GITHUB_EVENT_NAME": "pull_request",
           "SLIME_CI_HISTORY_URL": ""}
UID = "0123456789abcdef0123456789abcdef"
NOW = time.time()
MAIN_SHA = "c0ffee" * 6 + "c0ff"  # a commit of main, as the stand-in graph below answers


def _event(*, workflow: str = ".github/workflows/pr-test.yml", event: str = "pull_request",
           branch: str = "feature", head_repo: str = "o/r", prs: tuple[int, ...] = (12,),
           title: str = "Add a thing", head_sha: str = MAIN_SHA) -> dict[str, Any]:
    return {"workflow_run": {"id": 777, "path": workflow, "event": event, "head_branch": branch,
                             "head_sha": head_sha, "head_repository": {"full_name": head_repo},
                             "pull_requests": [{"number": n} for n in prs], "display_title": title},
            "repository": {"full_name": "o/r", "default_branch": "main"}}


def _trigger(event: Any) -> Trigger:
    """The trigger with a commit graph in which main holds MAIN_SHA alone (the real graph, read
    with git, is tests/toolkit/history/test_on_branch.py's)."""
    return trigger(event, run_file=ONE_FILE_WORKFLOW, trusted_workflow=TRUSTED_WORKFLOW,
                   on_branch=lambda sha, branch: (sha, branch) == (MAIN_SHA, "main"))


PR12 = Trigger(run_id=777, workflow=".github/workflows/pr-test.yml", event="pull_request",
               trusted=False, pr=12)


# --- whose run it was: from the event, never from the artifact -----------------------------------

@pytest.mark.parametrize(("event", "trusted", "pr"), [
    (_event(), False, 12),
    (_event(prs=()), False, None),  # a PR GitHub names no number for: untrusted all the same
    (_event(event="push", branch="main", prs=()), True, None),
    (_event(event="schedule", branch="main", prs=()), True, None),
    (_event(event="workflow_dispatch", branch="main", prs=()), True, None),
    (_event(event="workflow_dispatch", branch="feature", prs=()), False, None),  # another branch's code
    (_event(event="push", branch="main", head_repo="fork/r", prs=()), False, None),
    # The one-file workflow runs on main's ref but checks out the PR's head: never trusted.
    (_event(workflow=".github/workflows/run-ci-file.yml", event="workflow_dispatch", branch="main",
            prs=(), title="pr-test run megatron tests/e2e/x.py for PR #31"), False, 31),
    # A pushed tag named `main` reports `head_branch: main`; its commit is on no branch.
    (_event(event="push", branch="main", prs=(), head_sha="ab" * 20), False, None),
    (_event(event="push", branch="main", prs=(), head_sha=""), False, None),
    # Another file that took the test workflow's `name:` (pushed on a branch or a tag).
    (_event(workflow=".github/workflows/mine.yml", event="push", branch="main", prs=()), False, None),
])
def test_trust_and_pr_come_from_the_event(event: dict[str, Any], trusted: bool, pr: int | None) -> None:
    found = _trigger(event)
    assert (found.trusted, found.pr, found.run_id) == (trusted, pr, 777)


def test_a_one_file_run_whose_name_states_no_single_pr_is_refused() -> None:
    for title in ("pr-test run megatron  for PR #", "for PR #3 for PR #4", "by hand"):
        with pytest.raises(UsageError, match="states no single PR"):
            _trigger(_event(workflow=".github/workflows/run-ci-file.yml", event="workflow_dispatch",
                            branch="main", title=title))
    with pytest.raises(UsageError, match="workflow_run"):
        _trigger({"action": "completed"})


def test_the_one_file_workflow_is_named_as_the_gateway_dispatches_it() -> None:
    assert ONE_FILE_WORKFLOW == RUN_FILE_WORKFLOW
    assert TRUSTED_WORKFLOW == WORKFLOW_PATH == TRUSTED_PATH  # the file the ingest job trusts


# --- the artifact is hostile ----------------------------------------------------------------------

def _record(**over: Any) -> dict[str, Any]:
    run: dict[str, Any] = {
        "uid": UID, "suite": "train", "commit": MAIN_SHA, "branch": "feature", "event": "pull_request",
        "host": "h", "runner": "r", "backend": "docker", "hardware": "cuda", "started_at": NOW - 60,
        "ended_at": NOW - 1, "exit_code": 0, "trusted": False, "pr": None,
        "attempts": [{"entry_id": "tests/test_ok.py", "path": "tests/test_ok.py", "attempt": 1,
                      "final": True, "outcome": "passed", "passed": 1, "failed": 0, "skipped": 0,
                      "num_gpus": 1, "devices": "0", "node": "", "seconds": 3.5, "reason": ""}],
        "metrics": [{"entry_id": "tests/test_ok.py", "step": 1, "name": "reward", "value": 0.5}]}
    run.update(over)
    return run


def test_a_valid_record_takes_the_events_trust_and_pr() -> None:
    run = parse_record(json.dumps(_record(pr=12)), trigger=PR12, now=NOW)
    assert (run.trusted, run.pr, run.uid, run.attempts[0].seconds, run.metrics[0].value) == \
        (False, 12, UID, 3.5, 0.5)
    main = Trigger(run_id=1, workflow="w", event="schedule", trusted=True, pr=None, head_sha=MAIN_SHA)
    assert parse_record(json.dumps(_record()), trigger=main, now=NOW).trusted is True
    assert parse_record(json.dumps(_record()), trigger=main, now=NOW).event == "schedule"


def _attempt(**over: Any) -> list[dict[str, Any]]:
    return [{**_record()["attempts"][0], **over}]


def _metric(**over: Any) -> list[dict[str, Any]]:
    return [{**_record()["metrics"][0], **over}]


@pytest.mark.parametrize(("text", "why"), [
    (json.dumps(_record(trusted=True)), "claims to be trusted"),
    (json.dumps(_record(pr=13)), "claims PR #13"),
    (json.dumps(_record(uid="../../etc")), "`uid` is not 32 hex digits"),
    (json.dumps({**_record(), "admin": True}), "has keys it must not (admin)"),
    (json.dumps({k: v for k, v in _record().items() if k != "exit_code"}), "lacks keys it must have (exit_code)"),
    (json.dumps(_record(exit_code="0")), "`exit_code` is not a valid int"),
    (json.dumps(_record(exit_code=True)), "`exit_code` is not a valid int"),
    (json.dumps(_record(suite="s" * 129)), "`suite` is not a valid str of at most 128"),
    (json.dumps(_record(started_at=1e300)), "`started_at` is not a valid time"),
    (json.dumps(_record(attempts=_attempt(seconds=float("nan")))).replace("NaN", "NaN"), "NaN is not a number"),
    (json.dumps(_record(metrics=_metric(step=2 ** 63))), "metric point 0: `step` is not a valid int"),
    (json.dumps(_record(metrics=_metric(value=float("inf")))), "Infinity is not a number"),
    (json.dumps(_record(attempts=_attempt(extra=1))), "attempt 0 has keys it must not (extra)"),
    (json.dumps(_record(attempts=[1])), "attempt 0 is not an object"),
    (json.dumps(_record(metrics=[{**_metric()[0], "step": i} for i in range(20_001)])),
     "more than 20000 metric points"),
    ('{"uid": "a", "uid": "b"}', "an object repeats a key"),
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("[]", "the run is not an object"),
    ("1" * 5000, "digits"),  # Python's own limit on an integer's digits
])
def test_a_hostile_record_is_refused_with_the_reason(text: str, why: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_record(text, trigger=PR12, now=NOW)
    assert why in str(caught.value)


def test_the_artifacts_are_bounded_in_files_bytes_and_kind(tmp_path: Path) -> None:
    def folder(name: str) -> Path:
        return (tmp_path / name / "history-megatron")

    many = folder("many")
    many.mkdir(parents=True)
    for i in range(MAX_FILES + 1):
        (many / f"{i:032x}.json").write_text("{}")
    big = folder("big")
    big.mkdir(parents=True)
    with (big / f"{UID}.json").open("wb") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: nothing is read before the size is checked
    link = folder("link")
    link.mkdir(parents=True)
    (link / f"{UID}.json").symlink_to("/etc/passwd")
    other = folder("other")
    other.mkdir(parents=True)
    (other / "run.sh").write_text("echo hi")
    binary = folder("binary")
    binary.mkdir(parents=True)
    (binary / f"{UID}.json").write_bytes(b"\xff\xfe{}")
    twice = folder("twice")
    twice.mkdir(parents=True)
    for name in ("a.json", "b.json"):
        (twice / name).write_text(json.dumps(_record()))
    for name, why in (("many", f"more than {MAX_FILES} files"), ("big", "MiB a file"),
                      ("link", "is not a plain file"), ("other", "is not an exported run"),
                      ("binary", "can't decode"), ("twice", "appears twice")):
        with pytest.raises(UsageError, match="nothing ingested") as caught:
            collect(tmp_path / name, trigger=PR12, now=NOW)
        assert why in str(caught.value), name
        assert "\n" not in str(caught.value)
    assert collect(tmp_path / "absent", trigger=PR12, now=NOW) == []  # the run uploaded nothing


def _zip(path: Path, members: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return path


def test_artifact_zips_are_read_in_memory_and_never_unpacked(tmp_path: Path) -> None:
    ok = _zip(tmp_path / "ok" / "101.zip", {f"{UID}.json": json.dumps(_record()).encode()})
    (run,) = collect(ok.parent, trigger=PR12, now=NOW)
    assert (run.uid, run.pr, run.trusted) == (UID, 12, False)
    assert sorted(p.name for p in ok.parent.iterdir()) == ["101.zip"]  # nothing unpacked
    for name, members, why in (
            ("slip", {f"../../{UID}.json": b"{}"}, "is not an exported run (<uid>.json)"),
            ("script", {"noxfile.py": b"import os"}, "is not an exported run (<uid>.json)"),
            # 9 MiB of zeros: a few KiB compressed, refused after reading at most 8 MiB + 1.
            ("bomb", {f"{UID}.json": bytes(9 << 20)}, "MiB a file"),
            ("bad", {f"{UID}.json": json.dumps(_record(pr=99)).encode()}, "claims PR #99")):
        folder = _zip(tmp_path / name / "102.zip", members).parent
        with pytest.raises(UsageError, match="nothing ingested") as caught:
            collect(folder, trigger=PR12, now=NOW)
        assert why in str(caught.value), name
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "103.zip").write_bytes(b"not a zip")
    with pytest.raises(UsageError, match=r"103\.zip is not a readable zip"):
        collect(tmp_path / "junk", trigger=PR12, now=NOW)
    assert not (tmp_path / UID).exists() and not (tmp_path.parent / f"{UID}.json").exists()


# --- end to end: a PR's GPU job exports, the ingest job records, baselines ignore it --------------

def _repo(tmp_path: Path) -> Path:
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_ok.py": PASSING})


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PR's GPU job: the session ran, the last step records and exports (no store URL)."""
    root = _repo(tmp_path_factory.mktemp("job"))
    ran = run_ci("run", "--suite", "train", "--root", str(root), "--no-prefork", "--no-docker", env=JOB_ENV)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    step = run_ci("history", "record", "--root", str(root), "--suite", "train", "--status", "success",
                  "--export", ".ci-cache/history-export", env=JOB_ENV)
    assert step.returncode == 0, step.stderr
    assert "exported 1 run(s)" in step.stdout
    (exported,) = (root / ".ci-cache/history-export").glob("*.json")
    data = json.loads(exported.read_text())
    assert (data["trusted"], data["pr"], data["suite"]) == (False, None, "train")  # no self-vouching
    return exported



@pytest.fixture(params=["sqlite", "postgresql"])
def shared_url(request, tmp_path):  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared.sqlite'}"
    return normalise(fresh_database(request.getfixturevalue("pg_server")))


def _ingest(artifacts: Path, event: dict[str, Any], url: str, tmp_path: Path,  # type: ignore[no-untyped-def]
            *extra: str, root: Path | None = None):
    """The ingest job's step; `root`: its checkout of the default branch (default: no checkout)."""
    path = tmp_path / "event.json"
    path.write_text(json.dumps(event))
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    env["GITHUB_OUTPUT"] = str(tmp_path / "outputs")
    return run_ci("history", "ingest", str(artifacts), "--event-file", str(path), "--history", url,
                  "--root", str(root or tmp_path), *extra, env={**env, "SLIME_CI_HISTORY_URL": ""})


def _outputs(tmp_path: Path) -> list[str]:
    """The step outputs the last ingest wrote (`trusted`: how many trusted runs it added)."""
    path = tmp_path / "outputs"
    lines = path.read_text().splitlines()
    path.unlink()
    return lines


def test_a_pr_jobs_export_is_ingested_untrusted_with_its_pr(tmp_path: Path, shared_url: str,
                                                            exported: Path) -> None:
    # As the ingest job fetches it: the artifact's zip, as the API serves it.
    artifacts = _zip(tmp_path / "downloaded" / "4242.zip", {exported.name: exported.read_bytes()}).parent
    done = _ingest(artifacts, _event(prs=(12,)), shared_url, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 run(s), 1 new" in done.stdout and "untrusted, PR #12" in done.stdout
    assert _outputs(tmp_path) == ["trusted=0"]  # no new baseline: the snapshot stays as it is
    again = _ingest(artifacts, _event(prs=(12,)), shared_url, tmp_path)  # a re-run of the ingest
    assert again.returncode == 0 and "1 run(s), 0 new" in again.stdout
    with open_store(shared_url) as store:
        (run,) = store.runs()
        assert (run.trusted, run.pr, run.event, run.suite) == (False, 12, "pull_request", "train")
        assert store.attempts(trusted_only=True) == []  # never a baseline
        assert len(store.attempts()) == 1


def test_the_verdict_job_records_its_own_runs_into_a_local_store_only(tmp_path: Path, exported: Path) -> None:
    """`--pr N`: the verdict job (no credential) puts this run's exports beside the trusted
    snapshot, untrusted and of PR N; the shared store is never reached this way."""
    artifacts = _zip(tmp_path / "downloaded" / "4242.zip", {exported.name: exported.read_bytes()}).parent
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")} | {"SLIME_CI_HISTORY_URL": ""}
    local = tmp_path / "local.sqlite"
    done = run_ci("history", "ingest", str(artifacts), "--pr", "31", "--history", f"sqlite:///{local}",
                  "--root", str(tmp_path), env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    with open_store(f"sqlite:///{local}") as store:
        (run,) = store.runs()
        assert (run.trusted, run.pr, run.event) == (False, 31, "pull_request")
    remote = run_ci("history", "ingest", str(artifacts), "--pr", "31", "--history",
                    "postgresql://ci@127.0.0.1:1/history", "--root", str(tmp_path), env=env)
    assert remote.returncode == 2
    assert remote.stderr.startswith("error: --pr records into a local SQLite store only")
    both = run_ci("history", "ingest", str(artifacts), "--pr", "31", "--event-file", str(tmp_path / "e.json"),
                  "--root", str(tmp_path), env=env)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


def test_a_refused_artifact_writes_nothing_and_says_why_in_one_line(tmp_path: Path) -> None:
    artifacts = tmp_path / "downloaded" / "history-megatron"
    artifacts.mkdir(parents=True)
    (artifacts / "a.json").write_text(json.dumps(_record(uid="a" * 32)))
    (artifacts / "b.json").write_text(json.dumps(_record(uid="b" * 32, trusted=True)))
    db = tmp_path / "shared.sqlite"
    done = _ingest(tmp_path / "downloaded", _event(), f"sqlite:///{db}", tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        "error: ingest: history-megatron/b.json: the run claims to be trusted; only the ingest job "
        "decides that; nothing ingested"]
    assert not db.exists()  # not even a store: the valid record a.json is not written either


def test_a_main_run_is_ingested_trusted(tmp_path: Path) -> None:
    checkout = Clone.on_feature_branch(tmp_path, {"README.md": "main\n"})  # the ingest job's
    head = checkout.git("rev-parse", "main")
    artifacts = tmp_path / "downloaded" / "history-megatron"
    artifacts.mkdir(parents=True)
    (artifacts / f"{UID}.json").write_text(json.dumps(_record(commit=head)))
    db = tmp_path / "shared.sqlite"
    scheduled = _event(event="schedule", branch="main", prs=(), head_sha=head)
    looked = _ingest(tmp_path / "downloaded", scheduled, f"sqlite:///{db}", tmp_path, "--dry-run",
                     root=checkout.root)
    assert looked.returncode == 0 and "1 valid run(s) would be recorded (train)" in looked.stdout
    assert not db.exists()
    done = _ingest(tmp_path / "downloaded", scheduled, f"sqlite:///{db}", tmp_path, root=checkout.root)
    assert done.returncode == 0, done.stderr
    assert _outputs(tmp_path) == ["trusted=1"]  # the ingest job refreshes the GPU jobs' snapshot
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT trusted, pr, event FROM runs").fetchall() == [(1, None, "schedule")]


def test_the_snapshot_holds_the_newest_trusted_runs_only(tmp_path: Path) -> None:
    from ci.history.rows import RunRecord

    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    with open_store(url) as store:
        for n in range(1, 6):  # 1..3 trusted, 4..5 from a PR
            store.record(RunRecord(uid=f"{n:032x}", suite="megatron", hardware="cuda", started_at=float(n),
                                   ended_at=float(n), exit_code=0, trusted=n <= 3, pr=None if n <= 3 else 9))
    out = tmp_path / "gpu-job" / ".ci-cache" / "history.sqlite"
    done = run_ci("history", "snapshot", str(out), "--last-runs", "2", "--history", url,
                  "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "2 trusted run(s)" in done.stdout
    with sqlite3.connect(out) as conn:
        assert conn.execute("SELECT uid, trusted FROM runs ORDER BY started_at").fetchall() == [
            (f"{2:032x}", 1), (f"{3:032x}", 1)]
    assert sorted(p.name for p in out.parent.iterdir()) == ["history.sqlite"]  # no temporary left
    same = run_ci("history", "snapshot", str(tmp_path / "shared.sqlite"), "--history", url,
                  "--root", str(tmp_path))
    assert same.returncode == 2 and "that is the store it reads" in same.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
