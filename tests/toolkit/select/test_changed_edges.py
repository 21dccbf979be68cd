"""`changed` at its edges, on real git repositories: no git, a broken repository, a test file
missing from the work tree, odd bases, defaults and the command line, all in-process."""

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _gitrepo import Clone, git, pytest_file

from ci.errors import UsageError
from ci.registry import Entry, Suite
from ci.registry.loader import Registry
from ci.select.changed import changed_entries, main, select_changed
from ci.select.discover import MAX_SOURCE_BYTES

NUM_GPUS = 0

MAIN_FILES = {
    "pyproject.toml": "[project]\nname = 'x'\n",
    "slime/__init__.py": "",
    "slime/core.py": "def f():\n    return 1\n",
    "tests/test_core.py": pytest_file(body="from slime.core import f"),
    "tests/test_other.py": pytest_file(),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """main pushed to origin; `feature` checked out, one commit ahead with a new test file."""
    clone = Clone.on_feature_branch(tmp_path_factory.mktemp("template"), MAIN_FILES)
    clone.commit("feature", {"tests/test_new.py": pytest_file("NUM_GPUS = 2")})
    return clone


@pytest.fixture
def repo(template: Clone, tmp_path: Path) -> Clone:
    return Clone.copy_of(template, tmp_path)


def quiet(_: str) -> None:
    pass


# --- no git -------------------------------------------------------------------------------


@pytest.fixture
def fresh_gitpython() -> Iterator[None]:
    """GitPython imported anew by the code under test; the loaded one put back afterwards."""
    saved = {k: v for k, v in sys.modules.items() if k == "git" or k.startswith("git.")}
    for k in saved:
        del sys.modules[k]
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == "git" or k.startswith("git.")]:
            del sys.modules[k]
        sys.modules.update(saved)


def test_without_a_git_executable_one_line_says_install_git(
        repo: Clone, tmp_path: Path, fresh_gitpython: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real import of GitPython with no git on PATH: it raises ImportError with a page of text.
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("GIT_PYTHON_GIT_EXECUTABLE", raising=False)
    monkeypatch.delenv("GIT_PYTHON_REFRESH", raising=False)
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, warn=quiet)
    assert str(err.value) == ("cannot use git (Failed to initialize: Bad git executable.); "
                              "install git and `pip install GitPython`")


def test_without_gitpython_in_process_names_the_profile(
        repo: Clone, fresh_gitpython: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "git", None)  # as if GitPython were not installed
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, warn=quiet)
    assert str(err.value) == ("GitPython is not installed: pip install 'slime-ci[git]' "
                              "(or pip install GitPython)")


def test_a_missing_module_inside_gitpython_is_not_reported_as_gitpython_missing(
        repo: Clone, fresh_gitpython: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # A broken GitPython install (one of its own modules gone) is a bug to show, not "install it".
    monkeypatch.setitem(sys.modules, "git.exc", None)
    with pytest.raises(ModuleNotFoundError):
        changed_entries(repo.root, warn=quiet)


# --- a broken repository -------------------------------------------------------------------


def _drop_object(clone: Clone, sha: str) -> None:
    loose = clone.root / ".git" / "objects" / sha[:2] / sha[2:]
    assert loose.is_file(), "the object must be loose for this test"
    loose.unlink()


def test_unreadable_tree_is_one_line_with_gits_own_words(repo: Clone) -> None:
    tree = repo.git("rev-parse", "HEAD^{tree}")
    _drop_object(repo, tree)
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, warn=quiet)
    message = str(err.value)
    assert message.startswith("git failed: fatal: ")
    assert "\n" not in message
    assert "stderr" not in message and "'" not in message


def test_base_git_cannot_resolve_says_why_in_gits_words(repo: Clone) -> None:
    # `--base @{upstream}` on a branch without one: rev-parse fails (128), it is not "missing".
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, base="@{upstream}")
    assert str(err.value) == "git failed: fatal: no upstream configured for branch 'feature'"


