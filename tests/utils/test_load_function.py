"""`load_function`: plugin paths in both spellings, and errors that say what is wrong."""

import sys
import textwrap

import pytest

from slime.utils.misc import PluginLoadError, load_function

NUM_GPUS = 0


@pytest.fixture
def plugin_pkg(tmp_path, monkeypatch):
    pkg = tmp_path / "userpkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "mod.py").write_text(textwrap.dedent("""
        VALUE = 3

        def fn(x):
            return x + 1

        class Tool:
            @staticmethod
            def run(x):
                return x * 2
    """))
    (pkg / "broken.py").write_text("import a_dependency_that_is_not_installed\n\ndef fn(): pass\n")
    (pkg / "raises.py").write_text("raise RuntimeError('config missing')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "userpkg"
    for name in [m for m in sys.modules if m == "userpkg" or m.startswith("userpkg.")]:
        del sys.modules[name]


def test_colon_and_dot_spellings_load_the_same_function(plugin_pkg):
    a = load_function("userpkg.sub.mod:fn")
    b = load_function("userpkg.sub.mod.fn")
    assert a is b
    assert a(1) == 2


def test_class_attribute(plugin_pkg):
    assert load_function("userpkg.sub.mod:Tool.run")(4) == 8
    assert load_function("userpkg.sub.mod.Tool.run")(4) == 8


def test_stdlib_function():
    import os.path

    assert load_function("os.path:join") is os.path.join
    assert load_function("os.path.join") is os.path.join


def test_missing_module(plugin_pkg):
    with pytest.raises(PluginLoadError, match=r"no module named 'userpkg\.nope'"):
        load_function("userpkg.nope:fn")


def test_missing_attribute(plugin_pkg):
    with pytest.raises(PluginLoadError, match="has no attribute 'gone'"):
        load_function("userpkg.sub.mod:gone")


def test_not_callable(plugin_pkg):
    with pytest.raises(PluginLoadError, match="is a int, not a callable"):
        load_function("userpkg.sub.mod:VALUE")


def test_broken_dependency_inside_the_plugin_is_reported_not_masked(plugin_pkg):
    # A missing import inside the user's module must surface, not read as "no such plugin".
    with pytest.raises(PluginLoadError, match="a_dependency_that_is_not_installed"):
        load_function("userpkg.broken:fn")


def test_plugin_raising_at_import_is_wrapped(plugin_pkg):
    with pytest.raises(PluginLoadError, match="raised RuntimeError: config missing"):
        load_function("userpkg.raises:fn")


@pytest.mark.parametrize("path", ["", "fn", "a:b:c", "a..b", ":fn", "mod:", "1mod:fn", None])
def test_malformed_paths(path):
    with pytest.raises(PluginLoadError, match="must look like"):
        load_function(path)


def test_error_is_an_import_error():
    assert issubclass(PluginLoadError, ImportError)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
