"""The planner's judgement, through its public functions: which files a rule takes, how an
entry resolves, what `--shard`, `--only` and paths select, how entries are ordered and split.

Pure functions, no process started: this file is also what `nox -s mutation` reruns for
every mutant of ci/select/entries.py, so it stays fast.
"""

import sys
from dataclasses import replace

import pytest

from ci.errors import EXIT_NOTHING, EXIT_USAGE, NothingRegistered, UsageError
from ci.registry import Entry, Suite
from ci.select import discover
from ci.select.entries import (
    ResolvedEntry,
    estimate,
    failure_first,
    longest_first,
    parse_shard,
    resolve,
    resolve_entry,
    rule_files,
    select_only,
    select_paths,
    shard,
    suite_entries,
    widest_first,
)

NUM_GPUS = 0


def tf(path: str, gpus: int | None = 0, *, tests: int = 1, problem: str | None = None) -> discover.TestFile:
    return discover.TestFile(path=path, num_gpus=gpus, num_gpus_line=1 if gpus is not None else None,
                    num_gpus_problem=problem, test_functions=tests, has_main=True,
                    main_runs_something=True, main_line=9)


def pe(id_: str, *, gpus: int = 0, timeout: float = 100.0, path: str | None = None) -> ResolvedEntry:
    return ResolvedEntry(id=id_, path=path or id_.split(" ", maxsplit=1)[0], timeout=timeout, num_gpus=gpus, kind="pytest")


CPU = Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
            exclude=("tests/e2e", "tests/agent"), timeout=300)


# --- rules and resolution ----------------------------------------------------------------


def test_rule_takes_cpu_files_under_include_and_not_under_exclude():
    files = {p: tf(p, g) for p, g in [
        ("tests/test_b.py", 0), ("tests/test_a.py", 0), ("tests/utils/test_c.py", 0),
        ("tests/test_gpu.py", 2), ("tests/e2e/test_e.py", 0), ("tests/agent/test_f.py", 0),
        ("tests_other/test_g.py", 0), ("benchmarks/test_h.py", 0),
    ]}
    assert rule_files(CPU, files) == ["tests/test_a.py", "tests/test_b.py", "tests/utils/test_c.py"]


def test_rule_of_a_suite_without_include_takes_nothing():
    gpu = Suite(name="g", tier="gpu", purpose="p", profile="e2e", entries=(Entry(path="tests/e2e/x.py"),))
    assert rule_files(gpu, {"tests/test_a.py": tf("tests/test_a.py")}) == []
    assert suite_entries(gpu, {"tests/test_a.py": tf("tests/test_a.py")}) == [Entry(path="tests/e2e/x.py")]


def test_suite_entries_are_the_listed_ones_then_the_rule():
    suite = Suite(name="s", tier="cpu", purpose="p", profile="cpu", include=("tests",),
                  entries=(Entry(path="tests/z.py", test_args=("-k", "x")),))
    files = {"tests/test_a.py": tf("tests/test_a.py")}
    assert [e.id for e in suite_entries(suite, files)] == ["tests/z.py -k x", "tests/test_a.py"]


def test_resolve_entry_carries_the_registry_and_the_file():
    entry = Entry(path="tests/e2e/x.py", test_args=("--a", "1"), env=(("K", "V"),), timeout=42.0,
                  cores=3, prefork=False, container="framework")
    got = resolve_entry(entry, tf("tests/e2e/x.py", 4, tests=0), default_timeout=900.0, why="changed")
    assert got == ResolvedEntry(id="tests/e2e/x.py --a 1", path="tests/e2e/x.py", test_args=("--a", "1"),
                               env=(("K", "V"),), timeout=42.0, num_gpus=4, kind="script", why="changed",
                               cores=3, prefork=False, container="framework")


def test_resolve_entry_takes_the_suite_timeout_when_the_entry_has_none():
    got = resolve_entry(Entry(path="t.py"), tf("t.py"), default_timeout=123.0)
    assert got.timeout == 123.0
    assert (got.why, got.cores, got.prefork, got.kind) == ("", 1, True, "pytest")


