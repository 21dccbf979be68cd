"""Whether a run's head is on the default branch, read from a real clone's commit graph, and what
the ingest job makes of it: a pushed tag named `main` reports `head_branch: main` as well.

Real git repositories (a bare origin, a clone as the ingest job checks it out) and real
`python -m ci history ingest` processes on SQLite and PostgreSQL; the `workflow_run` payload is
a file written here (GitHub's own cannot exist in a test).
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci
from _gitrepo import Clone, git

from ci.errors import UsageError
from ci.history.on_branch import on_branch
from ci.history.store import open_store

NUM_GPUS = 0
UID = "0123456789abcdef0123456789abcdef"


class Graph:
    """origin: `main` of two commits; a commit of no branch, pushed only as the tag `main`."""

    def __init__(self, base: Path) -> None:
        writer = Clone.on_feature_branch(base, {"README.md": "one\n"})
        writer.git("checkout", "--quiet", "main")
        self.first = writer.git("rev-parse", "HEAD")
        self.head = writer.commit("two", {"README.md": "two\n"})
        writer.git("push", "--quiet", "origin", "main")
        writer.git("checkout", "--quiet", "--detach")
        self.tagged = writer.commit("not reviewed", {"run.sh": "echo unreviewed\n"})
        writer.git("push", "--quiet", "origin", f"{self.tagged}:refs/tags/main")
        # The ingest job's checkout: the branch in full, its whole graph, no old files' bytes.
        self.checkout = base / "ingest"
        git(base, "clone", "--quiet", "--filter=blob:none", f"file://{writer.origin}", str(self.checkout))
        git(self.checkout, "checkout", "--quiet", "-B", "main", "refs/remotes/origin/main")
        self.origin = writer.origin


@pytest.fixture(scope="module")
def graph(tmp_path_factory: pytest.TempPathFactory) -> Graph:
    return Graph(tmp_path_factory.mktemp("graph"))


def test_only_the_branchs_own_commits_are_on_it(graph: Graph) -> None:
    assert git(graph.checkout, "rev-parse", "refs/tags/main") == graph.tagged  # the tag is there
    assert on_branch(graph.checkout, graph.head, "main")
    assert on_branch(graph.checkout, graph.first, "main")  # an ancestor: reviewed, merged code
    assert not on_branch(graph.checkout, graph.tagged, "main")  # what `git rev-parse main` names
    assert not on_branch(graph.checkout, "ab" * 20, "main")  # a commit this clone never saw
    for name in ("main", graph.head[:12], f"--output={graph.head}"):  # names, short or crafted
        assert not on_branch(graph.checkout, name, "main")


def test_a_checkout_that_cannot_tell_is_an_error_not_a_guess(graph: Graph, tmp_path: Path) -> None:
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "--quiet", "--depth", "1", f"file://{graph.origin}", str(shallow))
    with pytest.raises(UsageError, match=r"shallow clone.*fetch-depth: 0"):
        on_branch(shallow, graph.head, "main")
    with pytest.raises(UsageError, match="no branch 'trunk'"):
        on_branch(graph.checkout, graph.head, "trunk")
    (tmp_path / "plain").mkdir()
    with pytest.raises(UsageError, match="is not a git checkout"):
        on_branch(tmp_path / "plain", graph.head, "main")


# --- the ingest job: trust from the commit graph and our workflow file, never from a name -------

def _record(commit: str) -> dict[str, Any]:
    now = time.time()
    return {"uid": UID, "suite": "train", "commit": commit, "branch": "main", "event": "push",
            "host": "h", "runner": "r", "backend": "docker", "hardware": "cuda",
            "started_at": now - 60, "ended_at": now - 1, "exit_code": 0, "trusted": False, "pr": None,
            "attempts": [{"entry_id": "tests/test_ok.py", "path": "tests/test_ok.py", "attempt": 1,
                          "final": True, "outcome": "passed", "passed": 1, "failed": 0, "skipped": 0,
                          "num_gpus": 1, "devices": "0", "node": "", "seconds": 3.5, "reason": "",
                          "exit_code": 0}],
            "metrics": []}


def _push_event(head_sha: str, workflow: str = ".github/workflows/pr-test.yml") -> dict[str, Any]:
    return {"workflow_run": {"id": 9, "path": workflow, "event": "push", "head_branch": "main",
                             "head_sha": head_sha, "head_repository": {"full_name": "o/r"},
                             "pull_requests": [], "display_title": "x"},
            "repository": {"full_name": "o/r", "default_branch": "main"}}


def _ingest(tmp_path: Path, graph: Graph, url: str, record: dict[str, Any],  # type: ignore[no-untyped-def]
            event: dict[str, Any]):
    artifacts = tmp_path / "downloaded" / "history-train"
    artifacts.mkdir(parents=True, exist_ok=True)
    (artifacts / f"{UID}.json").write_text(json.dumps(record))
    (tmp_path / "event.json").write_text(json.dumps(event))
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")}
    env.update(GITHUB_OUTPUT=str(tmp_path / "outputs"), SLIME_CI_HISTORY_URL="")
    return run_ci("history", "ingest", str(tmp_path / "downloaded"), "--event-file",
                  str(tmp_path / "event.json"), "--history", url, "--root", str(graph.checkout), env=env)


def _stored(url: str) -> list[tuple[bool, str]]:
    with open_store(url, create=False) as store:
        return [(r.trusted, r.commit) for r in store.runs()]


def test_a_tag_pushed_as_main_records_untrusted_runs(graph: Graph, tmp_path: Path, store_url: str) -> None:
    """The tag's run reports `head_branch: main` and ran the test workflow's name, with a
    hand-written artifact: it is recorded (it ran), but never as a baseline."""
    done = _ingest(tmp_path, graph, store_url, _record(graph.tagged), _push_event(graph.tagged))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"not trusted, its head {graph.tagged[:12]} is not on main" in done.stderr
    assert (tmp_path / "outputs").read_text().splitlines() == ["trusted=0"]  # no snapshot refresh
    assert _stored(store_url) == [(False, graph.tagged)]


def test_mains_own_run_is_trusted_and_only_for_its_own_commit(graph: Graph, tmp_path: Path,
                                                              store_url: str) -> None:
    other = _ingest(tmp_path, graph, store_url, _record(graph.first), _push_event(graph.head))
    assert other.returncode == 2 and other.stderr.count("\n") == 1, other.stderr
    assert f"the run names commit '{graph.first[:12]}'" in other.stderr  # not the commit that ran
    done = _ingest(tmp_path, graph, store_url, _record(graph.head), _push_event(graph.head))
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "outputs").read_text().splitlines() == ["trusted=1"]
    assert _stored(store_url) == [(True, graph.head)]


def test_another_workflow_file_of_the_same_name_is_never_trusted(graph: Graph, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    done = _ingest(tmp_path, graph, url, _record(graph.head),
                   _push_event(graph.head, workflow=".github/workflows/copy.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "not trusted, it ran '.github/workflows/copy.yml', not our .github/workflows/pr-test.yml" \
        in done.stderr
    assert _stored(url) == [(False, graph.head)]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
