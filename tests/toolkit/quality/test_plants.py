"""`python -m ci plants`: a planted break counts as caught only when its entry fails for its
stated reason; a pass, another failure, a timeout or a stale patch is a miss. Checked on a
real git checkout in tmp_path (a CPU suite, real `ci run` processes), then the repository's
own CI subset (PLANTS_CI) on the real framework.
"""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

from ci.quality import plants

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Suite

    SUITES = (Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
                    exclude=("tests/e2e",), timeout=600),)
"""

TOY = """
    import os
    import time


    def add(a, b):
        if os.environ.get("TOY_SLOW"):
            time.sleep(900)
        return a + b
"""

TEST = """
    from toy import add

    NUM_GPUS = 0


    def test_add():
        assert add(2, 2) == 4, "add is broken"
"""


def _git(root, *args):
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True,
                   env={"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com", "GIT_COMMITTER_NAME": "t",
                        "GIT_COMMITTER_EMAIL": "t@example.com", "HOME": str(root), "PATH": "/usr/bin:/bin"})


def _plant(root, name, header, old, new):
    """Write a plant made the way a maintainer makes one: edit, `git diff`, revert."""
    path = root / "toy" / "__init__.py"
    text = path.read_text()
    path.write_text(text.replace(old, new, 1))
    diff = subprocess.run(["git", "diff"], cwd=root, capture_output=True, text=True, check=True).stdout
    path.write_text(text)
    out = root / "tests" / "e2e" / "plants" / "test_add" / f"{name}.patch"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(header + "\n\n" + diff)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = write(tmp_path_factory.mktemp("toy"), {"ci/registry/repo_suites.py": REGISTRY, "toy/__init__.py": TOY,
                                                  "tests/test_add.py": TEST})
    _git(root, "init", "-q")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "toy")
    head = "suite: unit\nonly: tests/test_add.py\n"
    _plant(root, "sign", head + "reason: add is broken", "return a + b", "return a - b")
    _plant(root, "harmless", head + "reason: add is broken", "import time", "import time  # a comment")
    _plant(root, "other-reason", head + "reason: add overflowed", "return a + b", "return a - b")
    # Its own timeout, below the command's: a plant whose break hangs need not cost --timeout.
    _plant(root, "slow", head + "reason: add is broken\ntimeout: 4", 'os.environ.get("TOY_SLOW")', "True")
    stale = root / "tests" / "e2e" / "plants" / "test_add" / "stale.patch"
    stale.write_text((root / "tests/e2e/plants/test_add/sign.patch").read_text().replace("a + b", "a * b"))
    return root


def _plants(toy, *args, timeout=300):
    return run_ci("plants", "--root", str(toy), *args, timeout=timeout)


def test_each_verdict_for_its_reason(toy):
    # 45 s per plant: a toy run takes ~5 s on a quiet box, over 20 s at load 40. The slow
    # plant sleeps far past it; its own `timeout: 4` ends it, not the 45 s.
    proc = _plants(toy, "--timeout", "45", timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("test_add ")}
    assert set(rows) == {"sign", "harmless", "other-reason", "slow", "stale"}
    assert "caught" in rows["sign"] and "add is broken" in rows["sign"]
    assert "MISSED" in rows["harmless"] and "the entry passed with the break in place" in rows["harmless"]
    assert "MISSED" in rows["other-reason"] and "failed, but not for 'add overflowed'" in rows["other-reason"]
    assert "MISSED" in rows["slow"] and "timed out" in rows["slow"]
    assert float(rows["slow"].split()[-1].rstrip("s")) < 45, rows["slow"]
    assert "MISSED" in rows["stale"] and "patch does not apply" in rows["stale"]
    assert "plants: 1 caught, 4 missed" in proc.stdout
    # Plants went to scratch copies: the working tree is as committed, and nothing was left running.
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=toy,
                            capture_output=True, text=True, check=True).stdout
    assert status == ""
    assert "return a + b" in (toy / "toy" / "__init__.py").read_text()
    left = subprocess.run(["pgrep", "-f", f"--root {toy}"], capture_output=True, text=True, check=False)
    assert left.stdout.strip() == "", "a plant's run outlived the command"


def test_a_plant_of_several_entries_is_caught_only_when_each_shows_its_reason():
    # The five ckpt layouts under one plant: what each entry's own log says decides.
    reason = ("did not run at the saved param groups' lr",)
    said = "AssertionError: rollout 2 train/lr: 0.0015 vs 0.002: the first update after --load did not run at the saved param groups' lr"
    logs = {f"00{i}-layout{i}.log": f"... {said}\n" for i in range(5)}
    assert plants.judge(1, "ckpt: 0 passed, 5 failed", reason, logs) == (
        True, "all 5 entries: did not run at the saved param groups' lr")
    # One layout failed at start-up instead: the others' reason does not cover for it.
    logs["003-layout3.log"] = "RuntimeError: ray head timed out during its own start-up 3 time(s)\n"
    caught, why = plants.judge(1, "ckpt: 0 passed, 5 failed " + said, reason, logs)
    assert not caught and why.startswith("1 of 5 entries failed, but not for") and why.endswith("003-layout3.log")
    # One entry: the run's output still counts (a reason the runner itself prints).
    assert plants.judge(1, said, reason, {"000-one.log": "Traceback"}) == (True, reason[0])


def test_only_and_exit_zero_when_all_caught(toy):
    proc = _plants(toy, "--only", "test_add/sign")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "plants: 1 caught, 0 missed" in proc.stdout


def test_dry_run_runs_nothing_and_names_stale_patches(toy):
    proc = _plants(toy, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "plants: 5, each on a scratch copy" in proc.stdout
    stale = [ln for ln in proc.stdout.splitlines() if "test_add/stale" in ln]
    assert stale and "DOES NOT APPLY" in stale[0]
    assert "--suite unit tests/test_add.py" in proc.stdout


def test_bad_input_is_one_line(toy, tmp_path):
    proc = _plants(toy, "--only", "no-such-plant")
    assert proc.returncode == 3 and "nothing matches" in proc.stderr
    bad = write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/plants/x/y.patch": "suite: unit\n\n"})
    proc = run_ci("plants", "--root", str(bad))
    assert proc.returncode == 2 and "header lacks only, reason" in proc.stderr
    assert "Traceback" not in proc.stderr
    (bad / "tests/e2e/plants/x/y.patch").write_text("suite: unit\nonly: t\nreason: r\ntimeout: soon\n\n")
    proc = run_ci("plants", "--root", str(bad))
    assert proc.returncode == 2 and "timeout: 'soon' is not a number of seconds" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize(("header", "says"), [
    # "²".isdigit() is true and int("²") raised; a count no machine has is refused too.
    (b"gpus: \xc2\xb2\n", "gpus: '\u00b2' is not a GPU count (1 to 256)"),
    (b"gpus: 0\n", "gpus: '0' is not a GPU count (1 to 256)"),
    (b"gpus: 100000\n", "gpus: '100000' is not a GPU count (1 to 256)"),
    (b"reason: caf\xe9 in Latin-1\n", "its header is not UTF-8 text"),
])
def test_a_header_no_plant_can_have_is_one_line(tmp_path, header, says):
    bad = write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY})
    patch = bad / "tests/e2e/plants/x/y.patch"
    patch.parent.mkdir(parents=True)
    patch.write_bytes(b"suite: unit\nonly: t\nreason: r\n" + header + b"\n")
    proc = run_ci("plants", "--root", str(bad), "--dry-run")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and says in proc.stderr and "Traceback" not in proc.stderr


def test_a_diff_in_other_bytes_than_utf_8_is_git_s_to_read(tmp_path):
    bad = write(tmp_path, {"ci/registry/repo_suites.py": REGISTRY})
    patch = bad / "tests/e2e/plants/x/y.patch"
    patch.parent.mkdir(parents=True)
    patch.write_bytes(b"suite: unit\nonly: t\nreason: r\n\ndiff --git a/t b/t\n--- a/t\n+++ b/t\n"
                      b"@@ -1 +1 @@\n-caf\xe9\n+the\n")
    proc = run_ci("plants", "--root", str(bad), "--dry-run")
    assert proc.returncode == 0 and "plants: 1," in proc.stdout, proc.stderr
    assert "DOES NOT APPLY" in proc.stdout  # there is no file t: git says so, we do not crash


def test_a_bad_option_is_one_line_and_exit_2(toy):
    proc = _plants(toy, "--no-such-option")
    assert proc.returncode == 2
    assert proc.stderr == ("error: unrecognized arguments: --no-such-option (see `python -m ci "
                           "plants --help`)\n")


def test_every_plant_of_the_repository_still_applies():
    """A refactor of slime/ leaves a plant's context behind; caught here, not by the nightly run."""
    proc = run_ci("plants", "--dry-run", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    stale = [ln for ln in proc.stdout.splitlines() if "DOES NOT APPLY" in ln]
    assert not stale, "regenerate these plants on the current code:\n" + "\n".join(stale)
    # Every patch under tests/e2e/plants is a plant the command found.
    count = len(list((REPO / "tests" / "e2e" / "plants").rglob("*.patch")))
    assert count >= 20 and f"plants: {count}," in proc.stdout, proc.stdout[:200]


def test_the_ci_subset_is_caught_on_the_real_framework():
    """PLANTS_CI, what every push runs: the real slime/, patched in a scratch copy."""
    proc = run_ci("plants", "--ci", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 missed" in proc.stdout


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
