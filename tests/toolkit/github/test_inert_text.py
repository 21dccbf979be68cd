"""What a test printed, put in the verdict comment or an issue, is rendered as text and nothing else.

The comment and the issue bodies are rendered by a real CommonMark renderer with GitHub's
tables and raw HTML on (markdown-it-py; GitHub's own renderer is not on this machine), and
read back token by token: whatever the reason of a failure or the name of an entry holds
(`@someone`, `<img>`, `<!--`, a run of backticks, a `|`), it shows up inside a code span, no
tag of it is HTML, no word of it is a mention, and every table row keeps its four cells.
"""

import re
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers

from ci.github.flaky_issues import wanted_issues
from ci.github.pr_verdicts import markdown
from ci.history.store import AttemptRow
from ci.history.verdicts import Verdict
from ci.registry.model import Entry, Suite

NUM_GPUS = 0
RENDER = MarkdownIt("commonmark", {"html": True}).enable("table")
OURS = {"<sub>", "</sub>"}  # the only inline HTML the comment itself writes
MENTION = re.compile(r"(?<![\w`])@[A-Za-z0-9]")
HOSTILE = ["@alice please look", "<img src=https://evil.example/i.png>", "<!-- the rest is hidden",
           "``` breakout ` and `` more", "a | b | c", "line one\nline two\u2028three\x85four",
           "[click](https://evil.example)", "<details><summary>x", "&lt;img&gt;", "\u202eevil\u202c"]


def tokens(body: str):
    """Every block token, and every inline token inside them, in order."""
    for block in RENDER.parse(body):
        yield block
        yield from block.children or ()


def assert_inert(body: str, foreign: list[str], *, markers: int = 1, links: str | None = None) -> None:
    html_blocks = [t.content.strip() for t in tokens(body) if t.type == "html_block"]
    assert len(html_blocks) == markers and all(b.startswith("<!-- slime-ci:") and b.endswith("-->")
                                               and b.count("-->") == 1 for b in html_blocks), html_blocks
    shown = " ".join(t.content for t in tokens(body) if t.type == "code_inline")
    for t in tokens(body):
        assert t.type != "html_inline" or t.content in OURS, t.content
        assert t.type != "image", t
        if t.type == "link_open":
            assert links is not None and str(t.attrs.get("href", "")).startswith(links), t.attrs
        if t.type == "text":
            assert not MENTION.search(t.content), t.content
    for text in foreign:  # shown, not dropped: its letters and digits are in a code span
        letters = re.sub(r"\W", "", text)[:30]
        assert letters in re.sub(r"\W", "", shown), (text, shown)
    rows = body.count("\n| ") - body.count("\n| entry |")
    cells = [t for t in tokens(body) if t.type == "td_open"]
    assert len(cells) == 4 * rows, "a row lost or gained a cell"


def verdict(reason: str, entry: str, job: str = "") -> Verdict:
    return Verdict(suite="gpu", entry_id=entry, path=entry, kind="new", rule="new",
                   evidence=f"failed {reason} here; main passed it", outcome="failed", reason=reason,
                   run_uid="r", commit="abc", gh_run_id="912" if job else "", gh_run_attempt=2, gh_job=job)


_text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=60),
                  st.lists(st.sampled_from(["@", "<", ">", "!--", "`", "|", "\n", "\\", "img", "x"]),
                           max_size=20).map("".join))


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasons=st.lists(_text, min_size=1, max_size=3), entry=_text)
@example(reasons=HOSTILE, entry="tests/e2e/test_x.py @bob <img src=x>")
def test_the_verdict_comment_quotes_every_reason_and_entry_inert(reasons, entry):
    verdicts = [verdict(r, f"{entry}{i}") for i, r in enumerate(reasons)]
    body = markdown(verdicts, verdicts, title="PR #1", note="", suites={}, rules={})
    assert_inert(body, [*reasons, entry])
    # The job's name comes from the record too: its link's text quotes it inert, and the only
    # link is the run's.
    linked = [verdict(r, f"{entry}{i}", job=f"{entry}j") for i, r in enumerate(reasons)]
    body = markdown(linked, linked, title="PR #1", note="", suites={}, rules={}, repo="acme/slime")
    assert_inert(body, [*reasons, entry], links="https://github.com/acme/slime/actions/runs/912/attempts/2")
    assert body.count("](https://github.com/acme/slime/actions/runs/912/attempts/2)") == len(reasons)


def _row(n, entry, reason):
    return AttemptRow(run_uid=f"main-{n}", suite="gpu", commit=f"{n:040x}", branch="main", event="push",
                      hardware="cuda", started_at=float(n), entry_id=entry, path=entry.split(" ")[0],
                      attempt=1, final=True, outcome="failed", seconds=1.0, reason=reason, num_gpus=1,
                      gh_run_id=str(7000 + n), gh_run_attempt=1, gh_job=entry)


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(reasons=st.lists(_text, min_size=3, max_size=4), entry=_text.filter(str.strip))
@example(reasons=HOSTILE[:4], entry="x --> <img src=https://evil.example/i.png> <!--")
def test_an_issue_body_quotes_every_reason_and_entry_inert(tmp_path_factory, reasons, entry):
    suite = Suite(name="gpu", tier="gpu", purpose="p", profile="e2e", label="run-ci-gpu",
                  entries=(Entry(path="tests/e2e/test_x.py"),))
    rows = [_row(n, entry, r) for n, r in enumerate(reasons, 1)]
    [w] = wanted_issues(rows, [suite], tmp_path_factory.mktemp("repo"), repo="acme/slime")
    assert_inert(w.body, [*reasons[-3:], entry], links="https://github.com/acme/slime/")
    for n in range(len(reasons) - 2, len(reasons) + 1):  # each failure links its commit and its run
        assert f"(https://github.com/acme/slime/commit/{n:040x})" in w.body, w.body
        assert f"](https://github.com/acme/slime/actions/runs/{7000 + n}/attempts/1)" in w.body, w.body
    assert "@" not in w.title.replace("@\u2060", ""), w.title


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
