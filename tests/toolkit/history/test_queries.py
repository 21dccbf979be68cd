"""`python -m ci history monitor` judges only entries the checkout's registry has: a deleted (or a
forged) entry never runs again, so its streak would alert and plan a bisect every hour for ever.

A real registry and test files in tmp_path, a real SQLite store, the command in-process.
"""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, write

from ci.history import queries
from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0
KEPT, GONE = "tests/test_kept.py", "tests/test_gone.py"
REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="train", tier="cpu", purpose="p", profile="cpu", entries=(Entry(path="tests/test_kept.py"),)),
    )
"""


def _history(root: Path, failing: list[tuple[str, str]]) -> str:
    """Each (suite, entry) passes at c0, then fails on c1..c3 of main."""
    url = f"sqlite:///{root / 'history.sqlite'}"
    with open_store(url) as store:
        for n in range(4):
            store.record(RunRecord(
                uid=f"{n:032x}", suite="train", commit=f"c{n}", branch="main", event="push",
                started_at=float(n + 1), ended_at=float(n + 2), exit_code=int(n > 0),
                attempts=tuple(AttemptRecord(entry_id=e, path=e, attempt=1, final=True,
                                             outcome="failed" if n else "passed", reason="boom")
                               for s, e in failing if s == "train")))
            others = [(s, e) for s, e in failing if s != "train"]
            for s, e in others:
                store.record(RunRecord(
                    uid=f"{n + 10:032x}", suite=s, commit=f"c{n}", branch="main", event="push",
                    started_at=float(n + 1), ended_at=float(n + 2), exit_code=int(n > 0),
                    attempts=(AttemptRecord(entry_id=e, path=e, attempt=1, final=True,
                                            outcome="failed" if n else "passed", reason="boom"),)))
    return url


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return write(tmp_path, {".slime-ci/suites.py": REGISTRY, KEPT: PASSING})  # GONE was deleted


def _monitor(root: Path, url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, list[str],
                                                                               list[dict[str, str]], str, str]:
    """Exit code, the failing entries it reports, its bisect plan, its warnings, its report."""
    plan, report = root / "plan.jsonl", root / "monitor.md"
    code = queries.main(["monitor", "--history", url, "--root", str(root), "--json",
                         "--bisect-plan", str(plan), "--out", str(report)])
    out, err = capsys.readouterr()
    rows = [json.loads(line) for line in plan.read_text().splitlines()]
    return code, [s["entry_id"] for s in json.loads(out)], rows, err, report.read_text()


def test_a_streak_of_an_entry_the_registry_lacks_raises_no_alert_and_no_bisect(
        root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = _history(root, [("train", GONE), ("ghost", "tests/made_up.py")])
    code, failing, plan, err, report = _monitor(root, url, capsys)
    assert code == 0  # the alert clears: nothing the registry has is failing
    assert failing == [] and plan == []  # no bisect of a file that is not there, planned again every hour
    assert f"monitor: train: '{GONE}' failed 3 runs but is not in the registry" in err
    assert "monitor: ghost: 'tests/made_up.py' failed 3 runs but is not in the registry" in err
    assert "2 failing entries not in the registry (deleted, or never registered) ignored." in report
    assert "made_up" not in report  # a forged name never reaches the report


def test_a_registered_entrys_streak_still_alerts_beside_them(root: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    url = _history(root, [("train", KEPT), ("train", GONE)])
    code, failing, plan, err, report = _monitor(root, url, capsys)
    assert code == 1 and failing == [KEPT]
    assert plan == [{"suite": "train", "tier": "cpu", "entry": KEPT}]
    assert f"`{KEPT}`" in report and GONE not in report and GONE in err


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
