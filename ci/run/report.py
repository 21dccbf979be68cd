"""Report: the merged JUnit file, the summary table, the step summary (from `ci.results`)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

from ci.results import Result, junit_suites


def _quarantined_suite(result: Result) -> ET.Element:
    """A quarantined entry: one skipped case that says so, whatever it did (no failure to gate on)."""
    suite = ET.Element("testsuite", {
        "name": result.entry.id, "tests": "1", "failures": "0", "errors": "0", "skipped": "1",
        "time": f"{result.seconds:.3f}",
    })
    case = ET.SubElement(suite, "testcase", {
        "classname": result.entry.path, "name": f"{result.entry.id} [QUARANTINED]",
        "time": f"{result.seconds:.3f}",
    })
    node = ET.SubElement(case, "skipped", {"type": "quarantined", "message": result.reason})
    node.text = result.output_tail
    return suite


def _synthetic_suite(result: Result) -> ET.Element:
    """A one-case suite for an entry without a JUnit file of its own (scripts, crashes)."""
    if result.outcome == "quarantined":
        return _quarantined_suite(result)
    failed = not result.ok
    suite = ET.Element("testsuite", {
        "name": result.entry.id, "tests": "1", "failures": "1" if failed else "0",
        "errors": "0", "skipped": "0", "time": f"{result.seconds:.3f}",
    })
    case = ET.SubElement(suite, "testcase", {
        "classname": result.entry.path, "name": result.entry.id, "time": f"{result.seconds:.3f}",
    })
    if failed:
        node = ET.SubElement(case, "failure", {"message": result.reason})
        node.text = result.output_tail
    return suite


def merge_junit(results: Iterable[Result], out: Path) -> Path:
    """Merge every entry's JUnit report into one `<testsuites>` file at `out`."""
    merged = ET.Element("testsuites")
    for result in results:
        suites: list[ET.Element] = []
        if result.junit_path is not None and result.entry.kind == "pytest":
            try:
                suites = junit_suites(ET.parse(result.junit_path).getroot())
            except (OSError, ET.ParseError):
                suites = []
        if not suites or result.outcome in ("timeout", "interrupted", "quarantined"):
            suites = [_synthetic_suite(result)]
        for suite in suites:
            suite.set("name", result.entry.id)
            merged.append(suite)
    out.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(merged).write(out, encoding="utf-8", xml_declaration=True)
    return out


def _fmt_gpus(devices: tuple[int, ...], num_gpus: int) -> str:
    if not num_gpus:
        return "-"
    return ",".join(map(str, devices)) if devices else str(num_gpus)


def _label(outcome: str) -> str:
    return "QUARANTINED" if outcome == "quarantined" else outcome


def table(results: Iterable[Result]) -> str:
    """Plain-text table of outcomes, slowest first."""
    rows = sorted(results, key=lambda r: (-r.seconds, r.entry.id))
    head = ("entry", "outcome", "passed", "failed", "skipped", "gpus", "seconds")
    body = [
        (r.entry.id, _label(r.outcome), str(r.passed), str(r.failed), str(r.skipped),
         _fmt_gpus(r.devices, r.entry.num_gpus), f"{r.seconds:.1f}")
        for r in rows
    ]
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=False)]
    right = {2, 3, 4, 6}

    def fmt(row: tuple[str, ...]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(row, widths, strict=True))).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(head), rule, *(fmt(r) for r in body)])


def markdown(title: str, results: Iterable[Result], closing: str) -> str:
    """The GitHub step summary: failures first, then every entry slowest first."""
    rows = sorted(results, key=lambda r: (r.ok, -r.seconds))
    icon = {"passed": "✅", "flaky": "⚠️", "deselected": "➖", "quarantined": "🚧"}
    lines = [f"### {title}", "", closing, "",
             "| entry | outcome | passed | failed | skipped | seconds |",
             "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        mark = icon.get(r.outcome, "❌")
        lines.append(f"| `{r.entry.id}` | {mark} {_label(r.outcome)} | {r.passed} | {r.failed} | "
                     f"{r.skipped} | {r.seconds:.1f} |")
    return "\n".join(lines)
