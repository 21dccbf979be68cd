"""A planted run history for the HUD's tests and benchmark: 50 commits of main, written
through the store's own writer, with the cells every HUD build must show.

What is planted (commit numbers count from 0, oldest first):
- tests/test_streak.py fails on commits 20-21 (a streak of two that ended) and 45-49 (the
  current streak, whose bisect answer is in the `bisects` table);
- tests/test_flaky.py fails and passes on a retry on commits 10 and 30 (2 of 50 runs);
- tests/test_held.py does so on every fifth commit from 2 (10 of 50: 20%, above the 10% of
  the auto-quarantine, so it is held and its failing cells show as quarantined);
- tests/test_lost.py lost its node on commit 33 (infrastructure);
- an entry named `<img src=x onerror=alert(1)>` fails once, on commit 40, with a reason
  that is markup too; tests/test_new.py exists from commit 25 on;
- the GPU suite `train` ran tests/e2e/test_job.py (2 GPUs, host gpu-a) on even commits,
  with a `reward` series its gate watches;
- pull request 7 ran `unit` once (untrusted): tests/test_a.py failed there.
"""

from __future__ import annotations

import hashlib
import uuid
from html.parser import HTMLParser
from pathlib import Path

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store
from ci.results import MetricPoint

T0 = 1_793_491_200.0  # 2026-11-01 00:00 UTC
STEP = 3 * 3600.0  # a commit every three hours
COMMITS = 50
XSS = "<img src=x onerror=alert(1)>"
XSS_REASON = "<script>alert(2)</script> expected 1 == 2"
UNIT = ("tests/test_a.py", "tests/test_streak.py", "tests/test_flaky.py", "tests/test_held.py",
        "tests/test_lost.py", XSS, "tests/test_new.py")
JOB = "tests/e2e/test_job.py"
STREAKS = {"tests/test_streak.py": ((20, 21), (45, 46, 47, 48, 49))}
FLAKY = {"tests/test_flaky.py": (10, 30), "tests/test_held.py": tuple(range(2, COMMITS, 5))}
LOST = {"tests/test_lost.py": (33,)}
REGISTRY = """
    from ci.registry import Entry, MetricGate, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train", entries=(
            Entry(path="tests/e2e/test_job.py", gates=(MetricGate(metric="reward", rule="absolute",
                                                                    low=0.0, high=2.0),)),
        )),
    )
"""


