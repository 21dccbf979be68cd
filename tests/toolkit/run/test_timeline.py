"""The GPU-run timeline: the page and the gantt chart, parsed back; and a real emulated run writing both."""

import re
import socket
import sys
from html.parser import HTMLParser
from itertools import pairwise
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import run_ci, write

from ci.run import timeline
from ci.run.runner import Result
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0

T0 = 1_800_000_000.0


class Page(HTMLParser):
    """Collects the timeline's rows, bars, waits and idle gaps, and anything fetched from outside."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[str] = []
        self.bars: list[dict[str, str]] = []
        self.waits: list[dict[str, str]] = []
        self.gaps: list[dict[str, str]] = []
        self.external: list[str] = []
        self.tags: set[str] = set()
        self._row = ""

    def handle_starttag(self, tag, attrs):
        a = {k: v or "" for k, v in attrs}
        self.tags.add(tag)
        for key in ("src", "href"):
            if key in a:
                self.external.append(a[key])
        if tag in {"link", "script"}:
            self.external.append(tag)
        cls = a.get("class", "")
        if tag == "g" and cls == "row":
            self._row = a["data-row"]
            self.rows.append(self._row)
        elif tag == "rect" and cls == "bar":
            self.bars.append({**a, "row": self._row})
        elif tag == "rect" and cls == "gap":
            self.gaps.append({**a, "row": self._row})
        elif tag == "rect" and cls == "wait":
            self.waits.append(a)

    def handle_endtag(self, tag):
        if tag == "g":
            self._row = ""


def _parse(text: str) -> Page:
    page = Page()
    page.feed(text)
    page.close()
    return page


def _entry(name: str, gpus: int) -> ResolvedEntry:
    return ResolvedEntry(id=f"tests/e2e/{name}.py", path=f"tests/e2e/{name}.py", timeout=60,
                        num_gpus=gpus, kind="script")


def _result(name, gpus, devices, *, queued, start, end, outcome="passed", node="box", earlier=()):
    return Result(entry=_entry(name, gpus), outcome=outcome, devices=devices, node=node,
                  queued_at=None if queued is None else T0 + queued, started_at=T0 + start,
                  ended_at=T0 + end, earlier=earlier)


@pytest.fixture
def run():
    """Three GPUs: a 2-GPU entry, one that waited for it, a retried one, a 0-GPU check, an idle GPU."""
    first_try = _result("test_retry", 1, (2,), queued=0, start=0, end=1, outcome="failed")
    return [
        _result("test_big", 2, (0, 1), queued=0, start=0, end=4),
        _result("test_after", 1, (0,), queued=0.5, start=4, end=6, outcome="failed"),
        _result("test_retry", 1, (2,), queued=1, start=1, end=3, outcome="flaky", earlier=(first_try,)),
        _result("test_cfg", 0, (), queued=None, start=0, end=0.5),
    ]


def test_page_has_a_row_per_gpu_and_a_bar_per_entry_and_gpu(run):
    tl = timeline.build(run, title="train: GPU timeline", gpu_rows=[f"box:{i}" for i in range(4)])
    page = _parse(timeline.html(tl))
    assert page.external == [], "the page must not fetch anything"
    assert page.rows == ["box:0", "box:1", "box:2", "box:3", "box:cpu1"]
    got = sorted((b["row"], b["data-entry"].rsplit("/", 1)[1], b["data-outcome"], b["data-attempt"],
                  float(b["data-start"]), float(b["data-end"])) for b in page.bars)
    assert got == sorted([
        ("box:0", "test_big.py", "passed", "1", 0.0, 4.0),
        ("box:1", "test_big.py", "passed", "1", 0.0, 4.0),
        ("box:0", "test_after.py", "failed", "1", 4.0, 6.0),
        ("box:2", "test_retry.py", "failed", "1", 0.0, 1.0),
        ("box:2", "test_retry.py", "flaky", "2", 1.0, 3.0),
        ("box:cpu1", "test_cfg.py", "passed", "1", 0.0, 0.5),
    ])
    # Geometry follows the times: one scale for every bar, starting at the label column.
    scale = timeline.CHART_W / 6.0
    for b in page.bars:
        assert float(b["x"]) == pytest.approx(timeline.LABEL_W + float(b["data-start"]) * scale, abs=0.01)
        width = (float(b["data-end"]) - float(b["data-start"])) * scale
        assert float(b["width"]) == pytest.approx(width, abs=0.01)
        assert b["fill"] == timeline.COLOURS[b["data-outcome"]]
    by_outcome = {b["data-outcome"]: b for b in page.bars}
    assert by_outcome["passed"]["fill"] != by_outcome["failed"]["fill"] != by_outcome["flaky"]["fill"]


def test_page_shows_waits_and_idle_gaps(run):
    tl = timeline.build(run, title="t", gpu_rows=[f"box:{i}" for i in range(4)])
    page = _parse(timeline.html(tl))
    waits = sorted((w["data-entry"].rsplit("/", 1)[1], w["data-attempt"], float(w["data-start"]),
                    float(w["data-end"])) for w in page.waits)
    # Only real waits: entries that got their GPUs at once draw no wait bar.
    assert waits == [("test_after.py", "1", 0.5, 4.0)]
    gaps = sorted((g["row"], float(g["data-start"]), float(g["data-end"])) for g in page.gaps)
    # GPU 1 idles after the big entry, GPU 2 after the retry, GPU 3 the whole run; GPU 0 never.
    assert gaps == [("box:1", 4.0, 6.0), ("box:2", 3.0, 6.0), ("box:3", 0.0, 6.0)]
    assert tl.busy("box:0") == pytest.approx(6.0)


def test_hover_titles_name_the_entry_and_its_times(run):
    tl = timeline.build(run, title="t", gpu_rows=["box:0", "box:1", "box:2"])
    text = timeline.html(tl)
    match = re.search(r'data-entry="tests/e2e/test_after.py"[^>]*><title>([^<]*)</title>', text)
    assert match is not None
    tip = match.group(1)
    assert tip.startswith("tests/e2e/test_after.py\nattempt 1: failed\nran +4.0s to +6.0s (2.0s, ")
    assert "waited 3.5s for GPUs" in tip and tip.endswith("on box:0")


def test_mermaid_gantt_has_a_section_per_used_gpu_and_a_task_per_bar(run):
    tl = timeline.build(run, title="train: GPU timeline", gpu_rows=[f"box:{i}" for i in range(4)])
    text = timeline.mermaid(tl)
    lines = text.splitlines()
    assert lines[:7] == ["---", "displayMode: compact", "---", "gantt", "    title train- GPU timeline",
                         "    dateFormat x", "    axisFormat %H:%M:%S"]
    sections: dict[str, list[str]] = {}
    current = ""
    task = re.compile(r"^    ([^:#;]+) :(?:(done|active|crit), )?(\d+), (\d+)$")
    for line in lines[7:]:
        if line.startswith("    section "):
            current = line.removeprefix("    section ")
            sections[current] = []
            continue
        m = task.match(line)
        assert m, f"not a gantt task line: {line!r}"
        assert int(m.group(4)) > int(m.group(3))
        sections[current].append(f"{m.group(2) or '-'} {m.group(1)} {int(m.group(3)) - T0 * 1000:.0f}")
    # Idle box:3 has no bars, so no section; the names carry no ':', '#' or ';'.
    assert sections == {
        "box gpu 0": ["done test_big.py passed 0", "crit test_after.py failed 4000"],
        "box gpu 1": ["done test_big.py passed 0"],
        "box gpu 2": ["crit test_retry.py failed 0", "active test_retry.py flaky 1000"],
        "box cpu1": ["done test_cfg.py passed 0"],
        "waiting for GPUs": ["- test_after.py waits 500"],
    }
    block = timeline.summary_markdown(tl, "/runs/x/timeline.html")
    assert f"```mermaid\n{text}```" in block and block.rstrip().endswith("`/runs/x/timeline.html`")


REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", timeout=120, entries=(
            Entry(path="tests/e2e/test_two.py", test_args=("--tag", "a")),
            Entry(path="tests/e2e/test_two.py", test_args=("--tag", "b")),
            Entry(path="tests/e2e/test_one.py", test_args=("--tag", "c")),
            Entry(path="tests/e2e/test_one.py", test_args=("--tag", "fail")),
        )),
    )
"""

