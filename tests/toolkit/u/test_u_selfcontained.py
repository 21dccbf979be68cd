"""`U` needs nothing of the toolkit, its generated copies stay in sync, and it behaves as slime's.

Each difference from the original helpers that a script can notice is either gone (tested
here) or listed in docs/adopting.md, "U" (tested where it is implemented).
"""

import ast
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

import slime.utils.external_utils.command_utils as U
from ci.registry.u_files import GENERATED, U_DIR, U_FILES, U_MODULES, banner, generated, packaged

NUM_GPUS = 0
# What U imports only inside the helpers that need it: the original's torch, ray and
# huggingface_hub, and psutil, with which the private Ray head finds its processes.
DEFERRED = {"torch", "ray", "huggingface_hub", "psutil"}


def _imported(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_nothing_under_slime_imports_the_toolkit():
    offenders = {str(p.relative_to(REPO)): sorted(m for m in _imported(p) if m.split(".")[0] == "ci")
                 for p in (REPO / "slime").rglob("*.py")}
    assert {k: v for k, v in offenders.items() if v} == {}


def _u_imports(path: Path) -> tuple[set[str], set[str], set[str]]:
    """(top-level packages imported at module level, those imported inside a block, siblings)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top: set[str] = set()
    deferred: set[str] = set()
    siblings: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level:
            assert node.level == 1, f"{path.name}: import from {'.' * node.level}: U is one folder"
            siblings |= {node.module} if node.module else {a.name for a in node.names}
            continue
        if isinstance(node, ast.Import):
            names = {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = {node.module.split(".")[0]}
        else:
            continue
        (top if node in tree.body else deferred).update(names)
    return top, deferred, siblings


def test_each_file_of_u_imports_only_the_stdlib_and_its_siblings():
    # Siblings relatively (so U also loads as the wheel's `ci._u`), never through `slime`
    # or `ci`; a third-party package only inside the helper that needs it.
    stems = {Path(name).stem for name in U_FILES}
    found = {}
    for name in U_FILES:
        top, deferred, siblings = _u_imports(REPO / U_DIR / name)
        found[name] = (sorted(top - sys.stdlib_module_names),
                       sorted(deferred - sys.stdlib_module_names - DEFERRED), sorted(siblings - stems))
    assert {k: v for k, v in found.items() if v != ([], [], [])} == {}


def test_the_list_of_us_modules_is_the_folder():
    # A new `_<concern>.py` that U_MODULES lacks would be missing from the wheel and adopt.
    modules = [p.name for p in (REPO / U_DIR).glob("_*.py") if not p.name.startswith("__")]
    assert sorted(U_MODULES) == sorted(modules)


def test_u_imports_with_no_toolkit_anywhere(tmp_path):
    # U's files alone, in an adopter's slime of empty packages, `ci` made unimportable: U
    # and the private head helper import from any directory, so U_FILES is all they need.
    package = tmp_path / U_DIR
    package.mkdir(parents=True)
    for folder in ("slime", "slime/utils", U_DIR):
        (tmp_path / folder / "__init__.py").write_text("")
    for name in U_FILES:
        shutil.copy(REPO / U_DIR / name, package / name)
    (tmp_path / "tests" / "ci").mkdir(parents=True)  # slime's tests/ci/ folder, no __init__.py
    code = ("import sys; sys.modules['ci'] = None; "
            "from slime.utils.external_utils import command_utils as U, ray_head; "
            "print(U.CommandFailed.__mro__[1].__name__, ray_head.PORT_BLOCK_SIZE)")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(tmp_path)}
    for cwd in (tmp_path, tmp_path / "tests", tmp_path / "tests" / "ci"):
        done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == ["CalledProcessError", "200"]


def test_the_copies_beside_u_are_generated_from_the_toolkit():
    for name, source in GENERATED.items():
        text = (REPO / U_DIR / name).read_text(encoding="utf-8")
        assert text == banner(source) + (REPO / source).read_text(encoding="utf-8"), name
    assert set(packaged()) == set(U_FILES)


def test_workflows_check_catches_drift_in_a_copy(tmp_path):
    root = tmp_path / "checkout"
    shutil.copytree(REPO, root, ignore=shutil.ignore_patterns(".git", ".nox", ".ci-cache", "__pycache__"))
    target = root / U_DIR / "proc_utils.py"
    target.write_text(target.read_text() + "\nEDITED_BY_HAND = True\n")
    run = [sys.executable, "-m", "ci", "workflows", "--root", str(root)]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run([*run, "--check"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 1
    assert f"{U_DIR}/proc_utils.py" in done.stderr and "-EDITED_BY_HAND = True" in done.stdout
    # A change of the source reaches the copy on the next write.
    source = root / GENERATED["port_utils.py"]
    source.write_text(source.read_text().replace("PORT_BLOCK = 200", "PORT_BLOCK = 240"))
    subprocess.run(run, cwd=root, env=env, capture_output=True, check=True, timeout=120)
    assert "PORT_BLOCK = 240" in (root / U_DIR / "port_utils.py").read_text()
    assert generated(root) == {p: (root / p).read_text() for p in generated(root)}


def test_command_failed_is_a_called_process_error():
    with pytest.raises(subprocess.CalledProcessError) as info:
        U.exec_command("echo out; exit 3", capture_output=True)
    assert info.value.returncode == 3 and info.value.cmd == "echo out; exit 3"
    assert "out" in info.value.output and "exited with 3" in str(info.value)


def test_the_job_env_keeps_the_originals_variables():
    env = U.train_env_vars(env={}, nvlink=False, master_addr="127.0.0.1", master_port=None)
    assert env["RAY_USE_UVLOOP"] == "0" and env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"


def test_a_train_args_string_reaches_the_jobs_shell_as_written(tmp_path, monkeypatch):
    # The original put train_args on a bash command line: `$VAR` expands, quotes group.
    seen = {}

    def fake_submit(address, *, entrypoint, env_vars, timeout):
        seen["entrypoint"] = entrypoint
        return "job-1"

    monkeypatch.setattr(U, "submit_and_wait", fake_submit)
    monkeypatch.setenv("SLIME_SCRIPT_EXTERNAL_RAY", "http://127.0.0.1:9")
    U.execute_train("--lr $LR --name 'two words'", 1, None, train_script=str(tmp_path / "t.py"))
    script = tmp_path / "argv.py"
    script.write_text("import json, sys; print(json.dumps(sys.argv[1:]))")
    shell = seen["entrypoint"].replace(str(tmp_path / "t.py"), str(script))
    done = subprocess.run(["bash", "-c", shell], env={**os.environ, "LR": "0.5"}, capture_output=True,
                          text=True, check=True, timeout=60)
    assert done.stdout.strip() == '["--lr", "0.5", "--name", "two words"]'


def test_datasets_come_through_the_hf_command_as_the_original(tmp_path):
    # A stand-in for the `hf` CLI, which needs the network this machine lacks: it records
    # its argv. Offline runs are served from the hub cache instead (test_command_utils).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    hf = bindir / "hf"
    hf.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'argv.txt'}\n")
    hf.chmod(hf.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "SLIME_CI_DATASETS_DIR": str(tmp_path / "datasets")}
    assert U.hf_download_dataset("org/gsm8k", env=env) == tmp_path / "datasets" / "gsm8k"
    assert (tmp_path / "argv.txt").read_text().split() == [
        "download", "--repo-type", "dataset", "org/gsm8k", "--local-dir", str(tmp_path / "datasets" / "gsm8k")]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
