"""Install profiles: extras expand once and in order, torch is always pinned and installed alone."""

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.registry.profiles import TORCH_INDEX_ENV, names, requirements, split_torch, torch_install_args

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs Python 3.11+")

NUM_GPUS = 0

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROFILES = sorted(names(PYPROJECT))


def test_self_references_expand_once_in_order():
    fake = {"project": {"optional-dependencies": {
        "base": ["torch==2.13.0", "numpy"],
        "mid": ["slime-ci[base]", "ray"],
        "top": ["slime-ci[mid,base]", "numpy", "nox"],
    }}}
    assert requirements(fake, "top") == ["torch==2.13.0", "numpy", "ray", "nox"]


def test_dependency_groups_include_groups_and_extras():
    # This repository's session profiles are groups; the toolkit's own needs stay extras.
    fake = {"dependency-groups": {"base": ["torch==2.13.0", "numpy"],
                                  "top": [{"include-group": "base"}, "slime-ci[git]", "nox"]},
            "project": {"optional-dependencies": {"git": ["GitPython>=3.1.40"]}}}
    assert requirements(fake, "top") == ["torch==2.13.0", "numpy", "GitPython>=3.1.40", "nox"]
    assert names(fake) == ["base", "top", "git"]


def test_the_extras_name_only_the_toolkits_own_needs():
    # The wheel's metadata carries the extras: none may name the framework's stack.
    extras = PYPROJECT["project"]["optional-dependencies"]
    named = {re.split(r"[\[<>=!~ ;]", r, maxsplit=1)[0].lower() for reqs in extras.values() for r in reqs}
    # slime-ci[history] inside gpu-host is the toolkit naming its own extra.
    assert named <= {"gitpython", "jinja2", "nvidia-ml-py", "sqlalchemy", "psycopg", "slime-ci"}, named


def test_unknown_profile_names_the_known_ones():
    with pytest.raises(KeyError, match="known: cpu"):
        requirements(PYPROJECT, "gpu")


@pytest.mark.parametrize("profile", PROFILES)
def test_no_profile_can_pull_an_unpinned_torch(profile):
    # An unpinned torch resolves to a multi-GB CUDA build; every profile pins it exactly.
    torch, _ = split_torch(requirements(PYPROJECT, profile))
    assert all(re.fullmatch(r"torch==\d+\.\d+\.\d+", t) for t in torch), torch


def test_torch_is_split_out_and_pointed_at_the_cpu_index():
    torch, rest = split_torch(["numpy", "torch==2.13.0", "torchvision-extra", "Torch >= 2"])
    assert torch == ["torch==2.13.0", "Torch >= 2"]
    assert rest == ["numpy", "torchvision-extra"]
    assert torch_install_args(["torch==2.13.0"], {}) == ["torch==2.13.0"]
    assert torch_install_args(["torch==2.13.0"], {TORCH_INDEX_ENV: "https://idx/cpu"}) == [
        "torch==2.13.0", "--index-url", "https://idx/cpu"]
    assert torch_install_args([], {TORCH_INDEX_ENV: "https://idx/cpu"}) == []


def test_every_profile_the_noxfile_installs_exists():
    used = set(re.findall(r'_install\(session(?:, "[a-z-]+")*', (REPO / "noxfile.py").read_text()))
    names = {n for call in used for n in re.findall(r'"([a-z-]+)"', call)}
    assert names, "no profile found in noxfile.py"
    assert names <= set(PROFILES), names - set(PROFILES)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
