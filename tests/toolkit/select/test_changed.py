"""`changed`: which test files a branch adds, modifies or renames, on real git repositories."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO
from _gitrepo import Clone, git, pytest_file

from ci.errors import UsageError
from ci.select.changed import (
    ChangedSelection,
    changed_entries,
    format_table,
    main,
    parse_name_status,
    select_changed,
)
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0


GPU_SCRIPT = (
    "NUM_GPUS = 4\n\n\ndef prepare():\n    pass\n\n\ndef execute():\n    pass\n\n\n"
    'if __name__ == "__main__":\n    prepare()\n    execute()\n'
)

MAIN_FILES = {
    "pyproject.toml": "[project]\nname = 'x'\n",
    "README.md": "hello\n",
    "slime/__init__.py": "",
    "tests/test_keep.py": pytest_file(),
    "tests/test_modify.py": pytest_file(),
    "tests/test_delete.py": pytest_file(),
    "tests/test_old_name.py": pytest_file(body="VALUE = 'renamed without edits'"),
    "tests/e2e/test_gpu.py": GPU_SCRIPT,
}

FEATURE_FILES = {
    "tests/test_modify.py": pytest_file(body="EXTRA = 1"),
    "tests/utils/deep/er/test_deep.py": pytest_file("NUM_GPUS: int = 2"),
    "tests/test with spaces/test_my file.py": pytest_file(),
    "tests/test_undeclared.py": pytest_file(None),
    # Never test files, whatever the glob of the original thought:
    "tests/test_agent/_fakes.py": "NUM_GPUS = 0\n",
    "tests/test_agent/__init__.py": "",
    "tests/conftest.py": "",
    "tests/test_agent/conftest.py": "",
    "tests/test_agent/helper_test.py": "",
    "tests/test_data.json": "{}",
    "test_top.py": pytest_file(),
    "slime/test_inside.py": "",
}

EXPECTED = {
    "tests/test_modify.py": (0, "edited"),
    "tests/utils/test_new_name.py": (0, "renamed from tests/test_old_name.py"),
    "tests/utils/deep/er/test_deep.py": (2, "added"),
    "tests/test with spaces/test_my file.py": (0, "added"),
    "tests/test_undeclared.py": (8, "added"),
}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    """main pushed to origin; branch `feature` checked out with every kind of change."""
    clone = Clone.on_feature_branch(tmp_path_factory.mktemp("template"), MAIN_FILES)
    clone.git("rm", "--quiet", "tests/test_delete.py")
    clone.move("tests/test_old_name.py", "tests/utils/test_new_name.py")
    clone.commit("feature", FEATURE_FILES)
    return clone


@pytest.fixture
def repo(template: Clone, tmp_path: Path) -> Clone:
    """A private copy of the template, free to change."""
    return Clone.copy_of(template, tmp_path)


def selection(root: Path, **kwargs: object) -> dict[str, tuple[int, str]]:
    warnings: list[str] = []
    entries = changed_entries(root, warn=warnings.append, **kwargs)  # type: ignore[arg-type]
    return {e.path: (e.num_gpus, e.why) for e in entries}


def test_selects_added_modified_renamed_and_never_helpers(repo: Clone) -> None:
    warnings: list[str] = []
    entries = changed_entries(repo.root, warn=warnings.append, timeout=123.0)
    assert {e.path: (e.num_gpus, e.why) for e in entries} == EXPECTED
    assert [e.path for e in entries] == sorted(EXPECTED)
    assert all(e.id == e.path and e.timeout == 123.0 and e.test_args == () for e in entries)
    assert {e.kind for e in entries} == {"pytest"}
    # The undeclared file runs on 8 GPUs, and the warning names it.
    assert len(warnings) == 1
    assert "tests/test_undeclared.py" in warnings[0]
    assert "8 GPUs" in warnings[0]


def test_changes_on_main_are_never_selected(repo: Clone) -> None:
    # main moves on after the branch point: a two-dot diff would list its edits.
    repo.git("checkout", "--quiet", "main")
    repo.commit("main moves", {"tests/test_keep.py": pytest_file(body="MAIN = 1"),
                               "tests/test_from_main.py": pytest_file()})
    repo.git("push", "--quiet", "origin", "main")
    repo.git("checkout", "--quiet", "feature")
    assert selection(repo.root) == EXPECTED
    # ... and after merging main into the branch.
    repo.git("merge", "--quiet", "--no-edit", "origin/main")
    assert (repo.root / "tests/test_from_main.py").exists()
    assert selection(repo.root) == EXPECTED


def test_detached_head_selects_the_same(repo: Clone) -> None:
    repo.git("checkout", "--quiet", "--detach", "HEAD")
    assert selection(repo.root) == EXPECTED


def test_gpu_script_keeps_its_gpu_count_and_kind(repo: Clone) -> None:
    repo.commit("touch e2e", {"tests/e2e/test_gpu.py": GPU_SCRIPT + "# tweak\n"})
    entries = {e.path: e for e in changed_entries(repo.root, warn=lambda _: None)}
    gpu = entries["tests/e2e/test_gpu.py"]
    assert (gpu.num_gpus, gpu.kind, gpu.why) == (4, "script", "edited")


def test_unreadable_declarations_default_to_8_gpus_with_a_warning(repo: Clone) -> None:
    repo.commit("odd files", {
        "tests/e2e/test_script.py": 'def main():\n    pass\n\n\nif __name__ == "__main__":\n'
                                    "    main()\n",
        "tests/test_broken.py": "NUM_GPUS = 0\ndef test_x(:\n",
        "tests/test_computed.py": pytest_file("NUM_GPUS = 2 * 2"),
    })
    warnings: list[str] = []
    entries = {e.path: e for e in changed_entries(repo.root, warn=warnings.append)}
    script, broken = entries["tests/e2e/test_script.py"], entries["tests/test_broken.py"]
    computed = entries["tests/test_computed.py"]
    assert (script.num_gpus, script.kind) == (8, "script")
    assert (broken.num_gpus, computed.num_gpus) == (8, 8)
    joined = "\n".join(warnings)
    assert "tests/e2e/test_script.py: no module-level `NUM_GPUS" in joined
    assert "tests/test_broken.py: the file does not parse" in joined
    assert "tests/test_computed.py: `NUM_GPUS` must be a non-negative integer literal" in joined


def test_deleted_and_renamed_away_files_are_dropped(tmp_path: Path) -> None:
    clone = Clone(tmp_path)
    clone.commit("main", {"tests/test_a.py": pytest_file(), "tests/test_b.py": pytest_file()})
    clone.git("push", "--quiet", "origin", "main")
    clone.git("checkout", "--quiet", "-b", "feature")
    clone.git("rm", "--quiet", "tests/test_a.py")
    clone.move("tests/test_b.py", "tests/_b_helper.py")  # no longer a test file
    clone.commit("feature")
    plan = select_changed(clone.root, warn=lambda _: None)
    assert plan.entries == ()
    assert plan.merge_base == clone.git("rev-parse", "origin/main")


def test_base_option_picks_another_branch(repo: Clone) -> None:
    repo.git("branch", "release", "feature~0")
    repo.commit("after release", {"tests/test_late.py": pytest_file("NUM_GPUS = 1")})
    assert selection(repo.root, base="release") == {"tests/test_late.py": (1, "added")}


def test_missing_base_says_to_fetch(repo: Clone) -> None:
    repo.git("update-ref", "-d", "refs/remotes/origin/main")
    with pytest.raises(UsageError, match="run git fetch origin main"):
        changed_entries(repo.root)
    with pytest.raises(UsageError, match="run git fetch origin nope"):
        changed_entries(repo.root, base="origin/nope")
    with pytest.raises(UsageError, match="pass --base"):
        changed_entries(repo.root, base="no-such-branch")
    with pytest.raises(UsageError, match="expected a git ref"):
        changed_entries(repo.root, base="--upload-pack=evil")
    repo.git("remote", "remove", "origin")
    with pytest.raises(UsageError, match=r"no remote 'origin'.*git fetch origin main"):
        changed_entries(repo.root)


def test_shallow_clone_without_merge_base_says_fetch_depth(repo: Clone, tmp_path: Path) -> None:
    repo.git("push", "--quiet", "origin", "feature")
    repo.git("checkout", "--quiet", "main")
    repo.commit("main moves", {"README.md": "moved\n"})
    repo.git("push", "--quiet", "origin", "main")
    url = repo.origin.as_uri()  # file:// so that --depth is honoured
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "--quiet", "--depth", "1", "--branch", "feature", url, str(shallow))
    with pytest.raises(UsageError, match="fetch-depth: 0") as missing:
        changed_entries(shallow)  # origin/main was never fetched
    assert "git fetch origin main" in str(missing.value)
    git(shallow, "fetch", "--quiet", "--depth", "1", "origin", "main:refs/remotes/origin/main")
    with pytest.raises(UsageError, match="shallow clone: fetch with fetch-depth: 0"):
        changed_entries(shallow)
    git(shallow, "fetch", "--quiet", "--unshallow", "origin")
    assert selection(shallow) == EXPECTED


def test_without_gitpython_one_line_names_the_profile(repo: Clone) -> None:
    # GitPython is installed here; the child process hides it as a fresh environment lacks it.
    code = ("import sys; sys.modules['git'] = None; from ci.cli import main; "
            "raise SystemExit(main(sys.argv[1:]))")
    proc = subprocess.run([sys.executable, "-c", code, "changed", "--root", str(repo.root)],
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    # The toolkit's extra, right for an adopter: never `-e .`, which in their checkout is theirs.
    assert proc.stderr == ("error: GitPython is not installed: pip install 'slime-ci[git]' "
                           "(or pip install GitPython)\n")
    assert proc.stdout == ""


def test_not_a_repository_and_no_commit(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UsageError, match="not a git repository"):
        changed_entries(plain)
    with pytest.raises(UsageError, match="not a git repository"):
        changed_entries(tmp_path / "missing")
    git(tmp_path, "init", "--quiet", "-b", "main", "empty")
    with pytest.raises(UsageError, match="no commit yet"):
        changed_entries(tmp_path / "empty")


def test_unrelated_history_says_pass_base(repo: Clone) -> None:
    repo.git("checkout", "--quiet", "--orphan", "island")
    repo.commit("unrelated", {"tests/test_island.py": pytest_file()})
    with pytest.raises(UsageError, match="share no history"):
        changed_entries(repo.root)


def test_parse_name_status_keeps_odd_names() -> None:
    raw = (b"M\0tests/a b.py\0R087\0tests/old.py\0tests/:new\xc3\xa9.py\0D\0gone.py\0"
           b"C100\0x.py\0tests/test_copy.py\0A\0tests/new\nline.py\0")
    changes = parse_name_status(raw)
    assert [(c.status, c.path, c.old_path) for c in changes] == [
        ("modified", "tests/a b.py", None),
        ("renamed", "tests/:newé.py", "tests/old.py"),
        ("deleted", "gone.py", None),
        ("added", "tests/test_copy.py", None),
        ("added", "tests/new\nline.py", None),
    ]
    assert parse_name_status(b"") == []


def test_parse_name_status_never_reads_a_path_as_a_record() -> None:
    # Old paths that begin with a status letter ("Docs", "Makefile"): a parser that steps
    # one field short after a rename or copy would report them as records of their own.
    raw = b"R100\0Docs/old.md\0docs/new.md\0C075\0Makefile\0tests/test_m.py\0M\0Ax.py\0"
    changes = parse_name_status(raw)
    assert [(c.status, c.path, c.old_path) for c in changes] == [
        ("renamed", "docs/new.md", "Docs/old.md"),
        ("added", "tests/test_m.py", None),
        ("modified", "Ax.py", None),
    ]


def test_parse_name_status_without_the_final_nul_keeps_the_last_path() -> None:
    raw = b"M\0tests/a.py\0D\0tests/b.py"
    assert [(c.status, c.path) for c in parse_name_status(raw)] == [
        ("modified", "tests/a.py"), ("deleted", "tests/b.py")]


def test_parse_name_status_keeps_paths_that_are_not_utf8() -> None:
    # git paths are bytes: one that is not UTF-8 survives as surrogate escapes, never an error.
    [change] = parse_name_status(b"A\0tests/test_\xff.py\0")
    assert change.path == "tests/test_\udcff.py"
    assert change.path.encode("utf-8", "surrogateescape") == b"tests/test_\xff.py"


def test_parse_name_status_skips_unmerged_and_unknown_letters() -> None:
    raw = b"U\0tests/conflict.py\0X\0tests/odd.py\0T\0tests/t.py\0"
    assert [(c.status, c.path) for c in parse_name_status(raw)] == [("modified", "tests/t.py")]


def test_table_columns_fit_the_longest_path() -> None:
    entries = tuple(
        ResolvedEntry(id=p, path=p, timeout=60.0, num_gpus=g, kind=k, why=w)
        for p, g, k, w in [("tests/test_a.py", 0, "pytest", "added"),
                           ("tests/e2e/test_long_name.py", 8, "script", "modified")])
    plan = ChangedSelection(base="origin/main", merge_base="0123456789abcdef", head="f" * 40, entries=entries)
    assert format_table(plan).splitlines() == [
        "2 test files selected vs origin/main (merge base 0123456789):",
        "GPUs  kind    file                         why",
        "   0  pytest  tests/test_a.py              added",
        "   8  script  tests/e2e/test_long_name.py  modified",
    ]
    one = ChangedSelection(base="b", merge_base="m" * 12, head="h", entries=entries[:1])
    assert format_table(one).splitlines()[0] == "1 test file selected vs b (merge base mmmmmmmmmm):"
    short = (ResolvedEntry(id="t.py", path="t.py", timeout=1.0, num_gpus=0, kind="pytest", why="w"),)
    none = ChangedSelection(base="b", merge_base="m" * 12, head="h", entries=short)
    assert format_table(none).splitlines()[1] == "GPUs  kind    file  why"
    empty = ChangedSelection(base="b", merge_base="m" * 12, head="h", entries=())
    assert format_table(empty) == "no test files selected vs b (merge base mmmmmmmmmm): nothing to run"


def test_cli_table_json_and_nothing(repo: Clone, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--root", str(repo.root), "--json"]) == 0
    out, err = capsys.readouterr()
    rows = json.loads(out)
    assert {r["path"]: (r["num_gpus"], r["why"]) for r in rows} == EXPECTED
    assert set(rows[0]) == {"path", "num_gpus", "kind", "why"}
    assert "tests/test_undeclared.py" in err  # the warning goes to stderr, JSON stays clean

    assert main(["--root", str(repo.root)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].startswith("5 test files selected vs origin/main (merge base ")
    assert table[1].split() == ["GPUs", "kind", "file", "why"]
    deep = next(line for line in table if "test_deep.py" in line)
    assert deep.split() == ["2", "pytest", "tests/utils/deep/er/test_deep.py", "added"]

    repo.git("reset", "--quiet", "--hard", "origin/main")
    repo.commit("docs only", {"README.md": "docs\n"})
    assert main(["--root", str(repo.root)]) == 0
    assert "nothing to run" in capsys.readouterr().out
    assert main(["--root", str(repo.root), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_command_line_exit_codes(tmp_path: Path) -> None:
    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "ci", "changed", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60, check=False)

    bad = run("--root", str(tmp_path))
    assert bad.returncode == 2
    assert bad.stderr.strip().startswith("error: ")
    assert "not a git repository" in bad.stderr
    assert "Traceback" not in bad.stderr
    help_ = run("--help")
    assert help_.returncode == 0
    assert "--affected" in help_.stdout
    assert "--base" in help_.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
