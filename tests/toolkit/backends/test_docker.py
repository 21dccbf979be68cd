"""One 0-GPU entry through the real `docker run` path that `ci.backends.docker_argv` builds.

The engine and the small local image come from `.ci/docker-engine.sh` (CI runs it first;
this test runs it when the engine is not up). The entry is a pytest file in a workspace made
in tmp_path: inside the container it checks that the workspace is mounted at the same path
and was pip-installed `--no-deps`, that the entry's variables and the pass-through ones
arrived, and that the model cache is mounted; its JUnit report lands back on the host.
"""

import os
import subprocess
import sys
import textwrap
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.backends.docker_argv import (
    DockerOptions,
    container_name,
    docker_kill_argv,
    docker_run_argv,
    fit_to_host,
    read_host_limits,
)

NUM_GPUS = 0
ENGINE_SCRIPT = REPO / ".ci" / "docker-engine.sh"
IMAGE = os.environ.get("SLIME_CI_LOCAL_IMAGE", "slime-ci-local:bookworm")

ENTRY = '''
import importlib.metadata
import os
import sys
from pathlib import Path

import pytest

NUM_GPUS = 0
WS = Path(__file__).resolve().parents[1]


def test_workspace_is_mounted_at_the_same_path_and_installed():
    assert str(WS) == os.environ["EXPECT_WORKSPACE"]
    assert Path.cwd() == WS
    assert importlib.metadata.version("probe-ws") == "0.0.1"
    import probe_pkg
    assert Path(probe_pkg.__file__).is_relative_to(WS)  # editable: the mounted source


def test_entry_env_and_passthrough_arrived():
    assert os.environ["NUM_GPUS"] == "0"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert os.environ["SLIME_TEST_ENABLE_EVAL"] == "1"
    assert os.environ["WANDB_API_KEY"] == os.environ["EXPECT_KEY"]


def test_model_cache_is_mounted():
    assert (Path("/root/models") / "marker.txt").read_text() == os.environ["EXPECT_MARKER"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-p", "no:cacheprovider", *sys.argv[1:]]))
'''


def _run(argv, *, timeout, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _engine_or_skip() -> None:
    if _run(["bash", str(ENGINE_SCRIPT), "--check"], timeout=60).returncode == 0:
        return
    if os.geteuid() != 0:
        pytest.skip("no container engine is running and starting one needs root "
                    "(run `sudo bash .ci/docker-engine.sh`)")
    setup = _run(["bash", str(ENGINE_SCRIPT)], timeout=900)
    if setup.returncode != 0:
        tail = "\n".join((setup.stdout + setup.stderr).splitlines()[-15:])
        pytest.skip(f"no container engine could start here: .ci/docker-engine.sh exited "
                    f"{setup.returncode}:\n{tail}")


def _workspace(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    (ws / "probe_pkg").mkdir(parents=True)
    (ws / "tests").mkdir()
    (ws / "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "probe-ws"
        version = "0.0.1"

        [tool.setuptools]
        packages = ["probe_pkg"]
    """))
    (ws / "probe_pkg" / "__init__.py").write_text("VALUE = 1\n")
    (ws / "tests" / "test_in_container.py").write_text(ENTRY)
    return ws


def _docker(opts: DockerOptions, inner: tuple[str, ...], *, env=None, timeout=600):
    opts, notes = fit_to_host(opts, read_host_limits())
    for note in notes:  # a restricted host, named as such in the test's output
        print(f"host limit: {note}")
    argv = docker_run_argv(opts, inner)
    try:
        return _run(list(argv), timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        _run(list(docker_kill_argv(opts.name)), timeout=60)
        raise


def test_zero_gpu_entry_runs_in_the_container(tmp_path):
    _engine_or_skip()
    ws = _workspace(tmp_path)
    models = tmp_path / "models"
    models.mkdir()
    marker = uuid.uuid4().hex
    (models / "marker.txt").write_text(marker)
    name = container_name("tests/test_in_container.py", uuid.uuid4().hex[:8])
    opts = DockerOptions(
        image=IMAGE, workspace=ws, devices=(), pull="never", name=name,
        env={"NUM_GPUS": "0", "SLIME_TEST_ENABLE_EVAL": "1", "EXPECT_WORKSPACE": str(ws),
             "EXPECT_KEY": "key-from-host", "EXPECT_MARKER": marker},
        passthrough=("WANDB_API_KEY",),
        caches={str(models): "/root/models"},
    )
    env = {**os.environ, "WANDB_API_KEY": "key-from-host"}
    result = _docker(opts, ("python", "tests/test_in_container.py", f"--junitxml={ws}/report.xml"),
                     env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "Successfully installed probe-ws" in output or "Successfully installed probe_ws" in output
    suite = ET.parse(ws / "report.xml").getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "0", "0")
    # --rm: nothing of the entry remains.
    left = _run(["docker", "ps", "-a", "-q", "--filter", f"name={name}"], timeout=60)
    assert left.stdout.strip() == ""


def test_entry_exit_code_passes_through(tmp_path):
    _engine_or_skip()
    ws = tmp_path / "ws"
    ws.mkdir()
    opts = DockerOptions(image=IMAGE, workspace=ws, pull="never", install=False, passthrough=(),
                         name=container_name("exit-code", uuid.uuid4().hex[:8]))
    result = _docker(opts, ("python", "-c", "import sys; print('inside'); sys.exit(7)"))
    assert result.returncode == 7, result.stdout + result.stderr
    assert "inside" in result.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", "-s", *sys.argv[1:]]))
