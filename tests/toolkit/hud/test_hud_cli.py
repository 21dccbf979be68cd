"""`python -m ci hud` as a user runs it: a site from a store on SQLite and on a real PostgreSQL
server, the PR pages with --include-prs only, and one-line errors for bad input."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
import _hud_history as planted
from _ci import REPO, run_ci

from ci.history.job_times import JobTime, record_job_times
from ci.history.store import open_store

NUM_GPUS = 0


def test_a_site_from_either_store_with_the_pr_pages_apart(store_url, tmp_path):
    planted.plant(store_url)
    with open_store(store_url) as store:  # two PR runs' jobs, as the ingest job records them
        record_job_times(store, [
            JobTime(gh_run_id=run, gh_run_attempt=1, job=name, event="pull_request", commit="f" * 40, pr=7,
                    trusted=False, hosted=hosted, conclusion="success", started_at=1e9, completed_at=1e9 + secs)
            for run, slowest in (("1", 300.0), ("2", 420.0))
            for name, hosted, secs in (("toolkit (shard 1/3)", True, slowest), ("cpu_unit", True, 120.0),
                                       ("megatron", False, 3000.0))])
    out = tmp_path / "site"
    proc = run_ci("hud", "--out", str(out), "--history", store_url, "--root", str(REPO), "--include-prs",
                  env={"GITHUB_REPOSITORY": "acme/slime"})
    assert proc.returncode == 0, proc.stderr
    assert "hud: " in proc.stdout and "from 362 attempts" in proc.stdout
    for rel in ("index.html", "gpu.html", "hud.css", "p/7.html"):
        assert (out / rel).is_file(), rel
    index = (out / "index.html").read_text(encoding="utf-8")
    assert '<a href="p/7.html">#7</a>' in index
    # What PR authors waited for: the slowest hosted job of each run (not the GPU job).
    assert ("wait of the last 2 pull_request run(s): median 6.0 min, p90 7.0 min, worst 7.0 min; "
            "slowest most often: toolkit (shard 1/3)") in index
    assert "f" * 40 not in index  # the PR's commit is never a row of main's grid
    pr = (out / "p" / "7.html").read_text(encoding="utf-8")
    # The verdict table of its latest run: test_a passes on main, so its failure is new.
    assert "<td>tests/test_a.py</td><td>failed</td>" in pr and "<td>new <code>new</code></td>" in pr
    assert "<td>tests/test_flaky.py</td><td>passed</td>" in pr and "1 entry did not pass" in pr
    _entries, cells = planted.grid_cells(index)
    assert len(cells) == 400


def test_without_include_prs_no_pr_page_is_written_and_a_rebuild_replaces_the_site(tmp_path):
    url = planted.store_url(tmp_path)
    planted.plant(url)
    out = tmp_path / "site"
    out.mkdir()
    (out / "stale.html").write_text("from an older build")
    proc = run_ci("hud", "--out", str(out), "--history", url, "--root", str(REPO), "--commits", "5",
                  env={"GITHUB_REPOSITORY": ""})
    assert proc.returncode == 0, proc.stderr
    assert not (out / "p").exists() and not (out / "stale.html").exists()
    index = (out / "index.html").read_text(encoding="utf-8")
    # Five rows, newest first; without a repository a commit is plain text, not a link.
    assert index.count("<tr><th><code>") == 5 and "https://github.com" not in index
    assert index.index(planted.sha(49)[:10]) < index.index(planted.sha(45)[:10])
    assert f"<tr><th><code>{planted.sha(44)[:10]}" not in index


@pytest.mark.parametrize(("args", "says", "code"), [
    (["--commits", "0"], "--commits and --last-runs must be at least 1", 2),
    (["--repo", "no-slash"], "--repo 'no-slash': give OWNER/NAME", 2),
    (["--history", "off"], "--history off: the HUD has no store to read", 2),
    ([], "no history store at", 4),
])
def test_bad_input_is_one_line_and_its_exit_code(tmp_path, args, says, code):
    argv = ["hud", "--out", str(tmp_path / "site"), "--root", str(tmp_path)]
    if "--history" not in args:
        argv += ["--history", f"sqlite:///{tmp_path / 'none.sqlite'}"]
    proc = run_ci(*argv, *args)
    assert proc.returncode == code, proc.stderr
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "site").exists() and not (tmp_path / "none.sqlite").exists()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
