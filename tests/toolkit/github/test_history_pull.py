"""`python -m ci history pull`: main's trusted snapshot from the ingest job's artifact, then
`why --last` on a laptop judges against it.

GitHub is the loopback stand-in (ci/actions/github_api.py: the repository's artifacts listed by
name, each zip served); the snapshot is a real one (ci.history.ingest.snapshot of a store of
trusted runs), the local run a real `python -m ci run` whose two files fail. Among the artifacts
of that name are a newer one of a fork's run whose branch is also called `main` and one of a
pull request's branch: neither may be taken.
"""

import json
import os
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci
from _github_api import TOKEN, env_for, fake_github, serve_blobs
from _verdict_store import laptop_run

from ci.github.history_pull import MEMBER
from ci.github.why_last import SNAPSHOT_FILE
from ci.history.ingest import SNAPSHOT_ARTIFACT, snapshot
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
OURS = 4242  # the repository's id
WANTED = {"tests/test_a.py": "new", "tests/test_b.py": "already-failing"}


def _env(**more: str) -> dict[str, str]:
    return {k: "" for k in os.environ if k.startswith("GITHUB_")} | {"SLIME_CI_HISTORY_URL": ""} | more


@pytest.fixture(scope="module")
def laptop(tmp_path_factory):
    return laptop_run(tmp_path_factory.mktemp("laptop"))


def _snapshot_zip(folder: Path, run: str, b_outcome: str, mtime: float) -> None:
    """An artifact of run `run`: the snapshot of main's trusted runs, test_a passing and test_b
    ending `b_outcome`, zipped as upload-artifact does (its one file at the root)."""
    store_file = folder / f"store-{run}.sqlite"
    with open_store(f"sqlite:///{store_file}") as store:
        for n, b in ((1, b_outcome), (2, b_outcome)):
            tries = tuple(AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o, seconds=1.0,
                                        reason="AssertionError: planted" if o == "failed" else "")
                          for p, o in (("tests/test_a.py", "passed"), ("tests/test_b.py", b)))
            store.record(RunRecord(uid=f"{run}{n}".rjust(32, "0"), suite="unit", commit=f"{n}" * 40,
                                   branch="main", event="push", hardware="cpu", started_at=float(n),
                                   ended_at=n + 1.0, exit_code=0, trusted=True, attempts=tries))
        snap = folder / f"snap-{run}.sqlite"
        snapshot(store, snap)
    where = folder / "artifacts" / run / f"{SNAPSHOT_ARTIFACT}.zip"
    where.parent.mkdir(parents=True)
    with zipfile.ZipFile(where, "w") as z:
        z.write(snap, MEMBER)
    os.utime(where, (mtime, mtime))


def test_it_pulls_mains_own_snapshot_and_why_last_judges_against_it(laptop, tmp_path):
    state_dir = tmp_path / "state"
    _snapshot_zip(state_dir, "500", "failed", 1_700_000_000)  # main's: test_b fails there
    _snapshot_zip(state_dir, "600", "passed", 1_700_000_500)  # a fork's `main`, newer
    _snapshot_zip(state_dir, "700", "passed", 1_700_000_900)  # a PR branch's, newest
    with fake_github() as (api, gh):
        gh.artifacts = state_dir / "artifacts"
        gh.artifact_runs = {
            "500": {"head_branch": "main", "head_sha": "5" * 40, "repository_id": OURS, "head_repository_id": OURS},
            "600": {"head_branch": "main", "head_sha": "6" * 40, "repository_id": OURS, "head_repository_id": 99},
            "700": {"head_branch": "feature", "head_sha": "7" * 40, "repository_id": OURS,
                    "head_repository_id": OURS}}
        dry = run_ci("history", "pull", "--root", str(laptop), "--dry-run", env=_env(**env_for(api)))
        assert dry.returncode == 0 and "would download artifact" in dry.stdout, dry.stdout + dry.stderr
        assert not (laptop / SNAPSHOT_FILE).exists(), "--dry-run wrote the snapshot"
        pulled = run_ci("history", "pull", "--root", str(laptop), env=_env(**env_for(api)))
        assert pulled.returncode == 0, pulled.stdout + pulled.stderr
        assert "2 trusted runs of main" in pulled.stdout and "of run 500" in pulled.stdout, pulled.stdout
        assert not any(r["path"].startswith("/repos/acme/slime/actions/artifacts/") and "zip" in r["path"]
                       and not r["path"].endswith(f"/{_id_of(gh, '500')}/zip") for r in gh.requests), gh.calls
    try:
        why = run_ci("why", "--last", "--json", "--root", str(laptop), env=_env())
        assert why.returncode == 0, why.stdout + why.stderr
        assert {v["entry_id"]: v["kind"] for v in json.loads(why.stdout)} == WANTED
    finally:
        (laptop / SNAPSHOT_FILE).unlink()


