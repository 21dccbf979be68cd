"""`changed --affected` and the static import graph behind it, on real files and repositories."""

import ast
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _gitrepo import Clone, pytest_file

from ci.select.changed import changed_entries, main
from ci.select.import_graph import (
    affected_chains,
    build_graph,
    chains_to,
    describe_chain,
    import_statements,
    module_name,
)

NUM_GPUS = 0

E2E = ("from slime.backends import loss\n\nNUM_GPUS = 8\n\n\ndef execute():\n    loss.run()\n\n\n"
       'if __name__ == "__main__":\n    execute()\n')

MAIN_FILES = {
    "pyproject.toml": "[project]\nname = 'x'\n",
    "README.md": "hello\n",
    "slime/__init__.py": "",
    "slime/utils/__init__.py": "",
    "slime/utils/ppo_utils.py": "def kl():\n    return 0.0\n",
    "slime/backends/__init__.py": "",
    "slime/backends/loss.py": "from slime.utils.ppo_utils import kl\n\n\ndef run():\n    kl()\n",
    "slime/backends/rel.py": "from ..utils import ppo_utils\n",
    "slime/rewards/__init__.py": "",
    "slime/rewards/math.py": "def grade():\n    return 1\n",
    "slime/lazy.py": "def late():\n    import slime.rewards.math\n    return slime.rewards.math\n",
    "tests/test_loss.py": pytest_file(body="from slime.backends import loss"),
    "tests/utils/test_rel.py": pytest_file(body="import slime.backends.rel as rel"),
    "tests/test_math.py": pytest_file(body="from slime.rewards.math import grade"),
    "tests/test_lazy.py": pytest_file(body="from slime import lazy"),
    "tests/test_agent/_fakes.py": "class FakeServer:\n    pass\n",
    "tests/test_agent/test_adapter.py": pytest_file(body="from _fakes import FakeServer"),
    "tests/e2e/test_train.py": E2E,
}

CPU_TIER = {"tests/test_loss.py", "tests/utils/test_rel.py", "tests/test_math.py",
            "tests/test_lazy.py"}


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Clone:
    clone = Clone.on_feature_branch(tmp_path_factory.mktemp("template"), MAIN_FILES)
    return clone


@pytest.fixture
def repo(template: Clone, tmp_path: Path) -> Clone:
    return Clone.copy_of(template, tmp_path)


def affected(root: Path) -> dict[str, tuple[int, str]]:
    entries = changed_entries(root, affected=True, warn=pytest.fail)
    return {e.path: (e.num_gpus, e.why) for e in entries}


def test_two_step_import_chain_is_explained(repo: Clone) -> None:
    repo.commit("tune kl", {"slime/utils/ppo_utils.py": "def kl():\n    return 1.0\n"})
    assert affected(repo.root) == {
        "tests/test_loss.py": (0, "imports slime.utils.ppo_utils via slime.backends.loss"),
        "tests/utils/test_rel.py": (0, "imports slime.utils.ppo_utils via slime.backends.rel"),
        "tests/e2e/test_train.py": (8, "imports slime.utils.ppo_utils via slime.backends.loss"),
    }
    # Without --affected a source change selects no test at all.
    assert changed_entries(repo.root, warn=pytest.fail) == []


def test_function_local_import_and_test_helpers_count(repo: Clone) -> None:
    repo.commit("grade", {"slime/rewards/math.py": "def grade():\n    return 2\n",
                          "tests/test_agent/_fakes.py": "class FakeServer:\n    port = 1\n"})
    assert affected(repo.root) == {
        "tests/test_math.py": (0, "imports slime.rewards.math"),
        "tests/test_lazy.py": (0, "imports slime.rewards.math via slime.lazy"),
        "tests/test_agent/test_adapter.py": (0, "imports tests/test_agent/_fakes.py"),
    }


def test_edited_wins_over_affected(repo: Clone) -> None:
    repo.commit("both", {"slime/backends/loss.py": "def run():\n    pass\n",
                         "tests/test_loss.py": pytest_file(body="from slime.backends import loss\n"
                                                                "X = 1")})
    result = affected(repo.root)
    assert result["tests/test_loss.py"] == (0, "edited")
    assert result["tests/e2e/test_train.py"] == (8, "imports slime.backends.loss")
    assert "tests/utils/test_rel.py" not in result  # rel.py does not import loss


def test_deleted_module_still_selects_its_importers(repo: Clone) -> None:
    repo.git("rm", "--quiet", "slime/rewards/math.py")
    repo.commit("drop math")
    assert set(affected(repo.root)) == {"tests/test_math.py", "tests/test_lazy.py"}


@pytest.mark.parametrize("path", ["pyproject.toml", "tests/conftest.py", "noxfile.py",
                                  "ci/registry/repo_suites.py"])
