"""A suite's shard count from its target: planted durations in, the count and its reason out;
the split `--shard I/K` runs is balanced, stable and never empty; the plan, its `--json` and
the generated workflow's matrix agree on the count."""

from __future__ import annotations

import json
import random
import re
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci

from ci.errors import EXIT_USAGE, UsageError
from ci.github.job_plan import main as plan_main
from ci.github.job_plan import table
from ci.github.workflow import WORKFLOW_PATH, render
from ci.registry import Entry, Suite
from ci.registry.loader import load_registry
from ci.select.discover import discover
from ci.select.entries import ResolvedEntry, partition, resolve, shard
from ci.select.shard_count import count_shards, shard_walls, suite_counts

NUM_GPUS = 0

SUITE = Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",), target_minutes=5)


def pe(id_: str) -> ResolvedEntry:
    return ResolvedEntry(id=id_, path=id_, timeout=100.0, num_gpus=0, kind="pytest")


def planted(seconds: list[float]) -> tuple[list[ResolvedEntry], dict[str, float]]:
    entries = [pe(f"tests/test_{i:02d}.py") for i in range(len(seconds))]
    return entries, {e.id: s for e, s in zip(entries, seconds, strict=True)}


# --- the count ------------------------------------------------------------------------------


def test_a_target_one_shard_meets_gives_one() -> None:
    entries, durations = planted([30.0] * 20)  # 600 s over 4 cores: 150 s + 60 s set-up
    got = count_shards(SUITE, entries, durations, source="planted")
    assert (got.count, round(got.minutes, 2)) == (1, 3.5)
    assert got.why == "target 5 min, 20 files by planted: 1 shard reaches 3.5 min"


def test_the_fewest_shards_that_meet_the_target() -> None:
    entries, durations = planted([60.0] * 40)  # 2400 s: 1 shard 660 s, 2: 360 s, 3: 270 s
    assert count_shards(SUITE, entries, durations, source="p").count == 3
    assert count_shards(replace(SUITE, target_minutes=6), entries, durations, source="p").count == 2
    assert count_shards(replace(SUITE, target_minutes=11), entries, durations, source="p").count == 1


def test_a_file_longer_than_the_target_gives_as_many_shards_as_still_help() -> None:
    # One file of 400 s: no split gets under 460 s, and the rest (2400 s) needs 2 shards to
    # fit beside it; a third shard would not shorten the slowest.
    entries, durations = planted([400.0] + [40.0] * 60)
    got = count_shards(SUITE, entries, durations, source="planted")
    walls = [max(shard_walls(entries, k, durations, cores=4, setup=60.0)) for k in (1, 2, 3)]
    assert walls[1] == walls[2] == 460.0 < walls[0]
    assert got.count == 2
    assert got.why == ("target 5 min, 61 files by planted: longest file 400 s: 2 shards reach "
                       "7.7 min; 3 would not help")


def test_a_fixed_count_overrides_the_target() -> None:
    entries, durations = planted([400.0] * 8)
    got = count_shards(replace(SUITE, shards=3), entries, durations, source="planted")
    assert (got.count, got.why) == (3, "fixed: shards=3 in the registry")


def test_never_more_shards_than_files_nor_than_the_cap() -> None:
    # Two 500 s files on 4 cores already run side by side: a second shard would not help.
    pair, seconds = planted([500.0, 500.0])
    assert count_shards(SUITE, pair, seconds, source="p").count == 1
    three, seconds = planted([300.0] * 3)
    got = count_shards(SUITE, three, seconds, source="p", cores=1)
    assert (got.count, got.why) == (3, "target 5 min, 3 files by p: longest file 300 s: 3 shards reach 6.0 min")
    many, seconds = planted([300.0] * 60)
    got = count_shards(SUITE, many, seconds, source="p", max_shards=3)
    assert got.count == 3 and "at most 3 shards" in got.why


# --- where the durations come from ------------------------------------------------------------

def _checkout(root: Path, seconds: dict[str, float] | None) -> Path:
    (root / ".slime-ci").mkdir(parents=True)
    (root / ".slime-ci" / "suites.py").write_text(
        "from ci.registry import Suite\n"
        "SUITES = (Suite(name='unit', tier='cpu', purpose='p', profile='cpu', include=('tests',),"
        " target_minutes=3),)\n", encoding="utf-8")
    (root / "tests").mkdir()
    for i in range(12):
        (root / "tests" / f"test_{i:02d}.py").write_text(
            "NUM_GPUS = 0\n\n\ndef test_x():\n    assert True\n", encoding="utf-8")
    if seconds is not None:
        (root / "tests" / "durations.json").write_text(json.dumps(seconds), encoding="utf-8")
    return root