SLEEPER = """
    import sys, time
    NUM_GPUS = {n}

    def execute():
        time.sleep(0.6)
        raise SystemExit(1 if "fail" in sys.argv else 0)

    if __name__ == "__main__":
        execute()
"""


def test_a_gpu_run_writes_the_page_and_the_summary_chart(tmp_path):
    checkout = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY,
                                         "tests/e2e/test_two.py": SLEEPER.format(n=2),
                                         "tests/e2e/test_one.py": SLEEPER.format(n=1)})
    summary = tmp_path / "summary.md"
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--emulate-gpus", "--gpus", "3",
                  env={"GITHUB_STEP_SUMMARY": str(summary)}, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("timeline: ") and last.endswith("/timeline.html")
    path = Path(last.removeprefix("timeline: "))
    assert path.parent.parent == checkout / ".ci-cache" / "runs"
    page = _parse(path.read_text(encoding="utf-8"))
    host = socket.gethostname()
    assert page.rows == [f"{host}:0", f"{host}:1", f"{host}:2"]
    spans: dict[str, list[tuple[str, float, float]]] = {}
    for b in page.bars:
        spans.setdefault(b["data-entry"], []).append((b["row"], float(b["data-start"]), float(b["data-end"])))
    assert sorted((e.split()[-1], len(v)) for e, v in spans.items()) == [("a", 2), ("b", 2), ("c", 1),
                                                                         ("fail", 1)]
    outcomes = {b["data-entry"].split()[-1]: b["data-outcome"] for b in page.bars}
    assert outcomes == {"a": "passed", "b": "passed", "c": "passed", "fail": "failed"}
    # 6 GPU-slots of work on 3 GPUs: no GPU is held by two bars at once, and someone waited.
    for row in page.rows:
        mine = sorted((s, e) for v in spans.values() for r, s, e in v if r == row)
        assert all(a[1] <= b[0] + 1e-3 for a, b in pairwise(mine)), (row, mine)
    assert any(float(w["data-end"]) - float(w["data-start"]) >= 0.3 for w in page.waits)
    chart = summary.read_text(encoding="utf-8")
    assert "```mermaid\n---\ndisplayMode: compact\n---\ngantt\n" in chart
    used = sorted({b["row"].rsplit(":", 1)[1] for b in page.bars})  # which GPUs got work depends on timing
    assert re.findall(r"^    section \S+ gpu (\d)$", chart, flags=re.M) == used
    assert f"Full timeline: `{path}`" in chart


def test_a_cpu_suite_writes_no_timeline(tmp_path):
    checkout = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_ok.py": """
        NUM_GPUS = 0
        def test_ok():
            assert True
    """})
    proc = run_ci("run", "--suite", "unit", "--root", str(checkout), timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "timeline" not in proc.stdout
    assert not list((checkout / ".ci-cache" / "runs").glob("*/timeline.html"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
