"""`python -m ci audit` names file and line for every defect, on any checkout."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, REPO, run_ci, write

NUM_GPUS = 0

E2E = """
    NUM_GPUS = 4

    def execute():
        pass

    if __name__ == "__main__":
        execute()
"""

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu", entries=(
            Entry(path="tests/e2e/test_train.py"),
            Entry(path="tests/e2e/test_gone.py"),
            Entry(path="tests/e2e/test_zero.py"),
            Entry(path="tests/e2e/test_config.py", cpu_only=True),
        )),
        Suite(name="cpu_list", tier="cpu", purpose="p", profile="cpu", entries=(
            Entry(path="tests/e2e/test_train.py"),
        )),
    )
"""

DEFECTS = {
    "tests/test_ok.py": PASSING,
    "tests/utils/test_no_decl.py": """
        def test_a():
            assert True
    """,
    "tests/utils/test_bad_decl.py": """
        import os
        NUM_GPUS = int(os.environ.get("N", "0"))
        def test_a():
            assert True
    """,
    "tests/test_no_tests.py": """
        NUM_GPUS = 0
        VALUE = 1
    """,
    "tests/test_no_main.py": """
        NUM_GPUS = 0
        def test_a():
            assert True
    """,
    "tests/test_idle_main.py": """
        NUM_GPUS = 0
        def test_a():
            assert True


        if __name__ == "__main__":
            print("nothing")
    """,
    "tests/e2e/test_script_no_main.py": """
        NUM_GPUS = 2
        def execute():
            pass
    """,
    "tests/test_syntax.py": "NUM_GPUS = 0\ndef test_(:\n",
}


def _lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith("audit:")]


def test_per_file_defects_without_a_registry(tmp_path):
    write(tmp_path, DEFECTS)
    proc = run_ci("audit", "--root", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    found = _lines(proc.stdout)
    expected_prefixes = [
        "tests/e2e/test_script_no_main.py:1: e2e script without",
        "tests/test_idle_main.py:6: the `__main__` block calls neither",
        "tests/test_no_main.py:1: no `if __name__",
        "tests/test_no_tests.py:1: NUM_GPUS = 0 but no test functions",
        "tests/test_syntax.py:1: does not parse",
        "tests/utils/test_bad_decl.py:2: `NUM_GPUS` must be a non-negative integer literal",
        "tests/utils/test_no_decl.py:1: no module-level `NUM_GPUS = <int>`",
    ]
    assert len(found) == len(expected_prefixes), found
    for line, prefix in zip(found, expected_prefixes, strict=True):
        assert line.startswith(prefix), (line, prefix)
    assert "no .slime-ci/suites.py or ci/registry/repo_suites.py here: per-file checks only" in proc.stdout
    assert "tests/test_ok.py" not in proc.stdout


def test_registry_defects(tmp_path):
    write(tmp_path, {
        "ci/registry/repo_suites.py": REGISTRY,
        "tests/test_ok.py": PASSING,
        "tests/e2e/test_train.py": E2E,
        "tests/e2e/test_zero.py": PASSING,
        "tests/e2e/test_config.py": PASSING,
        "tests/e2e/test_orphan.py": E2E,
    })
    proc = run_ci("audit", "--root", str(tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    out = proc.stdout
    assert "tests/e2e/test_gone.py:0: registered in suite gpu (ci/registry/repo_suites.py) but the file does not exist" in out
    assert "tests/e2e/test_zero.py:3: registered in suite gpu (ci/registry/repo_suites.py), a GPU suite, but NUM_GPUS = 0" in out
    assert "tests/e2e/test_train.py:1: registered in suite cpu_list (ci/registry/repo_suites.py), a CPU suite, but NUM_GPUS = 4" in out
    assert "tests/e2e/test_orphan.py:1: in no suite (NUM_GPUS = 4)" in out
    assert "test_config.py" not in out  # cpu_only marks a deliberate 0-GPU config check
    assert "test_ok.py" not in out
    assert "audit: 4 problem(s)" in out


CLEAN_REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/e2e/test_train.py"),
            Entry(path="tests/e2e/test_train.py", test_args=("--async-save",)),
            Entry(path="tests/e2e/test_config.py", cpu_only=True),
        )),
    )
"""


def test_clean_checkout_passes(tmp_path):
    write(tmp_path, {"ci/registry/repo_suites.py": CLEAN_REGISTRY, "tests/test_ok.py": PASSING,
                     "tests/utils/test_ok2.py": PASSING, "tests/e2e/test_train.py": E2E,
                     "tests/e2e/test_config.py": PASSING})
    proc = run_ci("audit", "--root", str(tmp_path))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout == "audit: 4 test files, no problems\n"


def test_this_repository_is_clean():
    proc = run_ci("audit", "--root", str(REPO))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no problems" in proc.stdout


def test_bad_root_is_one_line_exit_2(tmp_path):
    proc = run_ci("audit", "--root", str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "has no tests/ directory" in proc.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