def test_global_file_selects_the_whole_cpu_tier(repo: Clone, path: str) -> None:
    repo.commit("global", {path: "# changed\n"})
    result = affected(repo.root)
    assert set(result) == CPU_TIER  # cpu_unit: not e2e, not the agent tier
    assert {why for _, why in result.values()} == {f"affects everything ({path})"}
    assert changed_entries(repo.root, warn=pytest.fail) == []


def test_global_change_plus_source_change(repo: Clone) -> None:
    repo.commit("both", {"pyproject.toml": "# v2\n", "tests/test_agent/_fakes.py": "X = 1\n"})
    result = affected(repo.root)
    assert set(result) == {*CPU_TIER, "tests/test_agent/test_adapter.py"}
    assert result["tests/test_agent/test_adapter.py"][1] == "imports tests/test_agent/_fakes.py"


ADOPTED = """from ci.suites import Entry, Suite
SUITES = (Suite(name="cpu_unit", tier="cpu", purpose="p", profile="cpu",
                entries=(Entry(path="tests/test_loss.py"), Entry(path="tests/test_math.py"))),)
"""


def test_affected_after_a_rename_the_registry_has_not_caught_up_with(repo: Clone) -> None:
    # An explicit registry (as `slime-ci adopt` writes) still names the old path; a global
    # change makes --affected select the whole CPU list. It used to stop with "registered
    # file ... does not exist"; now the missing path is left out with a warning.
    repo.commit("registry", {".slime-ci/suites.py": ADOPTED})
    repo.git("push", "--quiet", "origin", "feature:main")
    repo.git("fetch", "--quiet", "origin")
    repo.git("mv", "tests/test_math.py", "tests/test_math_v2.py")
    repo.commit("rename, and touch the packaging", {"pyproject.toml": "# v2\n"})
    warnings: list[str] = []
    entries = changed_entries(repo.root, affected=True, warn=warnings.append)
    assert {e.path for e in entries} == {"tests/test_loss.py", "tests/test_math_v2.py"}
    assert warnings == ["cpu_unit: registered file tests/test_math.py does not exist in this checkout "
                        "(renamed or deleted on this branch?); left out; `python -m ci audit` reports it"]
    plain = changed_entries(repo.root, warn=pytest.fail)
    assert [e.path for e in plain] == ["tests/test_math_v2.py"]


def test_docs_change_selects_nothing(repo: Clone, capsys: pytest.CaptureFixture[str]) -> None:
    repo.commit("docs", {"README.md": "more\n", "slime/data/table.json": "{}"})
    assert main(["--root", str(repo.root), "--affected"]) == 0
    assert "nothing to run" in capsys.readouterr().out


def test_module_names() -> None:
    assert module_name("slime/utils/ppo_utils.py") == "slime.utils.ppo_utils"
    assert module_name("slime/utils/__init__.py") == "slime.utils"
    assert module_name("ci/select/changed.py") == "ci.select.changed"
    assert module_name("tests/test_x.py") is None
    assert module_name("slime/data/table.json") is None
    assert module_name("slime/my-file.py") is None


def imported(source: str | bytes) -> list[str]:
    data = source.encode() if isinstance(source, str) else source
    found = []
    for node in import_statements(data):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        else:
            found += [f"{'.' * node.level}{node.module or ''}:{a.name}" for a in node.names]
    return found


def test_import_statements_follow_continuations_and_fall_back() -> None:
    assert imported(
        "import a.b as c, d\n"
        "from e import (\n    f,  # (\n    g,\n)\n"
        "from h import i, \\\n    j\n"
        "def k():\n    from . import l\n"
        "x = 'import m'  # not a statement start\n"
    ) == ["a.b", "d", "e:f", "e:g", "h:i", "h:j", ".:l"]
    # A docstring line that looks like an import start but is prose: the whole file is read.
    prose = '"""Doc.\n\nfrom time to time we import n.\n"""\nimport o\nif True:\n    import p\n'
    assert imported(prose) == ["o", "p"]
    # An encoding cookie is honoured by the fallback.
    latin = "# -*- coding: latin-1 -*-\nS = 'é'\nimport q\nfrom é import r\n".encode("latin-1")
    assert imported(latin) == ["q", "é:r"]
    with pytest.raises(SyntaxError):
        import_statements(b"import s\nfrom (\n")


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")


