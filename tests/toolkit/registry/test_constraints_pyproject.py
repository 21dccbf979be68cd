"""`python -m ci lock` on a pyproject.toml that is broken or shaped wrong: one line, exit 2.

Run as a process, as a user would: a file that is not TOML (or not UTF-8) gave a
traceback, and a profile written as a string (`cpu = "notalist"`) was read letter by
letter, becoming the requirements `n`, `o`, `t`, … The refusal comes before the resolver
starts, and writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci

from ci.errors import UsageError
from ci.registry.profiles import names, requirements

NUM_GPUS = 0

@pytest.mark.parametrize(("text", "expect"), [
    ('[project\nname = "x"\n', "not valid TOML"),
    (b"\xff\xfe[project]\n", "cannot read it (UnicodeDecodeError)"),
    ('[dependency-groups]\ncpu = "notalist"\n', "dependency-groups.cpu must be a list of requirements"),
    ('[dependency-groups]\ncpu = ["numpy", 3]\n', "dependency-groups.cpu holds 3"),
    ('[dependency-groups]\ncpu = [{include = "x"}]\n', "dependency-groups.cpu holds {'include': 'x'}"),
    ('dependency-groups = "cpu"\n', "[dependency-groups] must be a table"),
    ('project = 1\n', "[project] must be a table"),
    ('[project]\nname = "x"\noptional-dependencies = {dev = "pytest"}\n',
     "project.optional-dependencies.dev must be a list"),
    ('[project.optional-dependencies]\ndev = [{include-group = "cpu"}]\n',
     "project.optional-dependencies.dev holds"),
    # A group that includes one that does not exist: uv refuses it at install, so must the check.
    ('[dependency-groups]\ncpu = ["numpy", {include-group = "nosuch"}]\n',
     "dependency-groups.cpu includes the group 'nosuch', which does not exist; known groups: cpu"),
    ('[project]\nname = "slime-ci"\n[dependency-groups]\ncpu = ["slime-ci[nosuch]"]\n',
     "cpu names 'slime-ci[nosuch]', but there is no profile 'nosuch'"),
])
def test_a_broken_pyproject_is_one_line_exit_2_and_nothing_written(tmp_path: Path, text: str | bytes,
                                                                     expect: str) -> None:
    path = tmp_path / "pyproject.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    for extra in ([], ["--check"]):
        done = run_ci("lock", "--root", str(tmp_path), *extra, env={"PATH": "/usr/bin:/bin"})
        assert done.returncode == 2, (done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and expect in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pyproject.toml"]


def test_profiles_refuse_a_string_wherever_they_are_read() -> None:
    pyproject = {"dependency-groups": {"cpu": "notalist"}}
    for call in (lambda: names(pyproject), lambda: requirements(pyproject, "cpu")):
        with pytest.raises(UsageError, match="must be a list of requirements"):
            call()
    assert requirements({"dependency-groups": {"cpu": ["numpy", {"include-group": "x"}], "x": ["ray"]}},
                        "cpu") == ["numpy", "ray"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