def test_resolve_entry_judges_a_cpu_tier_script_as_a_pytest_file():
    script = tf("t.py", tests=0)
    assert resolve_entry(Entry(path="t.py"), script, default_timeout=1.0).kind == "script"
    assert resolve_entry(Entry(path="t.py"), script, default_timeout=1.0, pytest_only=True).kind == "pytest"


def test_resolve_entry_of_an_undeclared_file_says_why_and_points_at_audit():
    bad = tf("tests/test_x.py", None, problem="NUM_GPUS is missing")
    with pytest.raises(UsageError) as err:
        resolve_entry(Entry(path="tests/test_x.py"), bad, default_timeout=1.0)
    assert str(err.value) == "tests/test_x.py: NUM_GPUS is missing (run `python -m ci audit`)"
    assert err.value.exit_code == EXIT_USAGE


def test_resolve_cpu_suite_uses_its_timeout_and_judges_by_pytest():
    files = {"tests/test_a.py": tf("tests/test_a.py", tests=0), "tests/test_b.py": tf("tests/test_b.py")}
    planned = resolve(CPU, files)
    assert [p.id for p in planned] == ["tests/test_a.py", "tests/test_b.py"]
    assert {p.timeout for p in planned} == {300}
    assert {p.kind for p in planned} == {"pytest"}


def test_resolve_gpu_suite_keeps_the_file_kind():
    gpu = Suite(name="g", tier="gpu", purpose="p", profile="e2e", timeout=600,
                entries=(Entry(path="tests/e2e/x.py"),))
    [planned] = resolve(gpu, {"tests/e2e/x.py": tf("tests/e2e/x.py", 2, tests=0)})
    assert (planned.kind, planned.num_gpus, planned.timeout) == ("script", 2, 600)


def test_resolve_of_an_empty_suite_is_nothing_registered():
    empty = Suite(name="ckpt", tier="gpu", purpose="p", profile="e2e")
    with pytest.raises(NothingRegistered) as err:
        resolve(empty, {})
    assert str(err.value) == ("nothing registered for ckpt: add entries to ci/registry/repo_suites.py "
                              "(see docs/adding-tests.md of slime-ci)")
    assert err.value.exit_code == EXIT_NOTHING


def test_resolve_of_a_missing_registered_file_names_it():
    gpu = Suite(name="g", tier="gpu", purpose="p", profile="e2e", entries=(Entry(path="tests/e2e/gone.py"),))
    with pytest.raises(UsageError) as err:
        resolve(gpu, {})
    assert str(err.value) == ("g: registered file tests/e2e/gone.py does not exist "
                              "(fix ci/registry/repo_suites.py, then run `python -m ci audit`)")


# --- selection ---------------------------------------------------------------------------


ENTRIES = [pe("tests/test_a.py"), pe("tests/utils/test_b.py"), pe("tests/utils/deep/test_c.py"),
           pe("tests/e2e/x.py --mode 1"), pe("tests/e2e/x.py --mode 2")]


@pytest.mark.parametrize(("paths", "want"), [
    (["tests/test_a.py"], ["tests/test_a.py"]),
    (["./tests/utils/"], ["tests/utils/test_b.py", "tests/utils/deep/test_c.py"]),
    (["tests\\utils\\deep"], ["tests/utils/deep/test_c.py"]),
    (["tests/e2e/x.py"], ["tests/e2e/x.py --mode 1", "tests/e2e/x.py --mode 2"]),
    (["tests/e2e/x.py", "tests/test_a.py"], ["tests/test_a.py", "tests/e2e/x.py --mode 1",
                                              "tests/e2e/x.py --mode 2"]),
])
def test_select_paths_takes_files_and_what_lies_under_directories(paths, want):
    assert [e.id for e in select_paths(ENTRIES, paths, suite="s")] == want


def test_select_paths_does_not_match_a_name_prefix():
    with pytest.raises(UsageError, match="tests/util is not a test of s"):
        select_paths(ENTRIES, ["tests/util"], suite="s")


def test_select_paths_takes_paths_literally():
    # Relative to the checkout, character for character: no stripping of spaces or of a
    # leading slash, and a name that ends in a letter keeps it.
    odd = [*ENTRIES, pe("tests/e2e/X")]
    assert [e.id for e in select_paths(odd, ["tests/e2e/X"], suite="s")] == ["tests/e2e/X"]
    for path in ("/tests/test_a.py", "tests/test_a.py "):
        with pytest.raises(UsageError, match="is not a test of s"):
            select_paths(odd, [path], suite="s")