def test_graph_resolves_every_import_form(tmp_path: Path) -> None:
    write(tmp_path, {
        "slime/__init__.py": "",
        "slime/a/__init__.py": "from . import b\n",
        "slime/a/b.py": "from .c import thing\nfrom .. import top\n",
        "slime/a/c.py": "try:\n    import slime.d as d\nexcept ImportError:\n    d = None\n",
        "slime/top.py": (
            "from typing import TYPE_CHECKING\nimport os\n"
            "if TYPE_CHECKING:\n    from slime.a import c\n"
            "class K:\n    from slime.a.b import *\n"
            "def f(x):\n    match x:\n        case 1:\n            import slime.d\n"
        ),
        "slime/d.py": "import slime.top\n",  # a cycle: d -> top -> d
        "slime/broken.py": "def (:\n",
        "ci/x.py": "from slime import a\n",
        "tests/x/_helper/__init__.py": "",
        "tests/x/test_h.py": "import _helper\nimport _missing\n",
    })
    edges = build_graph(tmp_path).imports
    assert edges["slime/a/__init__.py"] == {"slime/__init__.py", "slime/a/b.py"}
    assert edges["slime/a/b.py"] == {"slime/__init__.py", "slime/a/__init__.py", "slime/a/c.py",
                                     "slime/top.py"}
    assert edges["slime/a/c.py"] == {"slime/__init__.py", "slime/d.py"}
    assert edges["slime/top.py"] == {"slime/__init__.py", "slime/a/__init__.py", "slime/a/c.py",
                                     "slime/a/b.py", "slime/d.py"}
    assert edges["slime/broken.py"] == frozenset()
    assert edges["ci/x.py"] == {"slime/__init__.py", "slime/a/__init__.py"}
    assert edges["tests/x/test_h.py"] == {"tests/x/_helper/__init__.py"}


def test_chains_are_shortest_and_survive_cycles(tmp_path: Path) -> None:
    write(tmp_path, {
        "slime/__init__.py": "",
        "slime/p.py": "import slime.q\n",
        "slime/q.py": "import slime.p\nimport slime.r\n",
        "slime/r.py": "",
        "tests/test_long.py": "import slime.p\n",
        "tests/test_short.py": "import slime.q\nimport slime.p\n",
    })
    chains = chains_to(build_graph(tmp_path), ["slime/r.py"])
    assert chains["tests/test_short.py"] == ("tests/test_short.py", "slime/q.py", "slime/r.py")
    assert chains["tests/test_long.py"] == ("tests/test_long.py", "slime/p.py", "slime/q.py",
                                            "slime/r.py")
    assert describe_chain(chains["tests/test_long.py"]) == "imports slime.r via slime.p → slime.q"
    assert "slime/r.py" not in chains
    assert "slime/__init__.py" not in chains  # nothing imports r through the package



def random_repository(root: Path, rng: random.Random) -> list[str]:
    """Packages, subpackages, modules and tests importing each other in every form."""
    modules = ["slime", "slime.a", "slime.a.x", "slime.b", "slime.b.y", "ci"]
    modules += [f"{rng.choice(modules[:6])}.m{i}" for i in range(30)]
    packages = {m.rpartition(".")[0] for m in modules} | {"slime", "ci"}

    def path(module: str) -> str:
        rel = module.replace(".", "/")
        return f"{rel}/__init__.py" if module in packages else f"{rel}.py"

    def statement(importer: str, target: str) -> str:
        own = importer if importer in packages else importer.rpartition(".")[0]
        parent, _, leaf = target.rpartition(".")
        forms = [f"import {target}", f"from {parent} import {leaf}" if parent else
                 f"import {target}"]
        if own and parent == own:
            forms.append(f"from . import {leaf}")
        if own and target.startswith(own + ".") and parent != own:
            forms.append(f"from .{target[len(own) + 1:]} import thing")
        return rng.choice(forms)

    files: dict[str, str] = {}
    for i, module in enumerate(modules):
        older = modules[:i]
        lines = [statement(module, t) for t in rng.sample(older, min(2, len(older)))]
        files[path(module)] = "\n".join(lines) + "\n"
    for i in range(12):
        files[f"tests/t{i % 3}/_h{i}.py"] = f"import {rng.choice(modules)}\n"
        body = [f"import {rng.choice(modules)}", f"import _h{rng.randrange(12)}"]
        files[f"tests/t{i % 3}/test_{i}.py"] = "\n".join(body) + "\n"
    write(root, files)
    return sorted(files)


@pytest.mark.parametrize("seed", range(4))
def test_targeted_search_selects_what_the_whole_graph_does(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    files = random_repository(tmp_path, rng)
    graph = build_graph(tmp_path)
    for _ in range(15):
        changed = rng.sample(files, rng.randint(1, 3))
        everything = chains_to(graph, changed)
        targeted = affected_chains(tmp_path, changed)
        tests = {n for n in everything if n.startswith("tests/") and "/test_" in n}
        assert tests == {n for n in targeted if n.startswith("tests/") and "/test_" in n}
        assert all(len(targeted[n]) >= len(everything[n]) for n in tests)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
