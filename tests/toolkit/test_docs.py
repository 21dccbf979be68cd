"""The README is the front door and docs/ the house: every link leads somewhere real.

Every relative link in README.md and docs/**/*.md names a file of the repository and, with a
`#anchor` into a Markdown file, one of its headings (GitHub's slugs); the README stays short;
every docs page can be reached from the README by following links.
"""

import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import unquote

import pytest
from _ci import REPO

NUM_GPUS = 0

README_MAX_LINES = 250

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^ {0,3}#{1,6}[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title"): the text may hold one level of brackets ([`x`][y] is not used here).
_INLINE_LINK = re.compile(r"\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^()\s]+)(?:\s+\"[^\"]*\")?\s*\)")
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def prose_lines(text: str) -> Iterator[str]:
    """The lines of a Markdown text outside fenced code blocks."""
    fence = ""
    for line in text.splitlines():
        if m := _FENCE.match(line):
            mark = m.group(1)
            if not fence:
                fence = mark
                continue
            if mark[0] == fence[0] and len(mark) >= len(fence) and not line.strip()[len(mark):].strip():
                fence = ""
                continue
        if not fence:
            yield line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text lower-cased, punctuation dropped, spaces as '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text, not its target
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", text)  # emphasis marks; snake_case keeps its _
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor, repeated headings numbered -1, -2, ... as GitHub does."""
    seen: dict[str, int] = {}
    found = set()
    for line in prose_lines(text):
        if m := _HEADING.match(line):
            slug = github_slug(m.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            found.add(slug if count == 0 else f"{slug}-{count}")
    return found


def link_targets(text: str) -> list[str]:
    """Targets of the inline links and link definitions, outside code blocks and code spans."""
    targets = []
    for line in prose_lines(text):
        if m := _REFERENCE.match(line):
            targets.append(m.group(1))
            continue
        targets += [m.group(1) for m in _INLINE_LINK.finditer(_CODE_SPAN.sub("", line))]
    return [t[1:-1] if t.startswith("<") else t for t in targets]


def doc_pages(root: Path) -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def _resolve(root: Path, page: Path, target: str) -> tuple[Path | None, str]:
    """(the file a relative link names, its anchor); None for links that leave the repository."""
    path, _, anchor = target.partition("#")
    path = unquote(path)
    if not path:
        return page, anchor
    base = root if path.startswith("/") else page.parent
    resolved = (base / path.lstrip("/")).resolve()
    return (resolved if resolved.is_relative_to(root.resolve()) else None), anchor


def broken_links(root: Path) -> list[str]:
    """One line per relative link of README.md and docs/ that names no file, or no heading of it."""
    problems = []
    for page in doc_pages(root):
        where = page.relative_to(root)
        for target in link_targets(page.read_text(encoding="utf-8")):
            if _SCHEME.match(target) or target.startswith("//"):
                continue  # https:, mailto:: not a file of the repository
            resolved, anchor = _resolve(root, page, target)
            if resolved is None:
                problems.append(f"{where}: {target}: leads out of the repository")
            elif not resolved.exists():
                problems.append(f"{where}: {target}: no such file")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved.read_text(encoding="utf-8")):
                problems.append(f"{where}: {target}: no heading with the anchor #{anchor}")
    return problems


def unreached_pages(root: Path) -> list[str]:
    """docs/ pages no chain of links from README.md reaches."""
    reached = {(root / "README.md").resolve()}
    todo = list(reached)
    while todo:
        page = todo.pop()
        for target in link_targets(page.read_text(encoding="utf-8")):
            if _SCHEME.match(target) or target.startswith("//"):
                continue
            resolved, _ = _resolve(root, page, target)
            if resolved and resolved.suffix == ".md" and resolved.is_file() and resolved not in reached:
                reached.add(resolved)
                todo.append(resolved)
    return [str(p.relative_to(root)) for p in doc_pages(root) if p.resolve() not in reached]


# --- the repository's own pages ---------------------------------------------------------------

def test_every_relative_link_leads_to_a_file_and_heading():
    assert len(doc_pages(REPO)) > 10, "docs/ pages not found"
    assert broken_links(REPO) == []


def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move reference material to docs/"


def test_every_docs_page_is_reached_from_the_readme():
    assert unreached_pages(REPO) == []


def test_a_broken_link_in_a_copy_of_the_real_pages_is_found(tmp_path):
    shutil.copy(REPO / "README.md", tmp_path / "README.md")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    # Links to files outside README.md and docs/ break in this copy; only the new one counts.
    before = set(broken_links(tmp_path))
    readme = tmp_path / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert "(docs/security.md)" in text
    readme.write_text(text.replace("(docs/security.md)", "(docs/securty.md)", 1), encoding="utf-8")
    assert set(broken_links(tmp_path)) - before == {"README.md: docs/securty.md: no such file"}


# --- the checks themselves, on pages written here ---------------------------------------------

def _site(root: Path, pages: dict[str, str]) -> Path:
    for rel, text in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


GOOD = {
    "README.md": "# Top\n\nSee [a](docs/a.md), [its part](docs/a.md#the-gpu-lock-in-ci) and [b](docs/b.md).\n",
    "docs/a.md": "# A\n\n## The GPU lock, in CI\n\nBack to [the top](../README.md#top); [here](#a).\n",
    "docs/b.md": "# B\n\n[a sub page](sub/c.md) and [the web](https://example.com/x.md) and <https://x.y>.\n",
    "docs/sub/c.md": "# C\n\n[up](../../README.md)\n",
}


def test_pages_whose_links_all_resolve_pass(tmp_path):
    root = _site(tmp_path, GOOD)
    assert broken_links(root) == [] and unreached_pages(root) == []


@pytest.mark.parametrize(("page", "old", "new", "problem"), [
    ("README.md", "docs/b.md)", "docs/bb.md)", "README.md: docs/bb.md: no such file"),
    ("README.md", "#the-gpu-lock-in-ci", "#the-gpu-lock", "README.md: docs/a.md#the-gpu-lock: no heading with the anchor #the-gpu-lock"),
    ("docs/a.md", "(#a)", "(#b)", "docs/a.md: #b: no heading with the anchor #b"),
    ("docs/sub/c.md", "../../README.md", "../../../README.md", "docs/sub/c.md: ../../../README.md: leads out of the repository"),
    ("docs/b.md", "(sub/c.md)", "(sub/c.md#c-1)", "docs/b.md: sub/c.md#c-1: no heading with the anchor #c-1"),
])
def test_a_broken_link_is_reported(tmp_path, page, old, new, problem):
    pages = dict(GOOD)
    assert old in pages[page]
    pages[page] = pages[page].replace(old, new)
    assert broken_links(_site(tmp_path, pages)) == [problem]


def test_a_page_no_link_reaches_is_reported(tmp_path):
    pages = {**GOOD, "docs/lost.md": "# Lost\n\n[home](../README.md)\n"}
    assert unreached_pages(_site(tmp_path, pages)) == ["docs/lost.md"]
    # Reached only from another unreached page is still unreached.
    pages["docs/lost2.md"] = "# Lost too\n"
    pages["docs/lost.md"] += "[more](lost2.md)\n"
    assert unreached_pages(_site(tmp_path, pages)) == ["docs/lost.md", "docs/lost2.md"]


def test_links_in_code_are_not_links(tmp_path):
    pages = dict(GOOD)
    pages["docs/b.md"] += "\n```markdown\n[x](missing.md)\n```\n\nInline `[y](gone.md)` too.\n"
    assert broken_links(_site(tmp_path, pages)) == []
    pages["docs/b.md"] += "\nBut [z](gone.md) is one.\n"
    assert broken_links(_site(tmp_path, pages)) == ["docs/b.md: gone.md: no such file"]


def test_headings_in_code_blocks_are_not_anchors():
    text = "# Real\n\n```bash\n# not a heading\n```\n\n~~~\n## nor this\n~~~\n"
    assert anchors(text) == {"real"}


@pytest.mark.parametrize(("heading", "slug"), [
    ("Set-up (fresh machine, Python ≥ 3.10)", "set-up-fresh-machine-python--310"),
    ("`invoke` and the `slime-ci` command", "invoke-and-the-slime-ci-command"),
    ("On a GPU machine, run `tools/cuda_check.py` first", "on-a-gpu-machine-run-toolscuda_checkpy-first"),
    ("SGLang's `/generate` parameters", "sglangs-generate-parameters"),
    ("U: the e2e helpers", "u-the-e2e-helpers"),
    ("**Bold** and [a link](x.md)", "bold-and-a-link"),
    ("When CI runs: labels, schedules", "when-ci-runs-labels-schedules"),
])
def test_github_slugs(heading, slug):
    assert github_slug(heading) == slug


def test_repeated_headings_are_numbered():
    assert anchors("# Usage\n\n## Usage\n\n### Usage\n") == {"usage", "usage-1", "usage-2"}


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