def sha(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def expected(i: int, entry: str) -> str:
    """The class of the cell the HUD must show for `entry` on commit i."""
    if entry == JOB:
        return "pass" if i % 2 == 0 else "not-run"
    if entry == "tests/test_new.py" and i < 25:
        return "not-run"
    if any(i in s for s in STREAKS.get(entry, ())) or (entry == XSS and i == 40):
        return "fail"
    if i in FLAKY.get(entry, ()):
        return "quarantined" if entry == "tests/test_held.py" else "flaky"
    if i in LOST.get(entry, ()):
        return "infra"
    return "pass"


def first_reds() -> set[tuple[int, str]]:
    """(commit, entry) of each streak's first red commit."""
    return {(s[0], e) for e, streaks in STREAKS.items() for s in streaks} | {(40, XSS)}


def _attempts(i: int) -> list[AttemptRecord]:
    out: list[AttemptRecord] = []
    for entry in UNIT:
        kind = expected(i, entry)
        path = entry if entry.startswith("tests/") else "tests/test_xss.py"
        if kind == "not-run":
            continue
        if kind == "fail":
            reason = XSS_REASON if entry == XSS else "AssertionError: loss 0.93 > 0.5"
            out.append(AttemptRecord(entry_id=entry, path=path, attempt=1, final=True, outcome="failed",
                                     failed=1, seconds=4.0, reason=reason, exit_code=1))
        elif kind in ("flaky", "quarantined"):
            out.append(AttemptRecord(entry_id=entry, path=path, attempt=1, final=False, outcome="failed",
                                     failed=1, seconds=3.0, reason=f"TimeoutError: port {9000 + i} busy",
                                     exit_code=1))
            out.append(AttemptRecord(entry_id=entry, path=path, attempt=2, final=True, outcome="flaky",
                                     passed=1, seconds=3.5, exit_code=0))
        elif kind == "infra":
            out.append(AttemptRecord(entry_id=entry, path=path, attempt=1, final=True, outcome="lost",
                                     seconds=1.0, reason="node gpu-b lost (ray worker died)"))
        else:
            out.append(AttemptRecord(entry_id=entry, path=path, attempt=1, final=True, outcome="passed",
                                     passed=1, seconds=2.0 + (i % 7) * 0.5, exit_code=0))
    return out


def plant(url: str) -> dict[tuple[int, str], str]:
    """Write the planted history into the store at `url`; (commit, suite) -> its run's uid."""
    from ci.history import schema

    uids: dict[tuple[int, str], str] = {}
    with open_store(url) as store:
        for i in range(COMMITS):
            at = T0 + i * STEP
            uids[(i, "unit")] = uuid.uuid4().hex
            uids[(i, "train")] = uuid.uuid4().hex
            store.record(RunRecord(uid=uids[(i, "unit")], suite="unit", commit=sha(i), branch="main",
                                   event="push", host="ci-cpu", hardware="cpu", started_at=at,
                                   ended_at=at + 60, exit_code=0, attempts=tuple(_attempts(i))))
            if i % 2 == 0:
                dev = "0,1" if i % 4 == 0 else "2,3"
                store.record(RunRecord(
                    uid=uids[(i, "train")], suite="train", commit=sha(i), branch="main", event="schedule",
                    host="gpu-a", hardware="cuda", started_at=at + 120, ended_at=at + 720, exit_code=0,
                    attempts=(AttemptRecord(entry_id=JOB, path=JOB, attempt=1, final=True, outcome="passed",
                                            passed=1, num_gpus=2, devices=dev, node="gpu-a",
                                            seconds=600.0, exit_code=0),),
                    metrics=tuple(MetricPoint(entry_id=JOB, step=s, name="reward", value=0.1 * s + i / 100)
                                  for s in range(1, 6))))
        pr_at = T0 + COMMITS * STEP
        store.record(RunRecord(
            uid=uuid.uuid4().hex, suite="unit", commit="f" * 40, branch="feature", event="pull_request",
            host="ci-cpu", hardware="cpu", started_at=pr_at, ended_at=pr_at + 60, exit_code=1,
            trusted=False, pr=7,
            attempts=(AttemptRecord(entry_id="tests/test_a.py", path="tests/test_a.py", attempt=1, final=True,
                                    outcome="failed", failed=1, seconds=2.0, reason="AssertionError: 3 != 4",
                                    exit_code=1),
                      AttemptRecord(entry_id="tests/test_flaky.py", path="tests/test_flaky.py", attempt=1,
                                    final=True, outcome="passed", passed=1, seconds=2.0, exit_code=0))))
        with store.engine.begin() as conn:  # as `python -m ci bisect` records its answer
            conn.execute(schema.bisects.insert().values(
                uid=uuid.uuid4().hex, suite="unit", entry_id="tests/test_streak.py", good=sha(44), bad=sha(45),
                kind="first-bad", commit=sha(45), candidates=sha(45), confidence=0.99, attempts_per_commit=1,
                width=1, rounds=1, steps=1, trigger="monitor", started_at=T0 + 46 * STEP,
                ended_at=T0 + 46 * STEP + 900,
                summary=f"tests/test_streak.py: first bad commit {sha(45)[:10]} (99% confidence)"))
    return uids


def store_url(folder: Path) -> str:
    return f"sqlite:///{folder / 'history.sqlite'}"


class _Cells(HTMLParser):
    """The grid of an index.html: (commit, entry) -> (class, href, label) of each cell."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: list[str] = []
        self.cells: dict[tuple[str, str], tuple[str, str, str]] = {}
        self._in_head = self._in_body = False
        self._row_sha = ""
        self._col = -1

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "table" and "grid" in a.get("class", ""):
            self._in_head = True
        elif tag == "tbody" and self._in_head:
            self._in_head, self._in_body = False, True
        elif self._in_head and tag == "a" and "title" in a:
            self.entries.append(a["title"])
        elif self._in_body and tag == "tr":
            self._row_sha, self._col = "", -1
        elif self._in_body and tag == "a" and a.get("href", "").startswith("https://github.com/"):
            self._row_sha = a["href"].rsplit("/", 1)[-1]
        elif self._in_body and tag == "td":
            self._col += 1
        elif self._in_body and tag in ("a", "span") and "aria-label" in a:
            key = (self._row_sha, self.entries[self._col])
            self.cells[key] = (a.get("class", ""), a.get("href", ""), a["aria-label"])

    def handle_endtag(self, tag: str) -> None:
        if tag == "tbody":
            self._in_body = False


def grid_cells(page: str) -> tuple[list[str], dict[tuple[str, str], tuple[str, str, str]]]:
    """The column heads (entry ids) and the cells of a built index.html (built with --repo)."""
    parser = _Cells()
    parser.feed(page)
    return parser.entries, parser.cells
