"""Contract of plugin paths: both spellings name the same callable, from any importable location.

Default: our reference rollout. Yours:
`SLIME_PLUGIN_PATH=pkg.mod:fn python tests/plugin_contracts/test_path_loading_contract.py`.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from slime.utils.misc import PluginLoadError
from slime.utils.plugin_contracts import DEFAULTS, ENV_PATH, alternate_path, check_plugin_path

NUM_GPUS = 0


@pytest.fixture
def plugin_path():
    return os.environ.get(ENV_PATH) or DEFAULTS[ENV_PATH]


def test_both_spellings_load_the_same_callable(plugin_path):
    assert callable(check_plugin_path(plugin_path))


def test_alternate_path_round_trips():
    assert alternate_path("a.b:c") == "a.b.c"
    assert alternate_path("a.b.c") == "a.b:c"
    assert alternate_path(alternate_path("x.y:z")) == "x.y:z"


def test_every_default_plugin_loads():
    for path in DEFAULTS.values():
        check_plugin_path(path)


def test_plugin_from_a_user_directory_on_pythonpath(tmp_path):
    # As a user runs it: their package lives outside the repo and comes in through PYTHONPATH.
    (tmp_path / "my_rollouts.py").write_text(textwrap.dedent("""
        def custom(args, rollout_id, data_source, evaluation=False):
            return "custom"
    """))
    # Only the loader is imported in the child: the check is about import paths, not torch.
    code = (
        "from slime.utils.misc import load_function;"
        "a = load_function('my_rollouts:custom'); b = load_function('my_rollouts.custom');"
        "assert a is b; print(a(None, 0, None))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "custom"


def test_a_path_to_nothing_fails_loudly():
    with pytest.raises(PluginLoadError):
        check_plugin_path("slime.rollout.reference:does_not_exist")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
