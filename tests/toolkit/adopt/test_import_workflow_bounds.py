"""A small template cannot make the importer run for minutes or quote a huge value.

Nested `set` aliases (each list names the one before it eight times) make a template of a
few hundred bytes stand for billions of values; `[` nested 5000 deep overflows a recursive
parser. Both are refused in one line with exit 2, by `adopt` and `import-workflow`, in
seconds and with nothing written; a value within the bounds is still cut in a message.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci
from _gitrepo import git

from ci.adopt.import_workflow import MAX_QUOTED_CHARS, MAX_VALUE_SIZE, expanded_size, read_matrix
from ci.errors import UsageError

NUM_GPUS = 0


def nested_aliases(levels: int = 12) -> str:
    """Each `set` names the previous one eight times: 4 * 8**levels values in ~550 bytes."""
    text = "<% set a = ['" + "x" * 24 + "', 'y', 'z', 'w'] %>\n"
    previous = "a"
    for name in "bcdefghijklmnopq"[:levels]:
        text += f"<% set {name} = [{', '.join([previous] * 8)}] %>\n"
        previous = name
    return text + "<% set jobs = {'x': {'tests': [" + previous + "]}} %>\n"


DEEP = "<% set jobs = " + "[" * 5000 + "]" * 5000 + " %>\n"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    (root / "tests/test_a.py").write_text("NUM_GPUS = 0\n\ndef test_a():\n    assert True\n")
    (root / ".github/workflows").mkdir(parents=True)
    git(root.parent, "init", "-q", "-b", "main", str(root))
    return root


@pytest.mark.parametrize(("template", "expect"), [
    (nested_aliases(), f"expands to more than {MAX_VALUE_SIZE} values and characters"),
    (DEEP, "nested too deeply for a workflow template"),
])
def test_a_template_bomb_is_one_line_and_exit_2_in_seconds(repo: Path, template: str, expect: str) -> None:
    assert len(template.encode()) < 11_000
    path = repo / ".github/workflows/pr-test.yml.j2"
    path.write_text(template)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "bomb")
    for argv in (["adopt", str(repo), "--toolkit-requirement", "slime-ci==0.1.0"],
                 ["import-workflow", str(path), "--root", str(repo)]):
        started = time.monotonic()
        done = run_ci(*argv, timeout=60)
        assert done.returncode == 2, (argv, done.stdout, done.stderr[-2000:])
        assert done.stderr.count("\n") == 1 and expect in done.stderr, done.stderr[:500]
        assert len(done.stderr) < 500 and "Traceback" not in done.stderr
        assert time.monotonic() - started < 30
    assert git(repo, "status", "--porcelain", "--untracked-files=all") == ""


def test_the_expanded_size_counts_shared_values_each_time_and_stops_early() -> None:
    shared = ["ab", "c"]  # 1 + 3 + 2
    assert expanded_size(shared) == 6 and expanded_size([shared, shared, {"k": shared}]) == 1 + 6 + 6 + 1 + 2 + 6
    huge: list[object] = ["x"]
    for _ in range(60):  # 2**60 values when rendered
        huge = [huge, huge]
    started = time.monotonic()
    assert expanded_size(huge, limit=1000) > 1000 and time.monotonic() - started < 1


def test_a_large_value_within_the_bound_is_cut_in_the_message() -> None:
    many = ", ".join(f"'entry-number-{i}'" for i in range(3000))  # not a dict: refused, quoted
    text = "<% set jobs = {'cpu-unittest': {'tests': [[" + many + "]]}} %>\n"
    with pytest.raises(UsageError) as caught:
        read_matrix(text)
    message = str(caught.value)
    assert "expected a dict with test_file and num_gpus" in message
    assert len(message) < MAX_QUOTED_CHARS + 200, len(message)


def test_slimes_own_template_stays_far_below_the_bound() -> None:
    # The bound must never refuse a real matrix: slime's shape, with its shared list.
    entries = ", ".join(f"{{'test_file': 'test_{i}.py', 'num_gpus': 8, 'test_args': '--x {i}'}}"
                        for i in range(60))
    text = (f"<% set megatron_tests = [{entries}] %>\n<% set jobs = {{" +
            ", ".join(f"'e2e-test-{n}': {{'label': 'run-ci-{n}', 'tests': megatron_tests}}"
                      for n in ("megatron", "precision", "ckpt", "image")) + "} %>\n")
    matrix = read_matrix(text)
    assert sum(len(j.entries) for j in matrix.jobs) == 240


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
