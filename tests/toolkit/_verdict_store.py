"""Planted histories for the tests of `python -m ci why`, and the command called in-process.

A registry with one GPU suite (`gpu`, six entries) and one CPU suite (`cpu`); six trusted runs
of main; a pull request's push with one entry of each verdict. The store is real (SQLite or
PostgreSQL), the command is the real one through the command table (`in_process`, which
the issue tracker's tests use too).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

ENTRIES = ("new", "main", "flaky", "infra", "fresh", "ok")
# A laptop's checkout for `why --last` and `history pull`: one CPU suite of two files.
LAPTOP_REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="e2e", entries=(
            Entry(path="tests/test_a.py"), Entry(path="tests/test_b.py"))),
    )
"""
FAILING = "NUM_GPUS = 0\n\n\ndef test_it():\n    assert 1 + 1 == 3, 'planted'\n"


def laptop_run(base: Path) -> Path:
    """A checkout under `base` where `ci run` just failed both files of LAPTOP_REGISTRY at their
    assertion, as on a laptop (no GitHub variables, no store URL): it recorded into its own store."""
    import os

    from _ci import run_ci, write

    root = write(base / "repo", {"ci/registry/repo_suites.py": LAPTOP_REGISTRY,
                                 "tests/test_a.py": FAILING, "tests/test_b.py": FAILING})
    env = {k: "" for k in os.environ if k.startswith("GITHUB_")} | {"SLIME_CI_HISTORY_URL": ""}
    ran = run_ci("run", "--suite", "unit", "--root", str(root), "--no-prefork", "--no-docker", env=env)
    assert ran.returncode == 1 and "history: recorded run" in ran.stdout, ran.stdout + ran.stderr
    return root


def registry(blocks: str = "", *, cpu: bool = False) -> str:
    entries = ", ".join(f'Entry(path="tests/e2e/test_{e}.py")' for e in ENTRIES)
    cpu_suite = ('\n            Suite(name="cpu", tier="cpu", purpose="p", profile="e2e", '
                 'entries=(Entry(path="tests/test_cpu.py"),)),') if cpu else ""
    return f"""
        from ci.registry import Entry, Suite

        SUITES = (
            Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu",
                  entries=({entries},){blocks}),{cpu_suite}
        )
    """


def attempt(entry: str, outcome: str, n: int = 1, final: bool = True, reason: str = "",
            code: int | None = None, node: str = "gpu-1") -> AttemptRecord:
    path = f"tests/e2e/test_{entry}.py"
    return AttemptRecord(entry_id=path, path=path, attempt=n, final=final, outcome=outcome, reason=reason,
                         exit_code=code if code is not None else (0 if outcome in ("passed", "flaky") else 1),
                         node=node, num_gpus=1, seconds=5.0)


def run(uid: str, commit: str, at: float, attempts: list[AttemptRecord], *, branch: str = "main",
        pr: int | None = None, backend: str = "") -> RunRecord:
    return RunRecord(uid=uid, suite="gpu", commit=commit, branch=branch, event="push" if pr is None else
                     "pull_request", hardware="cuda", started_at=at, ended_at=at + 60, exit_code=0,
                     trusted=pr is None, pr=pr, attempts=tuple(attempts), backend=backend)


def plant_main(url: str) -> None:
    """Six runs on main: m4..m6 break `main`; everything else passes; `fresh` never ran."""
    with open_store(url) as store:
        for n in range(1, 7):
            tries = [attempt(e, "passed") for e in ("new", "flaky", "infra", "ok")]
            tries.append(attempt("main", "failed", reason="AssertionError: broken on main") if n >= 4
                         else attempt("main", "passed"))
            store.record(run(f"main-{n}", f"m{n}" + "0" * 9, n * 100.0, tries))


def plant_push(url: str, n: int, *, pr: int = 42) -> str:
    """The PR's n-th push: one entry of each kind failing (and a pass)."""
    commit = f"p{n}" + "f" * 9
    tries = [attempt("new", "failed", reason="AssertionError: the PR broke it"),
             attempt("main", "failed", reason="AssertionError: broken on main"),
             attempt("flaky", "failed", final=False, reason="TimeoutError: rollout stalled"),
             attempt("flaky", "flaky", n=2, reason="failed 1 time(s), then passed"),
             attempt("infra", "lost", reason="node gpu-7 lost mid-entry", code=-9),
             attempt("fresh", "failed", reason="ModuleNotFoundError: No module named 'x'"),
             attempt("ok", "passed")]
    with open_store(url) as store:
        store.record(run(f"pr-{n}", commit, 1000.0 + n, tries, branch="feature", pr=pr))
    return commit


def plant_pr(url: str, tries: list[AttemptRecord], *, pr: int, backend: str = "", uid: str = "") -> None:
    """One run of a pull request with these attempts."""
    with open_store(url) as store:
        store.record(run(uid or f"pr-{pr}", "pxffffffff", 2000.0, tries, branch="feature", pr=pr,
                         backend=backend))


Command = Callable[..., SimpleNamespace]


def in_process(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, command: str) -> Command:
    """`python -m ci COMMAND --history URL --root ROOT …` through the command table, in this
    process: (exit code, stdout, stderr). URL None: no --history."""
    from ci.cli import main

    for name in ("GITHUB_ACTIONS", "GITHUB_STEP_SUMMARY", "GITHUB_TOKEN", "GITHUB_REPOSITORY", "GITHUB_API_URL",
                 "SLIME_CI_HISTORY_URL"):
        monkeypatch.delenv(name, raising=False)

    def call(root: Path, url: str | None, *args: str, env: dict[str, str] | None = None) -> SimpleNamespace:
        with monkeypatch.context() as m:
            for k, v in (env or {}).items():
                m.setenv(k, v)
            store = ["--history", url] if url is not None else []
            code = main([command, *store, "--root", str(root), *args])
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)
    return call


def why_command(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Command:
    """`python -m ci why …` in this process."""
    return in_process(capsys, monkeypatch, "why")
