"""`U` (command_utils) is a facade over its private modules: what they define reaches U.

Scripts import U alone, so a helper added to `_<concern>.py` and not re-exported would be
out of their reach; and a name replaced on U must still reach the helpers that use it.
"""

import ast
import importlib
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

import slime.utils.external_utils.command_utils as U
from ci.registry.u_files import FACADE, U_DIR, U_MODULES

NUM_GPUS = 0
PACKAGE = U_DIR.replace("/", ".")


def _defined(path: Path) -> set[str]:
    """The names a module's top level binds itself (functions, classes, assignments), not imports."""
    names = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign | ast.AugAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def _exported(facade: Path) -> set[str]:
    """The facade's `__all__`, read from its source."""
    for node in ast.parse(facade.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__"
                                                for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{facade.name} has no __all__")


def missing_from_facade(folder: Path) -> list[str]:
    """`<module>:<name>` for each public name of a private module that U's `__all__` lacks."""
    exported = _exported(folder / FACADE)
    return [f"{module}:{name}" for module in U_MODULES
            for name in sorted(_defined(folder / module))
            if not name.startswith("_") and name not in exported]


def test_every_name_in_all_resolves_once():
    assert len(U.__all__) == len(set(U.__all__))
    assert [name for name in U.__all__ if not hasattr(U, name)] == []


def test_no_public_name_of_a_private_module_is_missing_from_u():
    assert missing_from_facade(REPO / U_DIR) == []
    # And each is the module's own object, so U and the module never disagree.
    different = []
    for module in U_MODULES:
        loaded = importlib.import_module(f"{PACKAGE}.{Path(module).stem}")
        different += [f"{module}:{name}" for name in _defined(REPO / U_DIR / module)
                      if not name.startswith("_") and getattr(U, name) is not getattr(loaded, name)]
    assert different == []


def test_a_helper_added_but_not_re_exported_is_caught(tmp_path):
    for name in (FACADE, *U_MODULES):
        shutil.copy(REPO / U_DIR / name, tmp_path / name)
    with (tmp_path / "_wandb.py").open("a", encoding="utf-8") as fh:
        fh.write("\n\ndef wandb_offline_args() -> str:\n    return '--wandb-mode offline'\n")
    assert missing_from_facade(tmp_path) == ["_wandb.py:wandb_offline_args"]


def test_u_defines_nothing_of_its_own():
    # The code lives in the private modules, where the checks above look for it.
    assert _defined(REPO / U_DIR / FACADE) == {"__all__"}


def _imports_of(path: Path) -> set[str]:
    """The modules a file imports, relative ones by their name in U's folder, at any depth."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            found.add(base)
            if node.level and not base:  # `from . import command_utils`
                found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name.rsplit(".", 1)[-1] for alias in node.names}
    return found


def test_the_facade_imports_its_parts_and_no_part_imports_the_facade():
    # _train imported command_utils (inside execute_train) to find the names tests replace on
    # U: a circle, hidden only by the import's place. The facade registers itself instead.
    stem = Path(FACADE).stem
    circles = [module for module in U_MODULES if stem in _imports_of(REPO / U_DIR / module)]
    assert circles == []
    assert {Path(m).stem for m in U_MODULES} <= _imports_of(REPO / U_DIR / FACADE)


def test_names_replaced_on_u_reach_execute_train(tmp_path, monkeypatch):
    # The cluster and the GPUs, which tests replace on U as they did when U was one module.
    seen = {}

    def fake_submit(address, *, entrypoint, env_vars, timeout):
        seen["address"], seen["env_vars"] = address, env_vars
        return "job-7"

    nvlink = U.check_has_nvlink()  # this machine's answer; the replacement says the other
    monkeypatch.setattr(U, "submit_and_wait", fake_submit)
    monkeypatch.setattr(U, "check_has_nvlink", lambda: not nvlink)
    env = {"SLIME_SCRIPT_EXTERNAL_RAY": "127.0.0.1:9", "PATH": "/usr/bin:/bin"}
    assert U.execute_train([], 1, train_script=str(tmp_path / "t.py"), env=env) == "job-7"
    assert seen["address"] == "http://127.0.0.1:9"
    assert seen["env_vars"]["NCCL_NVLS_ENABLE"] == ("0" if nvlink else "1")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