def test_select_paths_of_an_unknown_path_lists_the_known_ones():
    with pytest.raises(UsageError) as err:
        select_paths(ENTRIES, ["tests/test_a.py", "tests/nope.py"], suite="cpu_unit")
    assert str(err.value) == ("tests/nope.py is not a test of cpu_unit; known: tests/e2e/x.py, "
                              "tests/test_a.py, tests/utils/deep/test_c.py, tests/utils/test_b.py")


def test_select_paths_of_the_checkout_takes_all_and_names_it_when_there_is_nothing():
    # "." and "./" name the checkout itself: every entry lies under it. With no entry to
    # take, the message names it as typed, not as the empty path it normalises to.
    assert [e.id for e in select_paths(ENTRIES, ["."], suite="s")] == [e.id for e in ENTRIES]
    for path in (".", "./"):
        with pytest.raises(UsageError) as err:
            select_paths([], [path], suite="gpu_smoke")
        assert str(err.value) == ". is not a test of gpu_smoke: gpu_smoke has no entries"
    with pytest.raises(UsageError) as err:
        select_paths(ENTRIES, [""], suite="s")
    assert str(err.value) == "an empty path names no test; give a test file or directory (`.` for all)"


def test_select_paths_shows_twelve_known_files_and_the_count():
    many = [pe(f"tests/test_{i:02}.py") for i in range(14)]
    with pytest.raises(UsageError) as err:
        select_paths(many, ["tests/nope.py"], suite="s")
    shown = ", ".join(f"tests/test_{i:02}.py" for i in range(12))
    assert str(err.value) == f"tests/nope.py is not a test of s; known: {shown}, … (14 in all)"
    with pytest.raises(UsageError) as err:
        select_paths(many[:13], ["tests/nope.py"], suite="s")
    assert str(err.value).endswith(f"known: {shown}, … (13 in all)")
    twelve = many[:12]
    with pytest.raises(UsageError) as err:
        select_paths(twelve, ["tests/nope.py"], suite="s")
    assert str(err.value) == f"tests/nope.py is not a test of s; known: {shown}"


@pytest.mark.parametrize(("pattern", "want"), [
    ("tests/e2e/x.py --mode 2", ["tests/e2e/x.py --mode 2"]),  # an exact id
    ("*--mode 1", ["tests/e2e/x.py --mode 1"]),  # a glob over the id
    ("tests/utils/*", ["tests/utils/test_b.py", "tests/utils/deep/test_c.py"]),  # a glob over the path
    ("e2e/x", ["tests/e2e/x.py --mode 1", "tests/e2e/x.py --mode 2"]),  # a substring
])
def test_select_only_by_glob_or_substring(pattern, want):
    assert [e.id for e in select_only(ENTRIES, pattern)] == want


def test_select_only_glob_matches_the_path_even_when_the_id_has_arguments():
    assert [e.id for e in select_only(ENTRIES, "tests/e2e/*.py")] == ["tests/e2e/x.py --mode 1",
                                                                      "tests/e2e/x.py --mode 2"]


def test_an_exact_id_takes_that_entry_alone_and_patterns_add_up():
    entries = [pe("tests/e2e/y.py"), pe("tests/e2e/y.py --cpu-capability default"), pe("tests/e2e/z.py")]
    # The file's plain entry, not its variant with more arguments (which a substring would take).
    assert [e.id for e in select_only(entries, "tests/e2e/y.py")] == ["tests/e2e/y.py"]
    assert [e.id for e in select_only(entries, "e2e/y")] == ["tests/e2e/y.py",
                                                            "tests/e2e/y.py --cpu-capability default"]
    assert [e.id for e in select_only(entries, ["tests/e2e/z.py", "tests/e2e/y.py"])] == [
        "tests/e2e/y.py", "tests/e2e/z.py"]  # in the suite's order, each once
    with pytest.raises(UsageError, match="--only 'gone' matches no entry"):
        select_only(entries, ["tests/e2e/z.py", "gone"])  # a stale pattern among good ones


