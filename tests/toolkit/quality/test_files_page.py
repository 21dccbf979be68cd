"""The coverage page, rendered by headless Chromium: what a person sees on it.

Chromium is Debian's `chromium` (installed by `.ci/run`); without it the browser test
skips and says so. The page itself is also checked as text (the Markdown table).
"""

import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import PASSING, run_ci, write

from ci.history.rows import AttemptRecord, RunRecord
from ci.history.store import open_store

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e", "tests/orphan")),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train", entries=(
            Entry(path="tests/e2e/test_job.py"),
        )),
    )
"""
JOB = "NUM_GPUS = 2\n\ndef execute():\n    pass\n\nif __name__ == '__main__':\n    execute()\n"


@pytest.fixture
def page(tmp_path):
    root = write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_a.py": PASSING,
                                     "tests/test_b.py": PASSING, "tests/orphan/test_lost.py": PASSING,
                                     "tests/e2e/test_job.py": JOB})
    url = f"sqlite:///{root / '.ci-cache/history.sqlite'}"
    outcomes = {"tests/test_a.py": ["passed", "passed", "flaky", "passed"],
                "tests/test_b.py": ["passed", "passed", "passed", "failed"]}
    with open_store(url) as store:
        for n in range(4):
            store.record(RunRecord(uid=f"r{n}", suite="unit", commit=f"{n}" * 40, branch="main",
                                   started_at=1_800_000_000 + n * 3600, ended_at=1_800_000_100 + n * 3600,
                                   exit_code=0, attempts=tuple(
                AttemptRecord(entry_id=p, path=p, attempt=1, final=True, outcome=o[n],
                              seconds=2.0 + n) for p, o in outcomes.items())))
    proc = run_ci("coverage", "--root", str(root), "--history", url, "--out", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith(f"page: {tmp_path / 'out' / 'index.html'}")
    return tmp_path / "out"


def test_the_markdown_table_names_every_file_and_what_runs_it(page):
    md = (page / "coverage.md").read_text().splitlines()
    assert md[2] == "4 test files; 1 run by no suite. Suites no run has recorded: train."
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:-1]]
            for line in md if line.startswith("| `")}
    assert list(rows) == ["tests/orphan/test_lost.py", "tests/test_b.py", "tests/e2e/test_job.py",
                          "tests/test_a.py"], "unrun first, then failing, then the rest"
    assert rows["tests/orphan/test_lost.py"][0] == "**no suite runs it**"
    assert rows["tests/test_a.py"][:8] == ["unit", "-", "0", "cpu", "passed", "100%", "25%", "4.7s"]
    assert rows["tests/test_b.py"][4:6] == ["failed", "75%"]
    assert rows["tests/test_b.py"][-1] == "🟩🟩🟩🟥"
    assert rows["tests/e2e/test_job.py"][:5] == ["train", "run-ci-train", "2", "GPU", "not run yet"]


def _pixels(png: bytes) -> tuple[int, int, set[tuple[int, int, int]]]:
    """Width, height and the set of colours of an 8-bit RGB/RGBA PNG (Chromium's screenshots)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width = 8, b"", 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", data[:10])
            assert depth == 8 and colour in (2, 6)
            bpp = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw, stride, prev, colours = zlib.decompress(idat), width * bpp, bytearray(width * bpp), set()
    for y in range(height):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 0xFF
            elif f == 2:
                line[i] = (line[i] + prev[i]) & 0xFF
            elif f == 3:
                line[i] = (line[i] + (a + prev[i]) // 2) & 0xFF
            elif f == 4:
                b, c = prev[i], prev[i - bpp] if i >= bpp else 0
                pa, pb, pc = abs(b - c), abs(a - c), abs(a + b - 2 * c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        colours.update(tuple(line[i:i + 3]) for i in range(0, stride, bpp))
        prev = line
    return width, height, colours


def test_chromium_shows_the_table_the_badges_and_the_trend(page, tmp_path):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("no Chromium here (apt-get install chromium; .ci/run installs it)")
    html = (page / "index.html").read_text()
    assert "http://" not in html and "https://" not in html and "<script" not in html, "self-contained"
    argv = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
            f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1600,500"]
    dom = subprocess.run([*argv, "--dump-dom", (page / "index.html").as_uri()], capture_output=True,
                         text=True, timeout=120, check=False)
    assert dom.returncode == 0, dom.stderr[-500:]
    text = dom.stdout
    assert "4 test files; 1 run by no suite" in text
    assert "Suites no run has recorded: " in text and '<span class="badge">train</span>' in text
    assert text.count("<tr") == 5  # the header and one row per test file
    assert text.count("<rect") == 8  # two files with history, four runs each
    shot = tmp_path / "page.png"
    done = subprocess.run([*argv, f"--screenshot={shot}", (page / "index.html").as_uri()],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and shot.is_file(), done.stderr[-500:]
    width, height, colours = _pixels(shot.read_bytes())
    assert (width, height) == (1600, 500)
    # What a person sees: the red badges, the green and yellow trend cells, the yellow
    # background of the file no suite runs.
    for name, rgb in {"badge red": (0xCF, 0x22, 0x2E), "passed green": (0x2D, 0xA4, 0x4E),
                      "flaky yellow": (0xD4, 0xA7, 0x2C), "unrun row": (0xFF, 0xF8, 0xC5)}.items():
        assert rgb in colours, f"{name} not on screen"
    shutil.copy(shot, page / "screenshot.png")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
