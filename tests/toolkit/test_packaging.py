"""The slime-ci wheel is the toolkit alone: installed beside an adopter's `slime`, theirs wins.

A real wheel built from this checkout, installed with pip into a fresh venv; the adopter's
`slime` is a package in tmp_path whose `Sample` differs from ours, put on the path the way
an editable install does and, separately, through PYTHONPATH.
"""

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _ci import REPO
from _wheel import add_to_path, build_wheel, fresh_venv

from ci.registry.u_files import U_FILES

NUM_GPUS = 0

pytestmark = pytest.mark.slow  # one wheel build and one venv for the module: ~10 s


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def adopter(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("adopter")
    pkg = root / "slime"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("WHOSE = 'adopter'\n")
    (pkg / "utils").mkdir()
    (pkg / "utils" / "__init__.py").write_text("")
    (pkg / "utils" / "types.py").write_text("class Sample:\n    class Status:\n        DONE = 'done'\n")
    (root / "tests").mkdir()
    (root / "tests" / "ci").mkdir()  # slime's own tests/ci/ (its GPU lock): no __init__.py
    (root / "tests" / "ci" / "gpu_lock_exec.py").write_text("print('lock')\n")
    return root


@pytest.fixture(scope="module")
def python(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fresh_venv(tmp_path_factory.mktemp("venv") / "v", wheel)


def test_the_wheel_holds_the_toolkit_and_nothing_named_slime(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"ci", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1] + ".dist-info"}, tops
    # Every package of ci/ in the tree is in the wheel (pyproject lists them by name).
    packages = {p.parent.relative_to(REPO).as_posix() for p in (REPO / "ci").rglob("__init__.py")}
    assert {p for p in packages if f"{p}/__init__.py" in names} == packages
    # U travels as package data, for `slime-ci adopt` to write into an adopting repository.
    u = {n.removeprefix("ci/_u/") for n in names if n.startswith("ci/_u/")}
    assert set(U_FILES) <= u, set(U_FILES) - u
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "slime-ci = ci.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()


def test_u_in_the_wheel_imports_through_its_relative_imports(python: Path, tmp_path: Path) -> None:
    # Relative imports inside U: as `ci._u` too it loads its own siblings, never a `slime`
    # (the venv has none; an absolute `slime.utils...` import would fail here).
    code = ("import sys; sys.modules['slime'] = None; import ci._u.command_utils as U; "
            "print(U.execute_train.__module__, U.exec_command.__module__, U.private_head.__module__)")
    done = subprocess.run([str(python), "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin"}, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["ci._u._train", "ci._u._shell", "ci._u.ray_head"]


def _whose(python: Path, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    code = ("import slime, ci; from slime.utils.types import Sample; "
            "print(slime.WHOSE, hasattr(Sample, 'Status'), ci.__file__)")
    return subprocess.run([str(python), "-c", code], cwd=cwd, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", **(env or {})}, timeout=60, check=False)


@pytest.mark.parametrize("how", ["editable", "PYTHONPATH"])
def test_import_slime_is_the_adopters_from_every_directory(python: Path, adopter: Path, how: str,
                                                          tmp_path: Path) -> None:
    env = {}
    if how == "editable":
        add_to_path(python, "__editable__.slime-0.0.1", adopter)
    else:
        env = {"PYTHONPATH": str(adopter)}
    try:
        for cwd in (adopter, adopter / "tests", adopter / "tests" / "ci", tmp_path, Path("/")):
            done = _whose(python, cwd, env)
            assert done.returncode == 0, (cwd, done.stderr)
            whose, has_status, ci_file = done.stdout.split()
            assert (whose, has_status) == ("adopter", "True"), cwd
            # `ci` is the installed toolkit, not the checkout, whatever the directory.
            assert ci_file.startswith(str(python.parent.parent)), (cwd, ci_file)
    finally:
        for pth in python.parent.parent.rglob("__editable__.slime-0.0.1.pth"):
            pth.unlink()


def test_the_console_script_runs_every_command(python: Path, tmp_path: Path) -> None:
    script = python.parent / "slime-ci"
    done = subprocess.run([str(script), "--help"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    from ci.cli import SUBCOMMANDS

    for name in SUBCOMMANDS:
        assert f"  {name} " in done.stdout, name


def test_a_missing_extra_names_the_toolkits_install(python: Path, tmp_path: Path) -> None:
    # The venv has no GitPython: the hint must be right in an adopter's checkout (never `-e .`).
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    done = subprocess.run([str(python.parent / "slime-ci"), "changed", "--root", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == ("error: GitPython is not installed: pip install 'slime-ci[git]' "
                                   "(or pip install GitPython)")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