def test_the_committed_durations_size_a_suite_without_history(tmp_path: Path) -> None:
    root = _checkout(tmp_path, {f"tests/test_{i:02d}.py": 100.0 for i in range(12)})
    suites = load_registry(root).suites
    got = suite_counts(root, suites)["unit"]
    # 1200 s over 4 cores: 1 shard 360 s, 2: 210 s, over 180 s; 3: 160 s.
    assert (got.count, got.why) == (3, "target 3 min, 12 files by tests/durations.json: 3 shards reach 2.7 min")
    # The history's p90, where a store gives it, wins over the committed seconds.
    faster = suite_counts(root, suites, measured={f"tests/test_{i:02d}.py": 20.0 for i in range(12)},
                          source="history p90")["unit"]
    assert (faster.count, faster.why) == (1, "target 3 min, 12 files by history p90: 1 shard reaches 2.0 min")


def test_a_registry_listing_entries_in_a_list_is_sized_too(tmp_path: Path) -> None:
    root = _checkout(tmp_path, {"tests/test_00.py": 500.0, "tests/test_01.py": 500.0})
    listed = Suite(name="listed", tier="cpu", purpose="p", profile="cpu", target_minutes=3,
                   entries=[Entry(path="tests/test_00.py"), Entry(path="tests/test_01.py")])  # type: ignore[arg-type]
    got = suite_counts(root, [listed])["listed"]
    assert got.count == 1 and got.why.startswith("target 3 min, 2 files by tests/durations.json: longest file 500 s")


def test_no_durations_keeps_the_registrys_count(tmp_path: Path) -> None:
    root = _checkout(tmp_path, None)
    got = suite_counts(root, load_registry(root).suites)["unit"]
    assert (got.count, got.why) == (1, "no measured durations: shards=1")


# --- the split ----------------------------------------------------------------------------------


def test_the_split_is_balanced_where_the_files_allow() -> None:
    rng = random.Random(52)
    entries, durations = planted([round(rng.uniform(2.0, 90.0), 1) for _ in range(90)])
    for k in (2, 3, 4, 6):
        loads = [sum(durations[e.id] for e in part) for part in partition(entries, k, durations)]
        assert max(loads) / statistics.mean(loads) <= 1.10, (k, loads)


def test_the_split_is_stable_whatever_order_the_entries_come_in() -> None:
    rng = random.Random(7)
    entries, durations = planted([float(rng.choice([5, 10, 10, 20, 40])) for _ in range(30)])
    first = [[e.id for e in p] for p in partition(entries, 3, durations)]
    shuffled = entries[:]
    rng.shuffle(shuffled)
    assert [[e.id for e in p] for p in partition(shuffled, 3, durations)] == first


def test_a_shard_that_names_no_entry_is_an_error() -> None:
    entries, durations = planted([1.0, 2.0, 3.0])
    with pytest.raises(UsageError) as err:
        shard(entries, 4, 4, durations)
    assert str(err.value) == "--shard 4/4 names no entry: the selection has 3; use at most 3 shards"


@pytest.mark.slow  # a `ci run` process
def test_run_refuses_an_empty_shard_in_one_line() -> None:
    files = len(resolve(load_registry(REPO)["agent_adapter"], discover(REPO)))
    proc = run_ci("run", "--suite", "agent_adapter", "--shard", f"{files + 1}/{files + 1}", "--dry-run")
    assert proc.returncode == EXIT_USAGE, proc.stderr
    assert [x for x in proc.stderr.splitlines() if x.startswith("error")] == [
        f"error: --shard {files + 1}/{files + 1} names no entry: the selection has {files}; "
        f"use at most {files} shards"]


# --- this repository: the plan, its JSON and the workflow agree --------------------------------


def _matrices(flow: dict[str, dict[str, object]]) -> dict[str, dict[str, object]]:
    return {name: job["strategy"]["matrix"] for name, job in flow.items()  # type: ignore[index]
            if "strategy" in job}


# A job sized by a target reads each matrix key from the plan job's output, with main's count
# where no plan succeeded: `fromJSON(needs.plan.result == 'success' && needs.plan.outputs.shards
# || '{"ID":{"shard":[1,2],"of":[2]}}').ID.shard` (and `.of`).
PLANNED = re.compile(r"\$\{\{ fromJSON\(needs\.plan\.result == 'success' && needs\.plan\.outputs\.shards"
                     r" \|\| '(\{.*\})'\)\.(\w+)\.(shard|of) \}\}")