def _id_of(gh, run: str) -> int:
    return next(i for i, r, _ in gh.artifact_files() if r == run)


def test_the_download_follows_githubs_redirect_to_a_signed_url_without_the_token(laptop, tmp_path):
    """GitHub answers the zip download with a 302 to a signed address on another host (its blob
    storage, which refuses a request carrying an Authorization header): the pull follows that
    one redirect, and the token goes to the API's origin only. Two loopback servers, two ports."""
    state_dir = tmp_path / "state"
    _snapshot_zip(state_dir, "500", "failed", 1_700_000_000)
    try:
        with fake_github() as (api, gh), serve_blobs(gh) as blobs:
            gh.artifacts = state_dir / "artifacts"
            gh.artifact_runs = {"500": {"head_branch": "main", "head_sha": "5" * 40, "repository_id": OURS,
                                        "head_repository_id": OURS}}
            gh.blob_url = blobs
            assert blobs.rsplit(":", 1)[1] != api.rsplit(":", 1)[1], "the blob host is another origin"
            pulled = run_ci("history", "pull", "--root", str(laptop), env=_env(**env_for(api)))
            assert pulled.returncode == 0, pulled.stdout + pulled.stderr
            assert "2 trusted runs of main" in pulled.stdout, pulled.stdout
            assert [r["path"] for r in gh.requests if r["path"].endswith("/zip")] == [
                f"/repos/acme/slime/actions/artifacts/{_id_of(gh, '500')}/zip"]
            [blob] = gh.blob_requests
            assert blob["path"].startswith(f"/artifacts/{_id_of(gh, '500')}.zip?sig=signed-"), blob
            assert blob["authorization"] == "" and TOKEN not in json.dumps(gh.blob_requests), (
                "the token went to the signed URL's host")
            # A redirect to a scheme other than https (or the API's own) is not followed.
            (laptop / SNAPSHOT_FILE).unlink()
            gh.blob_url = "ftp://127.0.0.1:21"
            refused = run_ci("history", "pull", "--root", str(laptop), env=_env(**env_for(api)))
            assert refused.returncode == 4 and refused.stderr.count("\n") == 1, refused.stderr
            assert "with a redirect to ftp:// that is not https; not followed" in refused.stderr, refused.stderr
            assert not (laptop / SNAPSHOT_FILE).exists() and len(gh.blob_requests) == 1
    finally:
        (laptop / SNAPSHOT_FILE).unlink(missing_ok=True)


def test_no_network_and_no_snapshot_is_one_line_and_why_last_still_exits_0(laptop, tmp_path):
    env = _env(GITHUB_TOKEN="t", GITHUB_REPOSITORY="acme/slime", GITHUB_API_URL="http://127.0.0.1:9")
    pulled = run_ci("history", "pull", "--root", str(laptop), env=env)
    assert pulled.returncode == 4 and pulled.stderr.count("\n") == 1, pulled.stderr
    assert "could not be reached" in pulled.stderr and not (laptop / SNAPSHOT_FILE).exists()
    why = run_ci("why", "--last", "--root", str(laptop), env=_env())
    assert why.returncode == 0 and why.stdout.count("\n") == 1 and "history pull" in why.stdout, why.stdout


def test_no_artifact_or_a_bad_one_writes_nothing(laptop, tmp_path):
    with fake_github() as (api, gh):
        none = run_ci("history", "pull", "--root", str(laptop), env=_env(**env_for(api)))
        assert none.returncode == 4 and f"no artifact {SNAPSHOT_ARTIFACT}" in none.stderr, none.stderr
        bad = tmp_path / "artifacts" / "800" / f"{SNAPSHOT_ARTIFACT}.zip"
        bad.parent.mkdir(parents=True)
        with zipfile.ZipFile(bad, "w") as z:
            z.writestr(MEMBER, b"not a database" * 100)
        gh.artifacts = tmp_path / "artifacts"
        gh.artifact_runs = {"800": {"head_branch": "main", "repository_id": OURS, "head_repository_id": OURS}}
        refused = run_ci("history", "pull", "--root", str(laptop), env=_env(**env_for(api)))
    assert refused.returncode == 4 and refused.stderr.count("\n") == 1, refused.stderr
    assert "is no snapshot" in refused.stderr and not (laptop / SNAPSHOT_FILE).exists()
    assert not list((laptop / ".ci-cache").glob(".*.tmp")), "a rejected download was left behind"
    token = run_ci("history", "pull", "--root", str(laptop), env=_env())
    assert token.returncode == 2 and "GITHUB_TOKEN" in token.stderr and token.stderr.count("\n") == 1


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
