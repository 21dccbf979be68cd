"""`python -m ci lock`: real resolves with uv against a local wheel index; the drift check;
what a session installs with; and the repository's own locks pinning every profile."""

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.registry import constraints

NUM_GPUS = 0

needs_uv = pytest.mark.skipif(
    shutil.which("uv") is None and not Path(sys.executable).with_name("uv").is_file(),
    reason="uv is not installed (the dev profile has it)")


def _wheel(index: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A real, minimal pure-Python wheel that a resolver can read."""
    files = {f"{name}/__init__.py": "",
             f"{name}-{version}.dist-info/METADATA": "Metadata-Version: 2.1\n"
                                                     f"Name: {name}\nVersion: {version}\n"
                                                     + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\n"
                                                  "Root-Is-Purelib: true\nTag: py3-none-any\n"}
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    index.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(index / f"{name}-{version}-py3-none-any.whl", "w") as zf:
        for path, text in files.items():
            zf.writestr(path, text)


def _project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(textwrap.dedent("""
        [project]
        name = "demo"
        version = "0"
        [project.optional-dependencies]
        cpu = ["alpha"]
        dev = ["demo[cpu]", "beta>=1"]
    """))
    return root


def _ci_lock(root: Path, index: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(index),
           "UV_CACHE_DIR": str(root.parent / "uv-cache"), "UV_NO_CONFIG": "1"}
    return subprocess.run([sys.executable, "-m", "ci", "lock", "--root", str(root), "--python", "3.11", *args],
                          env=env, capture_output=True, text=True, timeout=120)


@needs_uv
def test_lock_pins_every_extra_and_check_sees_a_new_release(tmp_path):
    root, index = _project(tmp_path / "repo"), tmp_path / "index"
    _wheel(index, "alpha", "1.0", ("gamma",))
    _wheel(index, "beta", "2.0")
    _wheel(index, "gamma", "0.5")
    made = _ci_lock(root, index)
    assert made.returncode == 0, made.stderr
    text = constraints.constraints_path(root, "3.11").read_text()
    assert constraints.pins(text) == ["alpha==1.0", "beta==2.0", "gamma==0.5"]  # transitive gamma too
    assert "python -m ci lock" in text  # the header names the command that made it
    current = _ci_lock(root, index, "--check")
    assert current.returncode == 0 and "current" in current.stdout, current.stdout + current.stderr

    _wheel(index, "gamma", "0.6")  # an upstream release overnight
    behind = _ci_lock(root, index, "--check")
    assert behind.returncode == 1, behind.stdout + behind.stderr
    assert "-gamma==0.5" in behind.stdout and "+gamma==0.6" in behind.stdout
    assert "behind a fresh resolve" in behind.stdout
    assert constraints.pins(constraints.constraints_path(root, "3.11").read_text())[-1] == "gamma==0.5"  # --check wrote nothing


@needs_uv
def test_a_doctored_lock_is_reported(tmp_path):
    root, index = _project(tmp_path / "repo"), tmp_path / "index"
    for name, version in (("alpha", "1.0"), ("beta", "2.0")):
        _wheel(index, name, version)
    assert _ci_lock(root, index).returncode == 0
    path = constraints.constraints_path(root, "3.11")
    path.write_text(path.read_text().replace("beta==2.0", "beta==1.5"))
    got = _ci_lock(root, index, "--check")
    assert got.returncode == 1 and "-beta==1.5" in got.stdout and "+beta==2.0" in got.stdout


@needs_uv
def test_unresolvable_is_one_line_and_exit_2(tmp_path):
    root, index = _project(tmp_path / "repo"), tmp_path / "index"
    _wheel(index, "alpha", "1.0")  # beta is missing from the index
    got = _ci_lock(root, index)
    assert got.returncode == 2, got.stderr
    assert got.stderr.startswith("error: uv pip compile for Python 3.11 failed") and "Traceback" not in got.stderr
    assert not constraints.constraints_path(root, "3.11").exists()


@pytest.mark.parametrize(("args", "says"), [
    (("--python", "3"), "--python takes versions like 3.11"),
    (("--root", "/nonexistent-dir"), "has no pyproject.toml"),
])
def test_bad_input_exit_2(tmp_path, args, says):
    got = subprocess.run([sys.executable, "-m", "ci", "lock", *args], cwd=tmp_path, capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60)
    assert got.returncode == 2 and says in got.stderr and "Traceback" not in got.stderr, got.stderr


def test_sessions_install_with_the_lock_unless_told_not_to(tmp_path):
    assert constraints.constraints_disabled(["--no-lock"], {}) and constraints.constraints_disabled([], {constraints.NO_LOCK_ENV: "1"})
    assert not constraints.constraints_disabled(["--gpus", "8"], {constraints.NO_LOCK_ENV: "0"})
    assert constraints.strip_no_lock_flag(["--no-lock", "--gpus", "8"]) == ["--gpus", "8"]
    assert constraints.constraint_args(REPO, "3.11", disabled=False) == ["-c", str(REPO / "constraints" / "py3.11.txt")]
    assert constraints.constraint_args(tmp_path, "3.12", disabled=True) == []
    with pytest.raises(constraints.ConstraintsMissing, match=r"no constraints file for Python 3\.12 .*python -m ci lock --python 3\.12"):
        constraints.constraint_args(tmp_path, "3.12", disabled=False)


class _Session:
    """What `noxfile._install` asks of a nox session; records the pip calls."""

    def __init__(self, posargs):
        self.posargs, self.python, self.calls = list(posargs), None, []
        self.venv_backend = "venv"

    def install(self, *args):
        self.calls.append(args)

    def run(self, *args, **kwargs):  # the .pth naming the checkout; not an install
        pass

    def error(self, message):
        raise RuntimeError(message)


@pytest.fixture(scope="module")
def noxfile():
    import importlib.util

    registry = pytest.importorskip("nox.registry", reason="the dev profile brings nox")
    before = dict(registry.get())
    spec = importlib.util.spec_from_file_location("_noxfile_for_lock", REPO / "noxfile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    registry._REGISTRY.clear()  # leave nox's registry as it was
    registry._REGISTRY.update(before)
    return module


def test_the_noxfile_installs_every_profile_held_to_the_lock(noxfile, monkeypatch):
    monkeypatch.delenv(constraints.NO_LOCK_ENV, raising=False)
    held = ("-c", str(constraints.constraints_path(REPO, "{}.{}".format(*sys.version_info[:2]))))
    session = _Session(["--gpus", "8"])
    noxfile._install(session, "e2e", "gpu-host")
    *profile_calls, own = session.calls
    assert profile_calls and all(call[-2:] == held for call in profile_calls), session.calls
    assert own == ("-e", ".", "--no-deps")
    assert noxfile._posargs(_Session(["--no-lock", "--gpus", "8"])) == ["--gpus", "8"]

    fresh = _Session(["--no-lock"])
    noxfile._install(fresh, "cpu")
    assert not any("-c" in call for call in fresh.calls)
    monkeypatch.setenv(constraints.NO_LOCK_ENV, "1")
    env_fresh = _Session([])
    noxfile._install(env_fresh, "cpu")
    assert not any("-c" in call for call in env_fresh.calls)


@pytest.mark.parametrize("python", constraints.PYTHONS)
def test_the_repository_locks_pin_every_requirement_of_every_profile(python):
    tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")
    from ci.registry.profiles import names, requirements

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    pinned = {line.split("==")[0].lower().replace("_", "-"): line.split("==")[1]
              for line in constraints.pins(constraints.constraints_path(REPO, python).read_text())}
    for profile in names(pyproject):  # dependency groups (the sessions' profiles) and extras
        for req in requirements(pyproject, profile):
            name = req.split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip().lower().replace("_", "-")
            assert name in pinned, f"{name} ({profile}) is not in constraints/py{python}.txt: run python -m ci lock"
    assert pinned["torch"] == "2.13.0"  # admits the CPU build 2.13.0+cpu


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
