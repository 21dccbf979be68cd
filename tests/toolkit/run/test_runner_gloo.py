"""A gloo rank test's outcome does not depend on how the runner starts its file.

The CPU tier's run_ranks users run under `-j 1`, `-j 2` and `--no-prefork` and every test
case must end the same way, passed. Regression: under `-j 1` each pre-forked file started
with a thread of torch's, so its rank zygote was refused and 6 of test_gloo_ranks.py's 10
tests failed, while `-j 2` and `--no-prefork` passed.

A representative subset keeps this cheap: test_gloo_ranks.py's zygote cases (the ones that
depended on -j; the forkserver and timeout cases cost seconds each and do not involve the
pre-forked process) and test_metric_report_distributed.py (a real 4-rank user).
"""

import shutil
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci

NUM_GPUS = 0

FILES = ("tests/test_gloo_ranks.py", "tests/test_metric_report_distributed.py")
SUPPORT = ("tests/_gloo.py", "tests/conftest.py")
SELECT = "not forkserver and not hang and not thread"
MODES = {"-j 1": ["-j", "1"], "-j 2": ["-j", "2"], "--no-prefork": ["--no-prefork"]}


def _outcomes(junit):
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        out[f"{case.get('classname')}::{case.get('name')}"] = kind
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("repo")
    (root / "tests").mkdir()
    for rel in (*FILES, *SUPPORT):
        shutil.copy(REPO / rel, root / rel)
    return root


def test_run_ranks_users_end_the_same_under_every_mode(root, tmp_path):
    seen = {}
    for name, args in MODES.items():
        junit = tmp_path / f"{name.strip('-').replace(' ', '')}.xml"
        proc = run_ci("run", "--suite", "cpu_unit", "--root", str(root), "-k", SELECT, *args,
                      "--junit", str(junit), "--durations", str(tmp_path / "durations.json"),
                      timeout=300)
        seen[name] = _outcomes(junit)
        assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}"
    first = seen["-j 2"]
    assert len(first) >= 10 and set(first.values()) == {"passed"}, first
    for name, outcomes in seen.items():
        assert outcomes == first, f"{name} differs from -j 2"


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
