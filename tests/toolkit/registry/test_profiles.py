"""Install profiles: extras expand once and in order, torch is always pinned and installed alone."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.registry.profiles import (
    TORCH_INDEX_ENV,
    names,
    pip_find_links,
    requirements,
    split_torch,
    torch_install_args,
)

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


def test_pip_find_links_are_read_from_every_source_pip_lists():
    listed = "\n".join(["global.cert='/etc/ssl/certs/ca.crt'",
                        "global.find-links='/opt/wheels /srv/more'",
                        "global.extra-index-url='file:///opt/pypi/simple'",
                        ":env:.find-links='/opt/wheels'",
                        "user.find-links=\"/home/me/wheels\""])
    assert pip_find_links(listed) == ["/opt/wheels", "/srv/more", "/home/me/wheels"]
    assert pip_find_links("global.index-url='https://idx'\n") == []
    assert torch_install_args(["torch==2.13.0"], {}, find_links=["/a", "/b"]) == [
        "torch==2.13.0", "--find-links", "/a", "--find-links", "/b"]


def test_uv_installs_the_build_pip_is_configured_to_find(tmp_path):
    """The path a session takes with uv: pip's own configuration (a real `pip config list`)
    names the folder, and uv, which does not read that configuration, installs from it."""
    uv = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed here (the dev profile brings it)")
    project = tmp_path / "proj"
    (project / "localbuild").mkdir(parents=True)
    (project / "localbuild" / "__init__.py").write_text("WHERE = 'the configured folder'\n")
    (project / "pyproject.toml").write_text('[project]\nname = "localbuild"\nversion = "1.0+cpu"\n'
                                            '[build-system]\nrequires = ["setuptools"]\n'
                                            'build-backend = "setuptools.build_meta"\n')
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(project), "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(wheels)], check=True, timeout=120)
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nfind-links = {wheels}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": str(conf)}
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            env=env, check=True, timeout=60).stdout
    links = pip_find_links(listed)
    assert str(wheels) in links, listed
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "-q", str(venv)], check=True, timeout=60, env=env)
    install = [uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "--no-index"]
    without = subprocess.run([*install, *torch_install_args(["localbuild==1.0"], {})], env=env,
                             capture_output=True, text=True, timeout=60)
    assert without.returncode != 0, "uv found the build without being told where: the test proves nothing"
    subprocess.run([*install, *torch_install_args(["localbuild==1.0"], {}, find_links=links)], env=env,
                   check=True, timeout=60)
    seen = subprocess.run([str(venv / "bin" / "python"), "-c", "import localbuild; print(localbuild.WHERE)"],
                          capture_output=True, text=True, check=True, timeout=60).stdout
    assert seen.strip() == "the configured folder"


def test_every_profile_the_noxfile_installs_exists():
    used = set(re.findall(r'_install\(session(?:, "[a-z-]+")*', (REPO / "noxfile.py").read_text()))
    names = {n for call in used for n in re.findall(r'"([a-z-]+)"', call)}
    assert names, "no profile found in noxfile.py"
    assert names <= set(PROFILES), names - set(PROFILES)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
