"""Every `python -m ci` command, driven with generated arguments (Hypothesis), keeps the contract:

- the exit code is one of the documented ones (0, 1, 2, 3, 124, 130; `lock-gpus` also
  passes its command's code through; `why` and `issues` read a pinned store, so never 4);
- no traceback: in this process an exception escaping `main` fails the example;
- a refusal (exit 2) is exactly one line on stderr, starting with `error:`;
- nothing is left running.

The arguments are drawn from each command's own options, with values a careless user or a
script would pass (empty, negative, NaN, inf, huge, paths that do not exist or are files,
format braces, `..`). Commands that would run tests, hold GPUs or write files are aimed
at throwaway checkouts and lock directories (`run` always plans with --dry-run). Examples
are derandomized so CI sees the same ones every run; SLIME_CI_PROPERTY_EXAMPLES=N searches
N random examples per command instead.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest
from _ci import PASSING, REPO, write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ci.cli import main

NUM_GPUS = 0
pytestmark = pytest.mark.timeout(300)

# A count given in the environment also turns on random search (new examples each run).
EXAMPLES = int(os.environ.get("SLIME_CI_PROPERTY_EXAMPLES", "20"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, database=None,
                    derandomize="SLIME_CI_PROPERTY_EXAMPLES" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow])
DOCUMENTED = {0, 1, 2, 3, 124, 130}

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", label="run-ci-unit",
              include=("tests",), exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              timeout=60, entries=(Entry(path="tests/e2e/test_job.py"),)),
    )
"""
JOB = """
    NUM_GPUS = 2

    def execute():
        pass

    if __name__ == "__main__":
        execute()
"""
TEMPLATE = """\
<% set jobs = {
    'cpu-unittest': {'label': 'run-ci-unit', 'cpu': True, 'tests': [
        {'test_file': 'test_ok.py', 'num_gpus': 0},
    ]},
} %>
name: PR Test
"""