def test_the_plan_the_json_and_the_matrix_agree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    jobs = {j.id: j for j in table(root=REPO)}
    assert jobs["toolkit"].shards > 1  # sized by its target, not by hand
    assert jobs["gpu_smoke"].shards_why  # the smoke too, whatever count its target gives
    flow = yaml.safe_load(render(tuple(jobs.values()))[WORKFLOW_PATH])["jobs"]
    fallback, planned = {}, []
    for name, matrix in _matrices(flow).items():
        assert sorted(matrix) == ["of", "shard"], matrix  # K rides in each leg, not strategy.job-total
        if isinstance(matrix["shard"], list):  # a fixed count
            fallback[name] = dict(matrix)
            continue
        committed = set()
        for key, value in matrix.items():
            match = PLANNED.fullmatch(str(value))
            assert match and match[2] == name and match[3] == key, value
            committed.add(match[1])
        (text,) = committed  # both keys fall back to the same count
        fallback[name] = json.loads(text)[name]
        assert fallback[name]["of"] == [len(fallback[name]["shard"])]
        assert "plan" in str(flow[name]["needs"]) and flow[name]["if"].startswith("!cancelled()")
        planned.append(name)
    assert sorted(planned) == ["gpu_smoke", "toolkit"]
    # What the plan job publishes on a PR (the matrix every such job reads) ...
    output = tmp_path / "output"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary"))
    assert plan_main(["--event", "pull_request", "--github", "--root", str(REPO)]) == 0
    published = json.loads(output.read_text(encoding="utf-8").splitlines()[1].removeprefix("shards="))
    capsys.readouterr()
    # ... and `--json`'s shards give the same matrices as the workflow's, for every matrix job.
    assert plan_main(["--event", "push", "--json", "--root", str(REPO)]) == 0
    rows = {r["job"]: r for r in json.loads(capsys.readouterr().out)}
    assert published == fallback == {j: {"shard": list(range(1, rows[j]["shards"] + 1)),
                                         "of": [rows[j]["shards"]]} for j in fallback}
    assert rows["toolkit"]["shards_why"] == jobs["toolkit"].shards_why
    assert plan_main(["--event", "push", "--root", str(REPO)]) == 0
    table_text = capsys.readouterr().out
    assert f"  toolkit: {jobs['toolkit'].shards} shards: {jobs['toolkit'].shards_why}" in table_text


def test_a_plan_without_its_history_publishes_the_committed_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    # The plan job passes the snapshot it restored; a missing or unreadable one must not leave
    # the matrix jobs without a matrix.
    output = tmp_path / "output"
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_OUTPUT", str(output))
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(tmp_path / "summary"))
    missing = f"sqlite:///{tmp_path / 'none.sqlite'}"
    assert plan_main(["--github", "--history", missing, "--root", str(REPO)]) == 0
    err = capsys.readouterr().err
    assert "warning: history: unavailable (" in err and "shard counts from the committed durations" in err
    published = json.loads(output.read_text(encoding="utf-8").splitlines()[1].removeprefix("shards="))
    assert published == {j.id: {"shard": list(range(1, j.shards + 1)), "of": [j.shards]}
                         for j in table(root=REPO) if j.matrix and not j.scheduled_only}


def test_the_shards_together_run_every_file_exactly_once() -> None:
    suite = load_registry(REPO)["toolkit"]
    entries = resolve(suite, discover(REPO))
    count = next(j for j in table(root=REPO) if j.id == "toolkit").shards
    from ci.durations import baseline

    ran = [e.id for i in range(1, count + 1) for e in shard(entries, i, count, baseline(REPO))]
    assert sorted(ran) == sorted(e.id for e in entries) and len(set(ran)) == len(ran)


def test_the_plans_shard_commands_together_run_every_file_exactly_once(tmp_path: Path) -> None:
    # From the commands `plan --json` gives a PR (the ones each matrix leg runs) to the files
    # `ci run --shard I/K` plans for each: every file of the suite once, no shard empty. The
    # durations are the committed ones, as every leg of a PR restores the same.
    proc = run_ci("plan", "--event", "pull_request", "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = [r for r in json.loads(proc.stdout) if r["job"] == "toolkit"]
    assert row["runs"] and len(row["commands"]) == row["shards"] > 1
    durations = tmp_path / "durations.json"
    durations.write_text((REPO / "tests/durations.json").read_text(encoding="utf-8"), encoding="utf-8")
    ran: list[str] = []
    for i, command in enumerate(row["commands"], 1):
        assert command == f"nox -s toolkit -- --shard {i}/{row['shards']}"
        shard_arg = command.rsplit(" ", 1)[1]
        dry = run_ci("run", "--suite", "toolkit", "--shard", shard_arg, "--dry-run", "--history", "off",
                     "--durations", str(durations), "--base", "HEAD")
        assert dry.returncode == 0, dry.stdout + dry.stderr
        mine = re.findall(r"^  (tests/\S+\.py)  gpus=", dry.stdout, flags=re.MULTILINE)
        assert mine, dry.stdout
        ran += mine
    files = [e.id for e in resolve(load_registry(REPO)["toolkit"], discover(REPO))]
    assert sorted(ran) == sorted(files) and len(set(ran)) == len(ran)


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