def test_select_only_matching_nothing_lists_entries():
    with pytest.raises(UsageError) as err:
        select_only(ENTRIES, "nope")
    assert str(err.value) == ("--only 'nope' matches no entry; entries: tests/test_a.py, "
                              "tests/utils/test_b.py, tests/utils/deep/test_c.py, tests/e2e/x.py --mode 1, "
                              "tests/e2e/x.py --mode 2")
    many = [pe(f"t{i:02}.py") for i in range(13)]
    with pytest.raises(UsageError) as err:
        select_only(many, "nope")
    assert str(err.value).endswith("entries: " + ", ".join(f"t{i:02}.py" for i in range(12)))


# --- --shard -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "want"), [("1/1", (1, 1)), ("1/4", (1, 4)), ("4/4", (4, 4)), ("2/3", (2, 3))])
def test_parse_shard_accepts_every_index_from_1_to_k(text, want):
    assert parse_shard(text) == want


@pytest.mark.parametrize("text", ["0/4", "5/4", "1/0", "0/0", "-1/2", "2/-1"])
def test_parse_shard_out_of_bounds(text):
    with pytest.raises(UsageError) as err:
        parse_shard(text)
    assert str(err.value) == f"--shard {text!r}: need 1 <= I <= K"
    assert err.value.exit_code == EXIT_USAGE


def test_parse_shard_takes_up_to_a_thousand_shards():
    assert parse_shard("1000/1000") == (1000, 1000)
    with pytest.raises(UsageError) as err:
        parse_shard("1/1001")
    assert str(err.value) == "--shard '1/1001': at most 1000 shards"


@pytest.mark.parametrize("text", ["1", "1/2/3", "a/b", "", "1/"])
def test_parse_shard_malformed(text):
    with pytest.raises(UsageError) as err:
        parse_shard(text)
    assert str(err.value) == f"--shard {text!r}: expected I/K, e.g. 1/4"


# --- ordering and sharding ---------------------------------------------------------------


def test_estimate_is_the_measured_time():
    assert estimate(pe("a"), {"a": 7.5, "b": 100.0}) == 7.5


def test_estimate_of_an_unmeasured_entry_is_twice_the_median():
    # Unknown entries start early: twice the median of what was measured (here 20 s).
    durations = {"a": 10.0, "b": 20.0, "c": 30.0}
    assert estimate(pe("new"), durations) == 40.0
    assert estimate(pe("new"), {"a": 10.0, "b": 20.0, "c": 30.0, "d": 50.0}) == 60.0  # upper median
    assert estimate(pe("new"), {"a": 5.0}) == 10.0


def test_estimate_with_nothing_measured_is_a_tenth_of_the_timeout():
    assert estimate(pe("new", timeout=300.0), {}) == 30.0


def test_longest_first_puts_unmeasured_entries_ahead_of_typical_ones():
    durations = {"a": 10.0, "b": 20.0, "c": 30.0}
    order = longest_first([pe("a"), pe("b"), pe("c"), pe("new")], durations)
    assert [e.id for e in order] == ["new", "c", "b", "a"]


def test_longest_first_breaks_ties_by_id():
    order = longest_first([pe("b"), pe("c"), pe("a")], {"a": 5.0, "b": 5.0, "c": 5.0})
    assert [e.id for e in order] == ["a", "b", "c"]


def test_widest_first_runs_multi_core_entries_first_each_group_longest_first():
    entries = [replace(pe("a"), cores=1), replace(pe("b"), cores=2), replace(pe("c"), cores=1),
               replace(pe("d"), cores=2), replace(pe("new"), cores=1)]
    durations = {"a": 30.0, "b": 5.0, "c": 10.0, "d": 20.0}
    assert [e.id for e in widest_first(entries, durations)] == ["d", "b", "new", "a", "c"]
    narrow = [pe("a"), pe("c"), pe("new")]
    assert widest_first(narrow, durations) == longest_first(narrow, durations)
    tied = [replace(pe("b"), cores=2), replace(pe("a"), cores=2)]
    assert [e.id for e in widest_first(tied, {"a": 5.0, "b": 5.0})] == ["a", "b"]


