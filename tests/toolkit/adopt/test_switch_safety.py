"""`slime-ci adopt` never writes outside the repository and never overwrites uncommitted edits.

A real git repository in tmp_path, shaped like slime's (a template, U's command_utils.py,
the template's generator), adopted by `python -m ci adopt` as a process: symbolic links
planted where adopt writes (`.slime-ci`, `slime`, `noxfile.py`, the temporary name of a
write) are refused in one line with exit 2 and nothing written, or never written through;
a file with uncommitted edits is kept and named, until it is committed or --force.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci
from _gitrepo import git

NUM_GPUS = 0

TEMPLATE = """\
<% set jobs = {
    'cpu-unittest': {'always': True, 'cpu': True, 'tests': [{'test_file': 'test_a.py', 'num_gpus': 0}]},
    'e2e-test-megatron': {'label': 'run-ci-megatron', 'tests': [{'test_file': 'test_e2e.py', 'num_gpus': 4}]},
} %>
name: PR Test
jobs:
<% for job_name, config in jobs.items() %>
  << job_name >>:
    runs-on: ubuntu-latest
<% endfor %>
"""
U_FILE = "slime/utils/external_utils/command_utils.py"
GENERATOR = ".github/workflows/generate_github_workflows.py"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    files = {".github/workflows/pr-test.yml.j2": TEMPLATE, GENERATOR: "print('render')\n",
             U_FILE: "# the original helpers\n", "slime/__init__.py": "",
             "tests/test_a.py": "NUM_GPUS = 0\n\ndef test_a():\n    assert True\n",
             "tests/test_e2e.py": "NUM_GPUS = 4\n\nif __name__ == '__main__':\n    print('train')\n"}
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))
    git(root.parent, "init", "-q", "-b", "main", str(root))
    git(root, "add", "-A")
    git(root, "commit", "-qm", "slime")
    return root


def _adopt(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_ci("adopt", str(root), "--toolkit-requirement", "slime-ci==0.1.0", *args, timeout=120)


def _untouched(root: Path) -> None:
    assert git(root, "status", "--porcelain", "--untracked-files=all") == ""


@pytest.mark.parametrize("linked", [".slime-ci", "slime", "slime/utils", "noxfile.py", ".github"])
def test_a_symbolic_link_where_adopt_writes_is_refused_and_nothing_is_written(
        repo: Path, tmp_path: Path, linked: str) -> None:
    outside = tmp_path / "outside"
    if linked in ("slime", "slime/utils", ".github"):  # the repository's own folder, moved out
        (repo / linked).rename(outside)
    elif linked == "noxfile.py":
        outside.write_text("# someone else's file\n")
    else:
        outside.mkdir()
    before = sorted(p.relative_to(outside) for p in outside.rglob("*")) if outside.is_dir() else None
    (repo / linked).symlink_to(outside)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "a link")
    done = _adopt(repo)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and "is a symbolic link" in done.stderr, done.stderr
    assert f"error: {linked} is a symbolic link" in done.stderr and "Traceback" not in done.stderr
    _untouched(repo)
    if before is not None:
        assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
    else:
        assert outside.read_text() == "# someone else's file\n"


def test_a_planted_temporary_name_is_never_written_through(repo: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    for name in (".noxfile.py.adopt-tmp", ".suites.py.adopt-tmp"):
        (repo / ".slime-ci").mkdir(exist_ok=True)
        where = repo / (name if name.startswith(".noxfile") else f".slime-ci/{name}")
        where.symlink_to(victim)
    done = _adopt(repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert victim.read_text() == "precious\n"
    assert not (repo / "noxfile.py").is_symlink() and "register(__file__" in (repo / "noxfile.py").read_text()
    assert not (repo / ".slime-ci/suites.py").is_symlink()


def test_uncommitted_edits_are_kept_and_named_until_committed_or_forced(repo: Path) -> None:
    (repo / U_FILE).write_text("# my uncommitted fix\n")
    (repo / GENERATOR).write_text("print('my uncommitted change')\n")
    done = _adopt(repo)
    assert done.returncode == 0, done.stderr
    for rel in (U_FILE, GENERATOR):
        assert f"adopt: kept {rel} (it has uncommitted edits: commit or stash them" in done.stdout, done.stdout
    assert (repo / U_FILE).read_text() == "# my uncommitted fix\n"
    assert (repo / GENERATOR).read_text() == "print('my uncommitted change')\n"
    assert f"adopt: wrote {U_FILE}" not in done.stdout and "adopt: removed" not in done.stdout
    assert "adopt: wrote noxfile.py" in done.stdout  # everything else goes on as before
    dry = _adopt(repo, "--dry-run", "--force")
    assert f"adopt: would write {U_FILE}" in dry.stdout and (repo / U_FILE).read_text() == "# my uncommitted fix\n"
    git(repo, "add", U_FILE, GENERATOR)
    git(repo, "commit", "-qm", "my edits")
    again = _adopt(repo)
    assert f"adopt: wrote {U_FILE}" in again.stdout and f"adopt: removed {GENERATOR}" in again.stdout, again.stdout
    assert "the original helpers" not in (repo / U_FILE).read_text()


def test_edits_it_cannot_see_are_never_overwritten(repo: Path) -> None:
    (repo / ".git" / "HEAD").write_text("garbage\n")  # git can no longer tell what changed
    before = {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts}
    done = _adopt(repo)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stdout + done.stderr
    assert "git status in" in done.stderr and "adopt will not overwrite edits it cannot see" in done.stderr
    assert {p: p.read_bytes() for p in repo.rglob("*") if p.is_file() and ".git" not in p.parts} == before


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
