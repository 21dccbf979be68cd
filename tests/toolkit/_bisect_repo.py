"""A planted repository for the bisect: 32 commits after a good one, with known culprits.

Commit 0 is the good end; commits 1..32 follow, each writing its number to `step.txt`.

- `tests/unit/test_value.py` (CPU) and `tests/gpu/test_pair.py` (2 GPUs) assert that
  `calc.py` answers 42; from commit BREAK on it answers 41.
- `tests/unit/test_flaky.py` fails with probability `rate.txt`: 0 before commit RISE, 0.4 from
  it on. The draw is deterministic: `random.Random(f"{step}:{attempt}")`, seeded by the
  commit's number and the bisect's attempt number (SLIME_CI_BISECT_ATTEMPT), so a given
  commit and attempt always give the same outcome and the test is never flaky itself.
- `tests/gpu/test_pair.py` also writes the GPUs it held and when to $SLIME_CI_PROBE_DIR.
- `install.py` stands for the project's install: it exits 1 at commit NO_INSTALL (a broken
  build file), which a bisect run with `--install "python install.py"` must skip.
"""

from __future__ import annotations

from pathlib import Path

from _gitrepo import Clone

N = 32
BREAK = 20
RISE = 11
NO_INSTALL = 21
RATE = 0.4

REGISTRY = '''\
from ci.registry import Entry, Suite

SUITES = (
    Suite(name="unit", tier="cpu", purpose="unit tests", profile="cpu", include=("tests/unit",)),
    Suite(name="gpu", tier="gpu", purpose="GPU tests", profile="cpu", label="run-ci-gpu",
          entries=(Entry(path="tests/gpu/test_pair.py"),)),
)
'''

VALUE_TEST = '''\
import os
import time
from pathlib import Path

NUM_GPUS = {gpus}
ROOT = Path(__file__).resolve().parents[2]


def test_answer():
    began = time.time()
    time.sleep({sleep})
    probe = os.environ.get("SLIME_CI_PROBE_DIR")
    if probe:  # which GPUs this step held, and when: the test checks no two overlapped
        step = (ROOT / "step.txt").read_text().strip()
        Path(probe, f"{{step}}-{{os.getpid()}}.txt").write_text(
            f"{{os.environ.get('SLIME_CI_GPUS', '')}} {{began}} {{time.time()}}\\n")
    namespace = {{}}
    exec((ROOT / "calc.py").read_text(), namespace)
    assert namespace["answer"]() == 42
'''

FLAKY_TEST = '''\
import os
import random
from pathlib import Path

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[2]


def test_sometimes():
    step = int((ROOT / "step.txt").read_text())
    rate = float((ROOT / "rate.txt").read_text())
    attempt = os.environ.get("SLIME_CI_BISECT_ATTEMPT", "0")
    assert random.Random(f"{step}:{attempt}").random() >= rate
'''

INSTALL = '''\
import sys
from pathlib import Path

sys.exit(1 if "broken" in Path("build.txt").read_text() else 0)
'''


def calc(value: int) -> str:
    return f"def answer():\n    return {value}\n"


def build(base: Path, *, gpu_sleep: float = 0.0) -> tuple[Clone, list[str]]:
    """The planted clone under `base` and its commits, the good end first (33 shas)."""
    clone = Clone(base)
    shas = [clone.commit("good end", {
        ".slime-ci/suites.py": REGISTRY, "calc.py": calc(42), "step.txt": "0\n", "rate.txt": "0\n",
        "build.txt": "ok\n", "install.py": INSTALL, ".gitignore": ".ci-cache/\n",
        "tests/unit/test_value.py": VALUE_TEST.format(gpus=0, sleep=0),
        "tests/unit/test_flaky.py": FLAKY_TEST,
        "tests/gpu/test_pair.py": VALUE_TEST.format(gpus=2, sleep=gpu_sleep)})]
    for i in range(1, N + 1):
        files = {"step.txt": f"{i}\n", "build.txt": "broken\n" if i == NO_INSTALL else "ok\n"}
        subject = f"change {i}"
        if i == BREAK:
            files["calc.py"] = calc(41)
            subject = "Simplify the answer (#120)"
        if i == RISE:
            files["rate.txt"] = f"{RATE}\n"
            subject = "Share the cache between workers (#77)"
        shas.append(clone.commit(subject, files))
    return clone, shas