def test_corrupt_head_commit_is_named_by_gits_last_line(repo: Clone) -> None:
    head = repo.git("rev-parse", "HEAD")
    loose = repo.root / ".git" / "objects" / head[:2] / head[2:]
    loose.chmod(0o644)
    loose.write_bytes(b"not a zlib stream")  # git prints two "error:" lines, then the "fatal:"
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, warn=quiet)
    assert str(err.value) == (f"git failed: fatal: loose object {head} (stored in "
                              f".git/objects/{head[:2]}/{head[2:]}) is corrupt")


# --- a test file missing from the work tree ------------------------------------------------


def test_file_deleted_from_the_work_tree_is_read_from_the_commit(repo: Clone) -> None:
    deep = "tests/utils/deep/test_deep.py"  # folders below tests/ too
    repo.commit("deep file", {deep: pytest_file("NUM_GPUS = 4")})
    for rel in ("tests/test_new.py", deep):
        (repo.root / rel).unlink()  # deleted, not committed
    plan = select_changed(repo.root, warn=pytest.fail)
    assert [(e.path, e.num_gpus, e.kind, e.why) for e in plan.entries] == [
        ("tests/test_new.py", 2, "pytest", "added"), (deep, 4, "pytest", "added")]


def test_committed_blob_that_is_not_utf8_is_judged_as_the_work_tree_would(repo: Clone) -> None:
    # The same bytes in the work tree say "not UTF-8"; the commit's copy must say the same,
    # not decode leniently and trust the NUM_GPUS it then finds.
    raw = b"NUM_GPUS = 1\n# caf\xe9\n\ndef test_it():\n    pass\n"
    (repo.root / "tests/test_latin1.py").write_bytes(raw)
    repo.commit("latin-1 file")
    warned: list[str] = []
    on_disk = {e.path: e.num_gpus for e in changed_entries(repo.root, warn=warned.append)}
    (repo.root / "tests/test_latin1.py").unlink()
    from_blob = {e.path: e.num_gpus for e in changed_entries(repo.root, warn=warned.append)}
    assert on_disk == from_blob == {"tests/test_latin1.py": 8, "tests/test_new.py": 2}
    assert warned == ["tests/test_latin1.py: the file is not UTF-8; running it on 8 GPUs "
                      "(`python -m ci audit` stops such files from landing)"] * 2


def test_committed_blob_over_the_size_cap_is_refused_as_on_disk(repo: Clone) -> None:
    big = pytest_file("NUM_GPUS = 1") + "#" * (MAX_SOURCE_BYTES + 10) + "\n"
    repo.commit("huge file", {"tests/test_huge.py": big})
    (repo.root / "tests/test_huge.py").unlink()
    warned: list[str] = []
    entries = {e.path: e.num_gpus for e in changed_entries(repo.root, warn=warned.append)}
    assert entries["tests/test_huge.py"] == 8
    assert warned == ["tests/test_huge.py: the file does not parse; running it on 8 GPUs "
                      "(`python -m ci audit` stops such files from landing)"]


def test_undeclared_file_imported_by_a_change_warns_and_keeps_the_timeout(repo: Clone) -> None:
    # --affected reaches tests/test_core.py through slime/core.py; it declares no NUM_GPUS.
    repo.commit("touch core and undeclare", {
        "slime/core.py": "def f():\n    return 2\n",
        "tests/test_core.py": pytest_file(None, body="from slime.core import f")})
    repo.git("push", "--quiet", "origin", "feature:main")
    repo.git("fetch", "--quiet", "origin")
    repo.commit("core again", {"slime/core.py": "def f():\n    return 3\n"})
    warned: list[str] = []
    entries = changed_entries(repo.root, affected=True, timeout=77.0, warn=warned.append)
    assert [(e.path, e.num_gpus, e.timeout, e.why) for e in entries] == [
        ("tests/test_core.py", 8, 77.0, "imports slime.core")]
    assert warned == ["tests/test_core.py: no module-level `NUM_GPUS = <int>`; declare how many GPUs "
                      "the file needs; running it on 8 GPUs (`python -m ci audit` stops such files "
                      "from landing)"]


# --- bases ----------------------------------------------------------------------------------


def test_missing_base_with_slashes_in_the_branch_names_the_whole_branch(repo: Clone) -> None:
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, base="origin/release/v1")
    assert str(err.value) == "base 'origin/release/v1' does not exist here: run git fetch origin release/v1"