@dataclass(frozen=True)
class World:
    """Throwaway places the commands may touch."""

    base: Path  # cwd of every example: relative paths land here
    checkout: Path  # a git checkout with its own registry
    adopt: Path  # a checkout import-workflow may write into
    locks: Path


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    base = tmp_path_factory.mktemp("props")
    checkout = write(base / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/test_ok.py": PASSING,
                                     "tests/e2e/test_job.py": JOB})
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", "-b", "main"], cwd=checkout, check=True)
    subprocess.run([*git, "add", "-A"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-qm", "base"], cwd=checkout, check=True)
    subprocess.run(["git", "checkout", "-qb", "topic"], cwd=checkout, check=True)
    write(checkout, {"tests/test_new.py": PASSING})
    subprocess.run([*git, "add", "-A"], cwd=checkout, check=True)
    subprocess.run([*git, "commit", "-qm", "topic"], cwd=checkout, check=True)
    adopt = write(base / "adopt", {"tests/test_ok.py": PASSING,
                                   ".github/workflows/pr-test.yml.j2": TEMPLATE})
    (base / "a_file").write_text("")
    return World(base=base, checkout=checkout, adopt=adopt, locks=base / "locks")


# ------------------------------------------------------------------ values


TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
               max_size=12)  # argv can hold neither NUL nor lone surrogates
NUMBERS = st.one_of(
    st.sampled_from(["0", "-1", "1", "2", "3", "8", "256", "257", "20000", "1e400", "-0",
                     "nan", "NaN", "inf", "-inf", "Infinity", "0.5", "1_000", "0x10", " 1"]),
    st.integers(-10**12, 10**12).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
WORDS = st.sampled_from(["", " ", "-", "--", "-x", "abc", "A=B", "PATH", "LD_PRELOAD",
                         "CUDA_VISIBLE_DEVICES", "{gpu_id}", "{x}", "{", "}", "..", "../../x",
                         "/", "/dev/zero", "/nonexistent/deep", "/etc/passwd", "a,b", "0,0",
                         "0,1", "1/0", "0/0", "2/1", "1/4", "1/1000000000", "x" * 300, "é", "*"])
ANY = st.one_of(NUMBERS, WORDS, TEXT)


def paths(world: World) -> st.SearchStrategy[str]:
    b = world.base
    return st.one_of(ANY, st.sampled_from([
        str(world.checkout), str(b / "a_file"), str(b / "a_file" / "x"), str(b / "ghost" / "deep"),
        str(world.checkout / "tests"), str(world.checkout / "tests" / "test_ok.py"), "tests",
        "tests/test_ok.py", "tests/e2e", "tests/nope.py", "."]))


def patterns(world: World) -> st.SearchStrategy[str]:
    good = str(world.locks / "gpu_{gpu_id}.lock")
    return st.one_of(st.just(good), st.sampled_from([
        "L/{gpu_id}{x}.lock", "/etc/passwd/x_{gpu_id}.lock", "nobraces", "{gpu_id:02d}.lock",
        "{0}", "{gpu_id}/", "{gpu_id.real}", "{gpu_id!r}.lock", "{{gpu_id}}",
        str(world.base / "a_file" / "{gpu_id}.lock"), str(world.base / ("n" * 300 + "{gpu_id}")),
        "/proc/self/x_{gpu_id}.lock", "lk/{gpu_id}.lock"]), TEXT)


Options = dict[str, st.SearchStrategy[str] | None]  # flag -> its value (None: a switch)


def options(world: World) -> dict[str, Options]:
    p, pat = paths(world), patterns(world)
    return {
        "run": {"--suite": st.sampled_from(["unit", "train", "nope", ""]), "-k": ANY, "-j": NUMBERS,
                "--only": ANY, "--shard": st.one_of(WORDS, NUMBERS), "--timeout": NUMBERS,
                "--retries": NUMBERS, "--gpus": NUMBERS, "--emulate-gpus": None,
                "--no-docker": None, "--image": ANY, "--pull": st.sampled_from(["always", "x", ""]),
                "--lock-path-pattern": pat, "--lock-timeout": NUMBERS, "--base": ANY,
                "--affected": None, "--junit": p, "--durations": p, "--keep-outputs": None,
                "--no-prefork": None, "--root": p, "--": None},
        "audit": {"--root": p},
        "plan": {"--event": st.sampled_from(["pull_request", "push", "workflow_dispatch", "x"]),
                 "--labels": ANY, "--action": st.sampled_from(["labeled", "synchronize", "x"]),
                 "--added": ANY, "--fork": None, "--json": None, "--root": p},
        "lock-gpus": {"--count": NUMBERS, "--devices": st.one_of(WORDS, NUMBERS),
                      "--total-gpus": NUMBERS, "--timeout": NUMBERS, "--grace": NUMBERS,
                      "--target-env-name": st.one_of(WORDS, TEXT), "--lock-path-pattern": pat,
                      "--print-only": None},
        "gpu-status": {"--total-gpus": NUMBERS, "--lock-path-pattern": pat, "--json": None},
        "changed": {"--root": p, "--base": st.one_of(st.sampled_from(["main", "HEAD", "HEAD~9"]),
                                                     ANY),
                    "--affected": None, "--json": None},
        "workflows": {"--check": None, "--dry-run": None, "--root": p},
        "import-workflow": {"--root": p, "--dry-run": None, "--force": None},
        # The history store is pinned (aimed): a store that cannot be opened is exit 4, by design.
        "why": {"--pr": NUMBERS, "--run": ANY, "--base": ANY, "--suite": ANY, "--branch": ANY,
                "--json": None, "--gate": None, "--comment": None, "--dry-run": None, "--repo": ANY,
                "--needs": st.one_of(ANY, st.sampled_from(['{"unit": {"result": "failure"}}', "[]", "{"])),
                "--root": p},
        "issues": {"--repo": ANY, "-k": NUMBERS, "--dry-run": None, "--unreachable-ok": None, "--root": p},
    }


@st.composite
def argv_for(draw: st.DrawFn, command: str, world: World) -> list[str]:
    opts = options(world)[command]
    argv: list[str] = []
    for _ in range(draw(st.integers(0, 5))):
        flag = draw(st.sampled_from(sorted(opts)))
        value = opts[flag]
        argv.append(flag)
        if value is not None and draw(st.integers(0, 9)):  # now and then a flag lacks its value
            argv.append(draw(value))
    if draw(st.integers(0, 3)) == 0:
        argv.append(draw(st.one_of(paths(world), st.sampled_from(["--no-such", "-h"]))))
    return argv


def aimed(command: str, argv: list[str], world: World) -> list[str]:
    """Pin what must not reach the real checkout or real GPUs: first, so generated flags
    override them only with values drawn above (which point into throwaway places)."""
    if command == "run":
        # Last, so no generated value can drop the dry run: run must only plan here.
        return ["--root", str(world.checkout), *argv, "--dry-run"]
    if command in ("lock-gpus", "gpu-status"):
        pinned = ["--lock-path-pattern", str(world.locks / "gpu_{gpu_id}.lock"), "--total-gpus", "2"]
        if command == "gpu-status":
            return [*pinned, *argv]
        return [*pinned, "--timeout", "2", *argv, "--", "true"]
    if command in ("audit", "plan", "changed", "workflows"):
        return ["--root", str(world.checkout), *argv]
    if command in ("why", "issues"):  # GitHub is never reached: no token in the environment
        return ["--history", f"sqlite:///{world.base / 'history.sqlite'}", "--root", str(world.checkout), *argv]
    if command == "import-workflow":
        template = str(world.adopt / ".github" / "workflows" / "pr-test.yml.j2")
        return [template, "--root", str(world.adopt), *argv]
    raise AssertionError(command)


# ------------------------------------------------------------------ the contract


def _live_children() -> list[int]:
    """Non-zombie processes whose parent is this process."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if int(fields[1]) == os.getpid() and fields[0] != "Z":
            found.append(int(name))
    return found


@contextmanager
def _in(directory: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(before)


def check_contract(command: str, argv: list[str], code: int, out: str, err: str) -> None:
    allowed = DOCUMENTED | ({126, 127} if command == "lock-gpus" else set())
    shown = f"python -m ci {command} {argv!r}\nexit {code}\nstderr: {err[-2000:]}"
    assert code in allowed, shown
    assert "Traceback" not in err and "Traceback" not in out, shown
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), shown


def call(command: str, argv: list[str], world: World) -> None:
    full = aimed(command, argv, world)
    out, err = io.StringIO(), io.StringIO()
    before = set(_live_children())
    with _in(world.base), redirect_stdout(out), redirect_stderr(err):
        try:
            code = main([command, *full])
        except SystemExit as exc:  # argparse's --help
            code = exc.code if isinstance(exc.code, int) else 0
    check_contract(command, full, code, out.getvalue(), err.getvalue())
    left = set(_live_children()) - before
    assert not left, f"python -m ci {command} {full!r} left processes {sorted(left)} running"


COMMANDS = ["run", "audit", "plan", "lock-gpus", "gpu-status", "changed", "workflows",
            "import-workflow", "why", "issues"]


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_keeps_the_contract_for_generated_arguments(world: World,
                                                                  command: str) -> None:
    @SETTINGS
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        call(command, data.draw(argv_for(command, world), label="argv"), world)

    check()


def test_the_real_command_keeps_it_too(world: World) -> None:
    """A few generated argv through a real interpreter: its stderr, exit status and
    process group are what a user sees."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}

    @settings(max_examples=6, deadline=None, derandomize=True, database=None)
    @given(command=st.sampled_from(COMMANDS), data=st.data())
    def check(command: str, data: st.DataObject) -> None:
        full = aimed(command, data.draw(argv_for(command, world), label="argv"), world)
        proc = subprocess.Popen([sys.executable, "-m", "ci", command, *full], cwd=world.base,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, start_new_session=True)
        out, err = proc.communicate(timeout=120)
        check_contract(command, full, proc.returncode, out, err)
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)  # nothing of its process group is left

    check()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
