"""Real git repositories for toolkit tests: a bare `origin` and a working clone of it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

# Isolated from whoever runs the tests: no global config, fixed identity, no pager.
GIT_ENV = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_AUTHOR_NAME": "CI Test",
    "GIT_AUTHOR_EMAIL": "ci@example.invalid",
    "GIT_COMMITTER_NAME": "CI Test",
    "GIT_COMMITTER_EMAIL": "ci@example.invalid",
    "GIT_TERMINAL_PROMPT": "0",
}


def git(cwd: Path, *args: str) -> str:
    """Run git in `cwd`; raise with its output when it fails."""
    result = subprocess.run(
        ["git", *args], cwd=cwd, env={**os.environ, **GIT_ENV},
        capture_output=True, text=True, timeout=60, check=False,
    )
    if result.returncode != 0:
        raise AssertionError(f"git {' '.join(args)} failed ({result.returncode}):\n"
                             f"{result.stdout}{result.stderr}")
    return result.stdout.strip()


class Clone:
    """A working clone of a bare repository `origin`, both under `base`."""

    def __init__(self, base: Path, name: str = "work") -> None:
        self.origin = base / "origin.git"
        self.root = base / name
        if not self.origin.exists():
            git(base, "init", "--quiet", "--bare", "-b", "main", str(self.origin))
        git(base, "clone", "--quiet", str(self.origin), str(self.root))
        git(self.root, "checkout", "--quiet", "-B", "main")

    @classmethod
    def copy_of(cls, template: Clone, base: Path) -> Clone:
        """An independent copy of `template` (origin included) under `base`: cheaper than
        building the same history again in every test."""
        clone = cls.__new__(cls)
        clone.origin = base / template.origin.name
        clone.root = base / template.root.name
        shutil.copytree(template.origin, clone.origin, symlinks=True)
        shutil.copytree(template.root, clone.root, symlinks=True)
        clone.git("remote", "set-url", "origin", str(clone.origin))
        return clone

    def git(self, *args: str) -> str:
        """git in the clone."""
        return git(self.root, *args)

    def write(self, rel: str, text: str) -> None:
        """Write a file of the work tree, creating its folders."""
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")

    def move(self, old: str, new: str) -> None:
        """`git mv`, creating the destination folder."""
        (self.root / new).parent.mkdir(parents=True, exist_ok=True)
        self.git("mv", old, new)

    def commit(self, message: str, files: dict[str, str] | None = None) -> str:
        """Write `files`, stage everything, commit; return the new commit's sha."""
        for rel, text in (files or {}).items():
            self.write(rel, text)
        self.git("add", "--all")
        self.git("commit", "--quiet", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    @classmethod
    def on_feature_branch(cls, base: Path, main_files: dict[str, str]) -> Clone:
        """A clone whose `main` (commit of `main_files`) is pushed to origin, with a branch
        `feature` checked out from it: the start of every changed-test scenario."""
        clone = cls(base)
        clone.commit("main", main_files)
        clone.git("push", "--quiet", "origin", "main")
        clone.git("checkout", "--quiet", "-b", "feature")
        return clone


def pytest_file(declare: str | None = "NUM_GPUS = 0", body: str = "") -> str:
    """Source of a runnable pytest file with `declare` as its NUM_GPUS line (None: none)."""
    return (
        "import sys\n\nimport pytest\n\n"
        f"{declare or ''}\n{body}\n\n"
        "def test_it():\n    assert 1 + 1 == 2\n\n\n"
        'if __name__ == "__main__":\n'
        '    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))\n'
    )
