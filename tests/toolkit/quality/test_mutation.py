"""`python -m ci mutation`: the registry's targets exist, the equivalents file parses, the score
counts what it says, and a real mutmut run on a tiny project finds the mutant its tests miss."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

from ci.errors import EXIT_OK, UsageError
from ci.quality import mutation
from ci.quality.mutation_targets import MUTATION_EQUIVALENT, MUTATION_TARGETS, MutationTarget

NUM_GPUS = 0


def test_every_target_and_its_tests_exist_and_thresholds_are_shares():
    for t in MUTATION_TARGETS:
        assert (REPO / t.source).exists(), t.source
        assert t.tests, t.source
        for test in t.tests:
            assert (REPO / test).is_file(), test
        assert 0.0 < t.threshold <= 1.0, t.source
    assert len({t.source for t in MUTATION_TARGETS}) == len(MUTATION_TARGETS)


def test_the_checked_in_equivalents_parse_and_name_registered_modules():
    path = REPO / MUTATION_EQUIVALENT
    found = mutation.parse_equivalents(path.read_text(encoding="utf-8"))
    modules = {t.source.removesuffix(".py").replace("/", ".") for t in MUTATION_TARGETS}
    for name, eq in found.items():
        assert any(name.startswith(m + ".") for m in modules), name
        assert eq.line and len(eq.reason) > 10, name


def test_parse_equivalents_blocks_and_comments():
    text = "# why this file\n\nmutant a.x_f__mutmut_1\nline return 2\nwhy  same result\n\n" \
           "mutant a.x_g__mutmut_3\nline x = None\nwhy never read\n"
    got = mutation.parse_equivalents(text)
    assert got == {
        "a.x_f__mutmut_1": mutation.Equivalent(name="a.x_f__mutmut_1", line="return 2", reason="same result"),
        "a.x_g__mutmut_3": mutation.Equivalent(name="a.x_g__mutmut_3", line="x = None", reason="never read"),
    }


@pytest.mark.parametrize(("text", "message"), [
    ("mutant a\nline b\n", "f:2: entry lacks why"),
    ("mutant a\nwhy c\n\n", "f:2: entry lacks line"),
    ("mutant a\nmutant b\n", "f:2: expected `mutant NAME`"),
    ("name a\n", "f:1: expected `mutant NAME`"),
])
def test_parse_equivalents_bad_entries_say_where(text, message):
    with pytest.raises(UsageError) as err:
        mutation.parse_equivalents(text, source="f")
    assert str(err.value).startswith(message)


@pytest.mark.parametrize(("code", "status"), [
    (None, "not checked"), (0, "survived"), (1, "killed"), (3, "killed"), (36, "killed"), (-9, "killed"),
    (33, "no tests"), (5, "no tests"), (35, "survived"), (99, "survived"),
    # A test process a mutant's armed timer killed (SIGALRM), or one that aborted: killed.
    (-14, "killed"), (-6, "killed"), (-2, "survived"),
])
def test_status_of_mutmut_exit_codes(code, status):
    assert mutation.status_of(code) == status


def test_changed_line_diffs_the_mutant_against_the_original():
    source = textwrap.dedent("""\
        def x_f__mutmut_orig(a):
            b = a + 1
            return b * 2
        def x_f__mutmut_1(a):
            b = a - 1
            return b * 2
    """)
    functions = mutation._functions(source)
    assert mutation.changed_line(functions, "pkg.mod.x_f__mutmut_1") == ("b = a + 1", "b = a - 1")
    functions = mutation._functions("def x_g__mutmut_orig(n=128):\n    return n\n"
                                    "def x_g__mutmut_1(n=129):\n    return n\n")
    assert mutation.changed_line(functions, "m.x_g__mutmut_1") == ("def x_g(n=128):", "def x_g(n=129):")
    assert mutation.changed_line(functions, "pkg.mod.x_f__mutmut_7")[1] == ""  # no such mutant


def target(threshold: float = 0.9) -> MutationTarget:
    return MutationTarget(source="calc.py", tests=("tests/test_calc.py",), threshold=threshold)


def score(statuses: str, threshold: float = 0.9) -> mutation.Score:
    names = {"k": "killed", "s": "survived", "n": "no tests", "e": "equivalent", "u": "not checked"}
    mutants = tuple(mutation.Mutant(name=f"calc.x_f__mutmut_{i}", status=names[c], line="new", original="old")
                    for i, c in enumerate(statuses, 1))
    return mutation.Score(target=target(threshold), mutants=mutants, seconds=3.0)


def test_score_leaves_equivalents_out_and_counts_no_tests_as_survivors():
    s = score("kkkkkkkkseen")
    assert (s.counted, s.count("killed")) == (10, 8)
    assert s.score == pytest.approx(0.8)
    assert [m.name for m in s.survivors] == ["calc.x_f__mutmut_9", "calc.x_f__mutmut_12"]
    assert not s.ok
    assert score("kkkkkkkkks").ok  # 9 of 10: at 90 %
    assert not score("kkkkkkkkkkku").ok  # a mutant not checked: the run is incomplete
    assert not score("").ok and not score("ee").ok  # nothing to count proves nothing


def test_render_lists_survivors_then_the_table():
    text = mutation.render([score("kkks", threshold=0.5), score("ks", threshold=0.9)])
    lines = text.splitlines()
    assert lines[0] == "  survived     calc.x_f__mutmut_4"
    assert lines[1:3] == ["               - old", "               + new"]
    table = [line for line in lines if line.startswith("calc.py")]
    assert [line.split() for line in table] == [
        ["calc.py", "4", "3", "1", "0", "0", "75.0%", "50%", "3"],
        ["calc.py", "2", "1", "1", "0", "0", "50.0%", "90%", "3"],
    ]
    assert lines[-1] == "mutation: 1 of 2 modules at their threshold; under it: calc.py"


def test_an_entry_renumbered_onto_a_killed_mutant_or_killed_itself_is_stale():
    def mutant(n: int, status: str, line: str) -> mutation.Mutant:
        return mutation.Mutant(name=f"calc.x_f__mutmut_{n}", status=status, line=line)

    def entry(n: int, line: str) -> tuple[str, mutation.Equivalent]:
        return f"calc.x_f__mutmut_{n}", mutation.Equivalent(name=f"calc.x_f__mutmut_{n}", line=line, reason="r")

    mutants = [mutant(1, "equivalent", "a"), mutant(2, "killed", "new code"), mutant(3, "killed", "c")]
    listed = dict([entry(1, "a"), entry(2, "b"), entry(3, "c")])
    assert mutation.stale_equivalents(target(), mutants, listed) == [
        f"stale entry in {MUTATION_EQUIVALENT}: calc.x_f__mutmut_2 now mutates `new code`, not `b`; "
        "check it again",
        f"stale entry in {MUTATION_EQUIVALENT}: the tests kill calc.x_f__mutmut_3 now, so it is not "
        "equivalent; remove the entry",
    ]


def test_each_target_says_its_score_when_it_finishes():
    assert mutation.progress(score("kkkkkkkkkse", threshold=0.9)) == (
        "calc.py: 9 of 10 killed (90.0%, needs 90%; 1 equivalent), 3 s: ok")
    assert mutation.progress(score("kkks", threshold=0.9)).endswith("(75.0%, needs 90%; 0 equivalent), "
                                                                  "3 s: UNDER THRESHOLD")
    assert mutation.progress(score("kkku", threshold=0.5)).endswith(": UNDER THRESHOLD")  # not checked


def test_pick_by_source_and_unknown_names():
    assert mutation.pick(MUTATION_TARGETS, []) == list(MUTATION_TARGETS)
    assert [t.source for t in mutation.pick(MUTATION_TARGETS, ["slime/rollout/rm_hub/"])] == ["slime/rollout/rm_hub"]
    with pytest.raises(UsageError, match=r"not a mutation target: ci/nope\.py; known: ci/select/entries\.py"):
        mutation.pick(MUTATION_TARGETS, ["ci/nope.py"])


def test_the_generated_config_never_mutates_help_text():
    config = mutation.mutmut_config(target(), ["calc.py", "tests"])
    assert 'source_paths = ["calc.py"]' in config
    assert 'pytest_add_cli_args_test_selection = ["tests/test_calc.py"]' in config
    assert 'also_copy = ["calc.py", "tests"]' in config
    assert "do_not_mutate_patterns" in config


def test_run_env_drops_pythonpath_so_the_mutated_copy_is_imported():
    env = mutation.run_env({"PYTHONPATH": "/elsewhere", "HOME": "/h"})
    assert "PYTHONPATH" not in env and env["HOME"] == "/h" and env["OMP_NUM_THREADS"] == "1"


def test_main_bad_input_exits_2_before_running_anything(capsys):
    with pytest.raises(UsageError, match="--jobs 0: need at least 1"):
        mutation.main(["--jobs", "0", "--dry-run"])
    assert mutation.main(["--dry-run", "ci/select/entries.py"]) == EXIT_OK
    plan = next(t for t in MUTATION_TARGETS if t.source == "ci/select/entries.py")
    assert capsys.readouterr().out.startswith(f"ci/select/entries.py  needs {plan.threshold:.0%}  tests: "
                                              "tests/toolkit/select/test_entries.py")


CALC = '''
def clamp(x, low, high):
    return max(low, min(x, high))


def positive(x):
    return x > 0
'''

CALC_TESTS = '''
from calc import clamp, positive


def test_clamp():
    assert clamp(5, 0, 3) == 3
    assert clamp(-1, 0, 3) == 0
    assert clamp(2, 0, 3) == 2


def test_positive():
    assert positive(5) and not positive(-5)  # 0 is never asked: x >= 0 survives
'''


def test_a_real_mutmut_run_scores_a_tiny_project(tmp_path: Path):
    pytest.importorskip("mutmut", reason="the dev profile brings mutmut")
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    (root / "tests" / "test_calc.py").write_text(CALC_TESTS)
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ['-p', 'no:cacheprovider']\n")
    kept = tmp_path / "kept"
    got = mutation.run_target(root, target(threshold=0.5), jobs=2, equivalents={}, keep=kept,
                              env=dict(os.environ))
    survivors = {(m.original, m.line) for m in got.survivors}
    assert ("return x > 0", "return x >= 0") in survivors
    assert all("clamp" not in m.name for m in got.survivors), got.survivors
    assert got.count("killed") >= 4 and got.count("not checked") == 0
    assert (root / "calc.py").read_text() == CALC, "the checkout itself is never mutated"
    # Listed as equivalent, with the line it has now, the survivor no longer counts; an entry
    # whose line no longer matches (the code changed) is stale and counts again.
    name = next(m.name for m in got.survivors if m.line == "return x >= 0")
    listed = {name: mutation.Equivalent(name=name, line="return x >= 0", reason="r")}
    again = mutation.read_results(kept / "calc.py", target(), listed)
    assert [m.name for m in again if m.status == "equivalent"] == [name]
    stale = {name: mutation.Equivalent(name=name, line="return x + 3", reason="r"),
             "calc.x_gone__mutmut_1": mutation.Equivalent(name="calc.x_gone__mutmut_1", line="a", reason="r"),
             "other.x_f__mutmut_1": mutation.Equivalent(name="other.x_f__mutmut_1", line="a", reason="r")}
    judged = mutation.read_results(kept / "calc.py", target(), stale)
    assert all(m.status != "equivalent" for m in judged)
    assert mutation.stale_equivalents(target(), judged, stale) == [
        f"stale entry in {MUTATION_EQUIVALENT}: no mutant calc.x_gone__mutmut_1 any more",
        f"stale entry in {MUTATION_EQUIVALENT}: {name} now mutates `return x >= 0`, not `return x + 3`; "
        f"check it again",
    ]
    assert mutation.stale_equivalents(target(), again, listed) == []


SIGNALLED_RUN = """
import os, sys
from pathlib import Path
from ci.quality import mutation
from ci.interrupts import PROCESS
from ci.quality.mutation_targets import MutationTarget
PROCESS.install()
target = MutationTarget(source="calc.py", tests=("tests/test_calc.py",), threshold=0.5)
scores, stopped = mutation.run_all(Path(sys.argv[1]), [target], jobs=1, equivalents={}, keep=None,
                                   env=dict(os.environ), interrupts=PROCESS)