def test_shards_partition_the_entries():
    entries = [pe(f"t{i}") for i in range(11)]
    durations = {f"t{i}": float(i + 1) for i in range(11)}
    parts = [shard(entries, i, 3, durations) for i in (1, 2, 3)]
    assert sorted(e.id for p in parts for e in p) == sorted(e.id for e in entries)
    assert all(parts)


def test_shard_is_lpt_each_entry_to_the_lightest_shard():
    durations = {"a": 8.0, "b": 7.0, "c": 6.0, "d": 5.0, "e": 4.0}
    entries = [pe(x) for x in "abcde"]
    ids = [[e.id for e in shard(entries, i, 2, durations)] for i in (1, 2)]
    # a→1 (8), b→2 (7), c→2 (13), d→1 (13), e→1: ties go to the lower shard.
    assert ids == [["a", "d", "e"], ["b", "c"]]


def test_shard_weighs_an_entry_by_its_gpus():
    # A 4-GPU entry of 10 s occupies as much as 40 GPU-seconds: it fills a shard by itself.
    durations = {"big": 10.0, "s1": 9.0, "s2": 9.0, "s3": 9.0}
    entries = [pe("big", gpus=4), pe("s1"), pe("s2"), pe("s3")]
    ids = [[e.id for e in shard(entries, i, 2, durations)] for i in (1, 2)]
    assert ids == [["big"], ["s1", "s2", "s3"]]


def test_shard_counts_a_cpu_entry_as_one_gpu():
    # 0-GPU entries still take time: weighed as one, never as zero.
    durations = {"a": 10.0, "b": 9.0, "c": 8.0}
    entries = [pe("a", gpus=0), pe("b", gpus=0), pe("c", gpus=0)]
    ids = [[e.id for e in shard(entries, i, 2, durations)] for i in (1, 2)]
    assert ids == [["a"], ["b", "c"]]


def test_shard_weighs_gpu_seconds_one_gpu_entries_included():
    # a: 2 GPUs x 10 s = 20; b, c, d: one GPU each, 9 + 8 + 7 = 24.
    durations = {"a": 10.0, "b": 9.0, "c": 8.0, "d": 7.0}
    entries = [pe("a", gpus=2), pe("b", gpus=1), pe("c", gpus=1), pe("d", gpus=1)]
    ids = [[e.id for e in shard(entries, i, 2, durations)] for i in (1, 2)]
    assert ids == [["a"], ["b", "c", "d"]]


def test_shard_weighs_unmeasured_entries_by_their_estimate():
    # "new" is unmeasured: 2 × median (10 s) = 20 s, placed first, as heavy as two others.
    durations = {"a": 10.0, "b": 10.0, "c": 10.0}
    entries = [pe("a"), pe("b"), pe("c"), pe("new")]
    ids = [[e.id for e in shard(entries, i, 2, durations)] for i in (1, 2)]
    assert ids == [["new", "c"], ["a", "b"]]


def test_one_shard_is_everything_longest_first():
    durations = {"a": 1.0, "b": 3.0, "c": 2.0}
    assert [e.id for e in shard([pe("a"), pe("b"), pe("c")], 1, 1, durations)] == ["b", "c", "a"]


def test_failure_first_failed_then_by_import_distance_shortest_first_then_longest():
    durations = {"f_long": 9.0, "f_short": 2.0, "e": 50.0, "d1_slow": 30.0, "d1_fast": 3.0,
                 "d1_tie": 3.0, "d2": 0.5, "r_long": 40.0, "r_short": 1.0}
    entries = [pe(k) for k in sorted(durations)]
    order = failure_first(entries, durations, failed={"f_long", "f_short", "d2"},
                          changed={"e": 0, "d1_slow": 1, "d1_fast": 1, "d1_tie": 1, "d2": 2})
    assert [e.id for e in order] == ["d2", "f_short", "f_long", "e", "d1_fast", "d1_tie", "d1_slow",
                                     "r_long", "r_short"]
    # Nothing failed, nothing reached: exactly longest first.
    assert failure_first(entries, durations, failed=set(), changed={}) == longest_first(entries, durations)
    # A slow entry that failed still comes before a quick one the diff edits.
    two = [pe("edited"), pe("failed")]
    assert [e.id for e in failure_first(two, {"edited": 1.0, "failed": 60.0}, failed={"failed"},
                                        changed={"edited": 0})] == ["failed", "edited"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
