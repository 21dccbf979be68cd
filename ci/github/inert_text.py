"""Text from test output, made safe to post on GitHub: quoted inert, and cut to GitHub's limits.

A failure's reason is whatever a test printed. Put raw into a comment or an issue it is
Markdown and HTML: `@someone` notifies them, `<img src=…>` loads a stranger's image for
every reader, `<!--` hides the rest of the comment, a backtick closes the code span around
it. `code()` puts such text in a code span that nothing inside can close (its fence is
longer than any run of backticks in it), on one line, with table pipes escaped: inside it
GitHub renders no mention, no link, no tag and no comment. `fit()` cuts a body to the size
GitHub takes, at a line, and says so in a last line.
"""

from __future__ import annotations

import re

# GitHub refuses a comment or an issue body over 65,536 characters (HTTP 422). Bodies are
# measured in UTF-8 bytes, which is never fewer than the characters, whatever GitHub counts.
BODY_LIMIT = 65_536
TITLE_LIMIT = 256  # an issue's title
_TICKS = re.compile(r"`+")


def one_line(text: str, limit: int) -> str:
    """Every run of whitespace (newlines, U+2028 and the like) and of characters that print
    nothing (controls, bidi overrides, zero-width ones) as one space; at most `limit` characters."""
    flat = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


def code(text: str, limit: int = 400, *, table: bool = True) -> str:
    """`text` as an inline code span on one line: inert, whatever it holds."""
    flat = one_line(text, limit)
    if table:
        flat = flat.replace("|", "\\|")  # GFM splits a table cell on `|`, code span or not
    longest = max((len(m) for m in _TICKS.findall(flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") or not flat.strip() else ""
    return f"{fence}{pad}{flat}{pad}{fence}"


_SERVER = re.compile(r"https://[A-Za-z0-9.-]+(:[0-9]{1,5})?")
_REPO = re.compile(r"[A-Za-z0-9_.-]{1,100}/[A-Za-z0-9_.-]{1,100}")


def run_link(server: str, repo: str, run_id: str, attempt: int | None, job: str = "") -> str:
    """The Actions run (and attempt) that gave a piece of evidence, as a Markdown link, its job
    named inert: `[run 912, attempt 2](…/actions/runs/912/attempts/2), job `cpu_unit``.

    "" when the history holds no run id, or the server or repository is not one a link may
    name: the id comes from a record, and only digits ever reach the URL."""
    if not (run_id.isascii() and run_id.isdigit() and _SERVER.fullmatch(server) and _REPO.fullmatch(repo)):
        return ""
    url = f"{server}/{repo}/actions/runs/{run_id}"
    said = f"run {run_id}"
    if attempt is not None and attempt > 0:
        url += f"/attempts/{attempt}"
        said += f", attempt {attempt}"
    return f"[{said}]({url})" + (f", job {code(job, 128)}" if job else "")


def plain(text: str, limit: int) -> str:
    """For a place that renders no Markdown but may notify (an issue's title): one line, with
    `@` made harmless by a zero-width joiner after it."""
    return one_line(text, limit).replace("@", "@\u2060")


def size(text: str) -> int:
    return len(text.encode("utf-8"))


def fit(body: str, *, limit: int = BODY_LIMIT, where: str = "") -> str:
    """The body, or as many of its first lines as fit with a last line saying it was cut."""
    if size(body) <= limit:
        return body
    lines = body.split("\n")
    note = (f"**This text was cut at GitHub's limit of {limit:,} characters**: {len(lines)} lines, "
            f"{size(body):,} bytes in all." + (f" {where}" if where else ""))
    room = limit - size(note) - 2
    kept: list[str] = []
    used = 0
    for line in lines:
        cost = size(line) + 1
        if used + cost > room:
            break
        kept.append(line)
        used += cost
    if not kept:  # one enormous first line: keep what fits of it
        kept = [body.encode("utf-8")[:max(room, 0)].decode("utf-8", "ignore")]
    return "\n".join(kept) + "\n\n" + note