print("stopped" if stopped else "finished", len(scores), flush=True)
"""


def _cwds_under(folder: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd").startswith(folder):
                    pids.append(int(entry.name))
    return pids


def test_a_signal_stops_mutmut_and_removes_its_scratch_copy(tmp_path: Path):
    """SIGTERM to the command (as a CI timeout sends it): mutmut and every worker it forked
    stop, the scratch copy goes, and the command says so instead of dying mid-write."""
    pytest.importorskip("mutmut", reason="the dev profile brings mutmut")
    root = tmp_path / "proj"
    (root / "tests").mkdir(parents=True)
    (root / "calc.py").write_text(CALC)
    slow = CALC_TESTS.replace("def test_clamp():", "def test_clamp():\n    __import__('time').sleep(30)")
    (root / "tests" / "test_calc.py").write_text(slow)  # a run to the end takes minutes
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ['-p', 'no:cacheprovider']\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.Popen([sys.executable, "-c", SIGNALLED_RUN, str(root)], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, env=env)
    try:
        assert run.stdout is not None
        started = run.stdout.readline()
        scratch = re.search(r"\(in (/\S+)/tree\)", started)
        assert scratch, started
        # mutmut is at work in the scratch copy: its own processes have their cwd there.
        deadline = time.monotonic() + 60
        while not _cwds_under(scratch[1]) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _cwds_under(scratch[1]), "mutmut never started"
        time.sleep(3)  # into the mutants' test runs
        run.send_signal(signal.SIGTERM)
        out = run.communicate(timeout=30)[0]  # stopped, not waited out
    finally:
        if run.poll() is None:
            run.kill()
    assert out.strip().endswith("stopped 0"), out
    assert not Path(scratch[1]).exists(), "the scratch copy is left behind"
    assert _cwds_under(scratch[1]) == [], "a mutmut process outlived the command"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
