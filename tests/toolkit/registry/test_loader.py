"""The registry loader, and registries written by the previous release: an adopted
`.slime-ci/suites.py` that imports `ci.suites` and a noxfile that imports `ci.nox_sessions`
(tests/toolkit/data/previous_release, written by `slime-ci adopt` before `ci/` became
packages) still load, list their sessions and plan, through the re-export modules.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci

from ci.errors import UsageError
from ci.registry import Entry, Suite, load_registry, repo_suites
from ci.registry.loader import ADOPTED_REGISTRY, REGISTRY, read_registry, registry_name, registry_path

NUM_GPUS = 0

PREVIOUS = REPO / "tests" / "toolkit" / "data" / "previous_release"
TEST_FILE = "import sys\nimport pytest\nNUM_GPUS = {n}\n\ndef test_ok():\n    assert True\n\n" \
            "if __name__ == '__main__':\n    raise SystemExit(pytest.main([__file__, '-q']))\n"


@pytest.fixture
def adopted(tmp_path: Path) -> Path:
    """A repository adopted by the previous release: its registry and noxfile as written then."""
    root = tmp_path / "repo"
    (root / ".slime-ci").mkdir(parents=True)
    shutil.copy(PREVIOUS / "suites.py", root / ADOPTED_REGISTRY)
    shutil.copy(PREVIOUS / "noxfile.py", root / "noxfile.py")
    for rel, n in (("tests/test_sample.py", 0), ("tests/utils/test_math.py", 0),
                   ("tests/test_agent/test_adapter.py", 0), ("tests/test_tiny_e2e.py", 4)):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(TEST_FILE.format(n=n))
    return root


def test_the_previous_releases_files_use_the_old_import_paths():
    assert "from ci.suites import Entry, Suite" in (PREVIOUS / "suites.py").read_text()
    assert "from ci.nox_sessions import register" in (PREVIOUS / "noxfile.py").read_text()


def test_a_previous_registry_loads_with_todays_schema(adopted: Path):
    registry = read_registry(adopted / ADOPTED_REGISTRY)
    assert registry is not None and registry.name == ADOPTED_REGISTRY
    assert registry.names() == ("megatron", "image", "cpu_unit", "agent_adapter", "changed")
    assert all(isinstance(s, Suite) for s in registry)  # the classes of ci.registry, re-exported
    megatron = registry["megatron"]
    assert all(isinstance(e, Entry) for e in megatron.entries) and megatron.label == "run-ci-megatron"
    assert load_registry(adopted).suites == registry.suites


def test_a_previous_registry_plans_and_audits(adopted: Path):
    run = run_ci("run", "--suite", "megatron", "--root", str(adopted), "--dry-run", "--gpus", "8")
    assert run.returncode == 0, run.stderr
    assert "tests/test_tiny_e2e.py" in run.stdout
    audit = run_ci("audit", "--root", str(adopted))
    assert "registered in suite" not in audit.stdout, audit.stdout


def test_a_previous_noxfile_lists_its_sessions(adopted: Path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    listed = subprocess.run([sys.executable, "-m", "nox", "-l"], cwd=adopted, env=env, capture_output=True,
                            text=True, timeout=120, check=False)
    assert listed.returncode == 0, listed.stderr
    for session in ("megatron", "image", "cpu_unit", "agent_adapter", "changed", "workflows", "history",
                    "monitor"):
        assert f"* {session}" in listed.stdout or f"- {session}" in listed.stdout, listed.stdout


def test_the_re_exports_are_the_same_objects():
    import ci.nox_sessions
    import ci.suites
    from ci.adopt.sessions import register
    from ci.quality.mutation_targets import MUTATION_TARGETS

    assert ci.suites.Entry is Entry and ci.suites.Suite is Suite
    assert ci.suites.SUITES is repo_suites.SUITES and ci.suites.MUTATION_TARGETS is MUTATION_TARGETS
    assert ci.nox_sessions.register is register
    assert set(ci.suites.__all__) <= set(dir(ci.suites))


def test_this_checkouts_registry_is_the_imported_module():
    assert registry_path(REPO) == REPO / REGISTRY
    registry = load_registry(REPO)
    assert registry.suites is repo_suites.SUITES and registry.sessions is repo_suites.SESSIONS


def test_messages_name_a_registry_by_its_place_in_the_checkout(tmp_path: Path):
    assert registry_name(tmp_path / "repo" / REGISTRY) == "ci/registry/repo_suites.py"
    assert registry_name(tmp_path / "repo" / ADOPTED_REGISTRY) == ".slime-ci/suites.py"
    assert registry_name(tmp_path / "elsewhere" / "repo_suites.py") == str(tmp_path / "elsewhere" / "repo_suites.py")


def test_a_registry_that_fails_to_execute_is_one_line(tmp_path: Path):
    (tmp_path / ".slime-ci").mkdir()
    (tmp_path / ADOPTED_REGISTRY).write_text("from ci.suites import Nothing\n")
    with pytest.raises(UsageError, match=r"suites.py: cannot load the registry: cannot import name 'Nothing'"):
        load_registry(tmp_path)


def test_a_file_without_suites_falls_back_to_the_toolkits(tmp_path: Path):
    (tmp_path / ".slime-ci").mkdir()
    (tmp_path / ADOPTED_REGISTRY).write_text("X = 1\n")
    assert read_registry(tmp_path / ADOPTED_REGISTRY) is None
    assert load_registry(tmp_path).suites is repo_suites.SUITES


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
