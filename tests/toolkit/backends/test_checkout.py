"""Entries import the framework from the checkout being run, even when the runner's Python
has another checkout on its path (two worktrees, one venv).

Checkout A is run; checkout B, with a different `slime/__init__.py`, is what the Python
finds first on its own: through an editable-style `.pth` file in a real venv's
site-packages, or through PYTHONPATH. The entry must still import A's slime. A `.pth`
that pushes B in front of everything (`sys.path.insert(0, ...)`, as old `easy-install.pth`
files did) cannot be overridden by PYTHONPATH: the run is refused in one line naming B.
"""

import json
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, write

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=120, entries=(
            Entry(path="tests/e2e/test_where.py"),
        )),
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests/unit",)),
    )
"""

WHERE = """
    import json, os
    NUM_GPUS = 1

    def execute():
        import slime
        with open(os.environ["RECORD"], "w") as fh:
            json.dump({"who": slime.WHO, "file": slime.__file__}, fh)

    if __name__ == "__main__":
        execute()
"""

UNIT = """
    import json, os
    NUM_GPUS = 0

    def test_where():
        import slime
        with open(os.environ["RECORD"], "w") as fh:
            json.dump({"who": slime.WHO, "file": slime.__file__}, fh)
"""


@pytest.fixture
def trees(tmp_path):
    a = write(tmp_path / "a", {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_where.py": WHERE,
                               "tests/unit/test_where.py": UNIT, "slime/__init__.py": 'WHO = "A"\n'})
    b = write(tmp_path / "b", {"slime/__init__.py": 'WHO = "B"\n'})
    (b / "ci").symlink_to(REPO / "ci")  # B also provides the toolkit: the runner imports it from there
    return a, b


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A real venv (no pip) and its site-packages directory."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(venv)],
                   check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    return python, Path(purelib)


@pytest.fixture
def venv(bare):
    """The venv with an editable-style .pth file holding the given first line; pytest and the
    rest come from this test's own environment, listed after it."""
    python, purelib = bare
    ours = sysconfig.get_paths()["purelib"]

    def make(first_line):
        (purelib / "__editable__other.pth").write_text(f"{first_line}\n{ours}\n")
        return python

    yield make
    (purelib / "__editable__other.pth").unlink(missing_ok=True)


def _run(python, a, *args, env=None, tmp_path):
    record = tmp_path / "record.json"
    clean = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
             "RECORD": str(record), **(env or {})}
    proc = subprocess.run([str(python), "-m", "ci", "run", "--root", str(a), *args], cwd=a, env=clean,
                          capture_output=True, text=True, timeout=180, check=False)
    return proc, (json.loads(record.read_text()) if record.exists() else None)


def test_the_python_alone_finds_the_other_checkout(trees, venv):
    """The premise: without the runner, this Python imports B's slime."""
    a, b = trees
    python = venv(str(b))
    out = subprocess.run([str(python), "-c", "import slime; print(slime.WHO)"], cwd=a / "tests" / "e2e",
                         capture_output=True, text=True, check=True, env={"PATH": "/usr/bin:/bin"})
    assert out.stdout.strip() == "B"


@pytest.mark.parametrize("suite", ["train", "unit"])
def test_entry_imports_the_checkout_run_despite_an_editable_pth(trees, venv, tmp_path, suite):
    a, b = trees
    python = venv(str(b))
    extra = ("--emulate-gpus", "--gpus", "1") if suite == "train" else ()
    proc, seen = _run(python, a, "--suite", suite, *extra, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen == {"who": "A", "file": str(a / "slime" / "__init__.py")}


def test_entry_imports_the_checkout_run_despite_pythonpath(trees, tmp_path):
    a, b = trees
    proc, seen = _run(sys.executable, a, "--suite", "train", "--emulate-gpus", "--gpus", "1",
                      env={"PYTHONPATH": str(b)}, tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert seen is not None and seen["who"] == "A"


def test_dry_run_shows_where_the_framework_comes_from(trees, venv, tmp_path):
    a, b = trees
    python = venv(str(b))
    proc, seen = _run(python, a, "--suite", "train", "--emulate-gpus", "--gpus", "1", "--dry-run",
                      tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"imports slime from {a / 'slime'} (PYTHONPATH starts with {a})" in proc.stdout
    assert seen is None  # nothing ran


def test_a_pth_that_jumps_ahead_of_pythonpath_is_refused(trees, venv, tmp_path):
    a, b = trees
    python = venv(f"import sys; sys.path.insert(0, {str(b)!r})")
    proc, seen = _run(python, a, "--suite", "train", "--emulate-gpus", "--gpus", "1", tmp_path=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert f"entries would import slime from {b / 'slime'}, not from {a / 'slime'}" in lines[0]
    assert seen is None  # refused before anything started
    dry, _ = _run(python, a, "--suite", "train", "--emulate-gpus", "--gpus", "1", "--dry-run",
                  tmp_path=tmp_path)
    assert "REFUSED at run time: slime from elsewhere" in dry.stdout


def test_package_names_come_from_the_root_or_the_command_line(tmp_path):
    from ci.backends import checkout

    root = write(tmp_path, {"mypkg/__init__.py": "", "tests/__init__.py": "", "notes/readme.txt": ""})
    assert checkout.packages(root) == ("mypkg",)
    assert checkout.packages(root, ["other"]) == ("other",)
    assert checkout.pythonpath(root, f"/x:{root}:/y") == f"{root}:/x:/y"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
