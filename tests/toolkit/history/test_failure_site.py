"""Where a failed test's assertion is, as the history keeps it: read from a real pytest JUnit
report, and nothing at all from a report that is cut short, too large, or names a file outside
the repository."""

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import write

from ci.history.failure_site import MAX_JUNIT_BYTES, failure_site

NUM_GPUS = 0
# The assertion is on line 9; the helper it calls fails nothing.
FAILING = "NUM_GPUS = 0\n\n\ndef helper(x):\n    return x + 1\n\n\ndef test_it():\n    assert helper(1) == 3\n"


def _report(root: Path, rel: str) -> Path:
    out = root / "junit.xml"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", rel,
                           f"--junitxml={out}"], cwd=root, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    return out


def test_a_real_reports_assertion_line_and_file(tmp_path):
    root = write(tmp_path / "repo", {"tests/test_x.py": FAILING})
    assert failure_site(_report(root, "tests/test_x.py"), "tests/test_x.py", root) == ("tests/test_x.py", 9)


def test_a_report_that_says_nothing_usable_gives_no_site(tmp_path):
    root = write(tmp_path / "repo", {"tests/test_x.py": FAILING})
    report = _report(root, "tests/test_x.py")
    text = report.read_text()
    assert failure_site(None, "tests/test_x.py", root) is None
    cut = tmp_path / "cut.xml"
    cut.write_text(text[: len(text) // 2])  # a kill cut it short
    assert failure_site(cut, "tests/test_x.py", root) is None
    big = tmp_path / "big.xml"
    big.write_text(text + " " * MAX_JUNIT_BYTES)
    assert failure_site(big, "tests/test_x.py", root) is None
    # A frame outside the repository (an absolute path elsewhere, a `..`) is never kept: the
    # annotation must name a file of the diff.
    for where in ("/usr/lib/python3/x.py", "../elsewhere/x.py"):
        odd = tmp_path / "odd.xml"
        odd.write_text(f'<testsuite><testcase classname="lib" name="t"><failure message="m">{where}:3: '
                       'ValueError</failure></testcase></testsuite>')
        assert failure_site(odd, "tests/test_y.py", root) is None, where


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, *sys.argv[1:]]))