def test_missing_bare_remote_name_is_not_taken_for_a_missing_remote(repo: Clone) -> None:
    with pytest.raises(UsageError) as err:
        changed_entries(repo.root, base="origin")
    assert str(err.value) == ("base 'origin' does not exist here: fetch it, or pass --base <ref> "
                              "(default origin/main)")


def test_missing_base_in_a_shallow_clone_says_how_to_check_out(repo: Clone, tmp_path: Path) -> None:
    repo.git("push", "--quiet", "origin", "feature")
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "--quiet", "--depth", "1", "--branch", "feature",
        repo.origin.as_uri(), str(shallow))
    with pytest.raises(UsageError) as err:
        changed_entries(shallow, base="origin/nope")
    assert str(err.value) == ("base 'origin/nope' does not exist here: run git fetch origin nope; "
                              "this clone is shallow: in Actions, check out with fetch-depth: 0")


# --- defaults and what the plan records -----------------------------------------------------


def test_plan_defaults_an_hour_each_and_no_importers(repo: Clone) -> None:
    repo.commit("touch core", {"slime/core.py": "def f():\n    return 2\n"})
    plan = select_changed(repo.root, warn=pytest.fail)
    assert [(e.path, e.timeout) for e in plan.entries] == [("tests/test_new.py", 3600.0)]
    assert plan.head == repo.git("rev-parse", "HEAD")
    assert plan.merge_base == repo.git("rev-parse", "origin/main")
    assert plan.base == "origin/main"
    assert [(e.path, e.timeout) for e in changed_entries(repo.root, warn=pytest.fail)] == [
        ("tests/test_new.py", 3600.0)]


def test_every_global_file_is_named_in_the_reason(repo: Clone) -> None:
    repo.commit("packaging and sessions", {"pyproject.toml": "# v2\n", "noxfile.py": "# v2\n"})
    whys = {e.why for e in changed_entries(repo.root, affected=True, warn=pytest.fail)
            if e.path != "tests/test_new.py"}
    assert whys == {"affects everything (noxfile.py, pyproject.toml)"}


def test_the_registry_given_decides_the_whole_tier(repo: Clone) -> None:
    # The session passes its registry; it wins over the checkout's own.
    repo.commit("packaging", {"pyproject.toml": "# v2\n"})
    only_other = Registry(name="given.py", suites=(
        Suite(name="cpu_unit", tier="cpu", purpose="p", profile="cpu",
              entries=(Entry(path="tests/test_other.py"),)),))
    entries = changed_entries(repo.root, affected=True, warn=pytest.fail, registry=only_other)
    assert [e.path for e in entries] == ["tests/test_new.py", "tests/test_other.py"]


# --- the command line, in-process ----------------------------------------------------------


def test_cli_defaults_to_the_current_directory(repo: Clone, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(repo.root)
    assert main([]) == 0
    assert "tests/test_new.py" in capsys.readouterr().out


def test_cli_base_and_affected_reach_the_plan(repo: Clone, capsys: pytest.CaptureFixture[str]) -> None:
    repo.git("branch", "start")
    repo.commit("touch core", {"slime/core.py": "def f():\n    return 2\n"})
    assert main(["--root", str(repo.root), "--base", "start", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "[]"
    assert main(["--root", str(repo.root), "--base", "start", "--affected", "--json"]) == 0
    assert '"path": "tests/test_core.py"' in capsys.readouterr().out


def test_cli_refuses_a_registry_that_does_not_load(repo: Clone) -> None:
    # `nox -s changed` plans with the checkout's registry: a broken one is bad input at once,
    # whether or not this diff would have needed it.
    repo.commit("broken registry", {".slime-ci/suites.py": "SUITES = (\n"})
    with pytest.raises(UsageError, match=r"\.slime-ci/suites\.py: cannot load the registry"):
        main(["--root", str(repo.root)])


def test_cli_bad_root_and_bad_flag_name_themselves(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        main(["--root", str(tmp_path / "gone")])
    assert str(err.value) == f"--root {tmp_path / 'gone'}: does not exist; pass the repository root"
    with pytest.raises(UsageError) as flag:
        main(["--bogus"])
    assert str(flag.value) == "unrecognized arguments: --bogus (see `python -m ci changed --help`)"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
