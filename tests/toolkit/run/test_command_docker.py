"""A GPU suite's entry through the real `docker run` path the session builds.

Needs a running container engine and the local image made by .ci/docker-engine.sh
(CI runs that script first). Where no engine answers, the tests skip and say why.
"""

import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

NUM_GPUS = 0

IMAGE = "slime-ci-local:bookworm"


def _engine_problem() -> str | None:
    try:
        info = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"docker CLI unusable: {exc}"
    if info.returncode != 0:
        return f"no engine with image {IMAGE} (run: bash .ci/docker-engine.sh): {info.stderr.strip()[:120]}"
    return None


PROBLEM = _engine_problem()
pytestmark = pytest.mark.skipif(PROBLEM is not None, reason=PROBLEM or "")

REGISTRY = f"""
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="cfg", tier="gpu", purpose="p", profile="e2e", label="run-ci-cfg", image={IMAGE!r},
              entries=(Entry(path="tests/e2e/test_cfg.py", test_args=("--x", "a b"), cpu_only=True),)),
        Suite(name="stuck", tier="gpu", purpose="p", profile="e2e", label="run-ci-stuck", image={IMAGE!r},
              entries=(Entry(path="tests/e2e/test_stuck.py", cpu_only=True),)),
    )
"""

CFG = """
    import os, sys
    NUM_GPUS = 0

    def execute():
        assert os.path.exists("/.dockerenv"), "not in a container"
        assert sys.argv[1:] == ["--x", "a b"], sys.argv
        assert os.environ["SLIME_CI_ENTRY"] == "tests/e2e/test_cfg.py --x a b"
        assert os.environ["TEST_FILE"] == "tests/e2e/test_cfg.py"
        out = os.environ["SLIME_CI_OUTPUT_DIR"]
        open(os.path.join(out, "written-inside"), "w").write("ok")

    if __name__ == "__main__":
        execute()
"""

STUCK = """
    import time
    NUM_GPUS = 0

    def execute():
        time.sleep(600)

    if __name__ == "__main__":
        execute()
"""

PYPROJECT = """
    [project]
    name = "docker-probe"
    version = "0"

    [tool.setuptools]
    packages = []
"""


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_cfg.py": CFG,
                            "tests/e2e/test_stuck.py": STUCK, "pyproject.toml": PYPROJECT})


def test_entry_runs_in_the_container_with_the_workspace_mounted(checkout):
    proc = run_ci("run", "--suite", "cfg", "--root", str(checkout), "--pull", "never",
                  "--keep-outputs", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "cfg: 1 passed, 0 failed, 0 skipped" in proc.stdout.splitlines()
    written = list((checkout / ".ci-cache" / "runs").glob("*/out/*/written-inside"))
    assert [p.read_text() for p in written] == ["ok"]


def test_timed_out_container_is_killed_not_left_running(checkout):
    proc = run_ci("run", "--suite", "stuck", "--root", str(checkout), "--pull", "never",
                  "--timeout", "20", timeout=300)
    assert proc.returncode == 1
    assert "timed out after 20s" in proc.stdout
    deadline = time.monotonic() + 30
    while True:
        ps = subprocess.run(["docker", "ps", "-q", "--filter", "name=slime-ci-tests-e2e-test_stuck"],
                            capture_output=True, text=True, timeout=30, check=False)
        if not ps.stdout.strip() or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ps.stdout.strip() == "", "the container outlived its entry's timeout"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
