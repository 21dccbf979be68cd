"""The registry drives the nox sessions: one per suite, and the README's table agrees."""

import importlib.util
import re
import sys

import pytest
import tomllib
from _ci import REPO

from ci.registry.loader import load_registry

NUM_GPUS = 0

nox = pytest.importorskip("nox", reason="the dev profile brings nox")

# Sessions that are not suites: registry data too (SESSIONS in ci/registry/repo_suites.py).
NOT_SUITES = {s.name for s in load_registry(REPO).sessions}
# Sessions no workflow runs (on demand only): not in README's table of CI jobs.
NO_JOB = {"history", "actions"}


@pytest.fixture(scope="module")
def sessions():
    """name -> nox's session function, from the real noxfile (loaded once, in this process)."""
    from nox import registry

    before = dict(registry.get())
    spec = importlib.util.spec_from_file_location("_noxfile_under_test", REPO / "noxfile.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = dict(registry.get())
    registry._REGISTRY.clear()  # leave nox's registry as it was
    registry._REGISTRY.update(before)
    return found, module


def test_every_suite_has_its_session_and_every_session_a_suite(sessions):
    found, _ = sessions
    suites = {s.name: s for s in load_registry(REPO)}
    assert set(suites) - set(found) == set(), "suites without a nox session"
    assert set(found) - set(suites) - NOT_SUITES == set(), "sessions that name no suite"
    for name, suite in suites.items():
        func = found[name]
        assert func.__doc__.startswith(suite.purpose), name
        assert suite.tier in func.tags
        assert ("ci" in func.tags) == (not suite.needs_gpus), name


def test_mutation_session_is_nightly_not_ci(sessions):
    found, _ = sessions
    # It takes tens of minutes on two cores: never part of `nox -t ci` (nor of `-t cpu`).
    assert set(found["mutation"].tags) == {"nightly"}


def test_sessions_that_are_not_suites_come_from_the_registry(sessions):
    from ci.registry import Check, Smoke

    found, module = sessions
    registry = load_registry(REPO)
    assert {"lint", "gpu_smoke", "gpu_smoke_nightly", "history", "hud", "monitor", "verdict", "actions",
            "actions_real", "mutation",
            "plants", "lock_check"} == NOT_SUITES
    assert not hasattr(module, "SMOKE") and not hasattr(module, "BEFORE")  # no logic left there
    suites = set(registry.names())
    for session in registry.sessions:
        func = found[session.name]
        assert func.__doc__ == f"{session.purpose}.", session.name
        assert set(func.tags) == set(session.tags), session.name
        assert isinstance(session, (Check, Smoke))
        if isinstance(session, Smoke):  # each run names a suite of the registry
            assert {r.suite for r in session.runs} <= suites
    # What the toolkit suite's session runs before its tests is the suite's own data.
    assert registry["toolkit"].before == (("python", "-m", "ci", "audit"),)


def test_no_gpu_entry_left_the_gate_without_a_cadence_that_runs_it(sessions):
    """gpu_smoke runs a subset on every push; whatever it leaves out must run, emulated, in a
    scheduled smoke, and the README table (from the registry) says where."""
    from ci.registry import Smoke
    from ci.select.discover import discover
    from ci.select.entries import resolve, select_only

    found, _ = sessions
    registry = load_registry(REPO)
    smokes = [s for s in registry.sessions if isinstance(s, Smoke)]
    on_push = [s for s in smokes if not s.cadences]
    assert [s.name for s in on_push] == ["gpu_smoke"] and "ci" in found["gpu_smoke"].tags
    tested = discover(REPO)

    def taken(smoke: Smoke) -> set[str]:
        ids: set[str] = set()
        for run in smoke.runs:
            entries = resolve(registry[run.suite], tested, registry=registry.name)
            ids |= {e.id for e in (select_only(entries, run.patterns) if run.patterns else entries)}
        return ids

    gate = taken(on_push[0])
    scheduled = set().union(*(taken(s) for s in smokes if s.cadences))
    suites = {run.suite for s in smokes for run in s.runs}
    every = {e.id for name in suites for e in resolve(registry[name], tested, registry=registry.name)}
    assert gate and gate < every, "the per-push smoke is a proper subset"
    assert every - gate <= scheduled, f"dropped silently: {sorted(every - gate - scheduled)}"
    for smoke in smokes:
        if smoke.cadences:
            assert "ci" not in found[smoke.name].tags and set(smoke.cadences) <= set(found[smoke.name].tags)
    readme = (REPO / "README.md").read_text()
    assert "| `gpu_smoke_nightly` | CPU | nightly schedule |" in readme


class _Recorded:
    """Stands in for nox.Session (a real one installs torch first): what the session runs."""

    def __init__(self) -> None:
        self.posargs: list[str] = []
        self.ran: list[tuple[str, ...]] = []

    def run(self, *args: str, **_kw: object) -> None:
        self.ran.append(args)


def test_a_smoke_that_records_passes_the_flag_and_one_that_does_not_never(sessions, monkeypatch):
    """The nightly smoke as it is (it records), and the same smoke with `record_executed`
    unset, registered by the noxfile's own `_smoke_session`."""
    from dataclasses import replace

    from nox import registry

    from ci.registry.model import Smoke

    found, module = sessions
    monkeypatch.setattr(module, "_install", lambda *_a, **_k: None)
    nightly = next(s for s in load_registry(REPO).sessions
                   if isinstance(s, Smoke) and s.name == "gpu_smoke_nightly")
    before = dict(registry.get())
    try:
        module._smoke_session(replace(nightly, name="plain_nightly", record_executed=False))
        plain = registry.get()["plain_nightly"]
    finally:
        registry._REGISTRY.clear()
        registry._REGISTRY.update(before)
    ran = {}
    for name, func in (("plain_nightly", plain), ("gpu_smoke_nightly", found["gpu_smoke_nightly"])):
        session = _Recorded()
        func.func(session)
        ran[name] = session.ran
    assert ran["gpu_smoke_nightly"] == [("python", "-m", "ci", "smoke", "gpu_smoke_nightly",
                                         "--record-executed")]
    assert ran["plain_nightly"] == [("python", "-m", "ci", "smoke", "plain_nightly")]


def test_every_smoke_installs_the_coverage_recording_needs():
    """`--record-executed` refuses to run (exit 2) without coverage >= 7.13 where entries run:
    a smoke's own profiles must bring it (not only the dev profile), so any may record."""
    from ci.registry import profiles
    from ci.registry.model import Smoke

    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    smokes = [s for s in load_registry(REPO).sessions if isinstance(s, Smoke)]
    assert {s.name for s in smokes} >= {"gpu_smoke", "gpu_smoke_nightly"}
    for smoke in smokes:
        reqs = [r for p in smoke.profiles for r in profiles.requirements(pyproject, p)]
        assert "coverage>=7.13" in reqs, (smoke.name, reqs)


def test_every_suite_profile_is_a_profile():
    from ci.registry.profiles import names

    known = names(tomllib.loads((REPO / "pyproject.toml").read_text()))
    for suite in load_registry(REPO):
        assert suite.profile in known, suite.name


def _readme_sessions() -> dict[str, list[str]]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Sessions", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 4 and (m := re.fullmatch(r"`(\w+)`", cells[0])):
            rows[m.group(1)] = cells
    return rows


def test_the_readme_session_table_lists_the_registry(sessions):
    found, _ = sessions
    rows = _readme_sessions()
    assert set(rows) == set(found) - NO_JOB, "README's session table differs from `nox -l`"
    for suite in load_registry(REPO):
        tier = rows[suite.name][1]
        assert tier in ("CPU", "GPU", "mixed"), suite.name
        assert (tier == "CPU") == (not suite.needs_gpus), suite.name
        if suite.label:
            assert f"label `{suite.label}`" in rows[suite.name][2], suite.name


def test_a_stale_readme_table_fails_the_drift_check(tmp_path):
    from _ci import run_ci

    (tmp_path / "ci" / "registry").mkdir(parents=True)
    (tmp_path / "ci" / "registry" / "repo_suites.py").write_text(
        "from ci.registry import Entry, Suite\n"
        "SUITES = (Suite(name='nightly', tier='gpu', purpose='Nightly soak', profile='e2e',\n"
        "                label='run-ci-nightly', entries=(Entry(path='tests/e2e/t.py'),)),)\n")
    (tmp_path / "README.md").write_text((REPO / "README.md").read_text(encoding="utf-8"))
    assert run_ci("workflows", "--root", str(tmp_path)).returncode == 0
    table = (tmp_path / "README.md").read_text(encoding="utf-8")
    assert "| `nightly` | GPU | label `run-ci-nightly` | Nightly soak |" in table
    assert "`megatron`" not in table.split("## Sessions", 1)[1].split("\n## ", 1)[0]
    (tmp_path / "README.md").write_text(table.replace("Nightly soak |", "Weekly soak |"))
    check = run_ci("workflows", "--check", "--root", str(tmp_path))
    assert check.returncode == 1 and "README.md" in check.stderr


def test_the_documented_closing_lines_read_as_the_runner_writes_them():
    from ci.results import Result, closing
    from ci.select.entries import ResolvedEntry

    text = " ".join((REPO / "docs" / "running.md").read_text(encoding="utf-8").split())
    done = re.search(r"a closing line such as `(cpu_unit: [^`]+)`", text)
    stopped = re.search(r"`(cpu_unit: interrupted; [^`]+)`", text)
    assert done and stopped
    entry = ResolvedEntry(id="t", path="t", timeout=1, num_gpus=0, kind="pytest")
    shape = re.sub(r"\d+", "N", closing("cpu_unit", [Result(entry=entry, outcome="passed", passed=3)]))
    assert re.sub(r"\d+", "N", done.group(1)) == shape
    ran = Result(entry=entry, outcome="passed", passed=3)
    cut = Result(entry=entry, outcome="interrupted", failed=1)
    line = closing("cpu_unit", [ran, cut])
    assert line.startswith(stopped.group(1).rstrip("…").replace("10 of 45", "1 of 2")
                           .replace("35 stopped", "1 stopped"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
