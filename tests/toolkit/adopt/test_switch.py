"""`slime-ci adopt` on a slime-shaped repository built here, with the toolkit from a wheel.

The fixture has its own `slime` (whose `Sample` differs from ours), its own tests/ci/ folder,
a pr-test.yml.j2 with every kind of job and field, CPU tests and an e2e script in the
original style. The toolkit is a wheel built from this checkout in a fresh venv that sees
neither this checkout nor its `slime`. No network: sessions run through nox without
installs (`--no-venv --no-install`), in that venv; what they would install is tested apart.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _wheel import add_to_path, build_wheel, fresh_venv

from ci.registry.u_files import U_DIR, U_FILES

NUM_GPUS = 0

pytestmark = pytest.mark.slow  # one wheel build, one venv, several CLI runs: ~30 s

TEMPLATE = """<% set megatron_tests = [
    {'test_file': 'test_tiny_e2e.py', 'num_gpus': 4},
    {'test_file': 'test_tiny_e2e.py', 'num_gpus': 4, 'test_args': '--async-save', 'use_deepep': '1',
     'enable_eval': '0'},
] %>
<% set jobs = {
    'e2e-test-megatron': {'label': 'run-ci-megatron', 'tests': megatron_tests},
    'e2e-test-image': {'label': 'run-ci-image', 'image': 'slimerl/slime-test:latest', 'tests': megatron_tests},
    'cpu-unittest': {'always': True, 'cpu': True, 'extra_pip_deps': 'transformers wandb',
                     'tests': [{'test_file': 'test_sample.py', 'num_gpus': 0},
                               {'test_file': 'utils/test_math.py', 'num_gpus': 0}]},
    'agent-test': {'label': 'run-ci-agent', 'always': True, 'cpu': True,
                   'tests': [{'test_file': 'test_agent/test_adapter.py', 'num_gpus': 0}]},
} %>
name: PR Test

on:
  pull_request:
    branches: [main]
    types: [opened, reopened, synchronize, labeled]

jobs:
<% for job_name, config in jobs.items() %>
  << job_name >>:
<% if config.get('cpu') %>
    runs-on: ubuntu-latest
<% else %>
    runs-on: self-hosted
<% endif %>
    env:
      GITHUB_COMMIT_NAME: ${{ github.sha }}_${{ github.event.pull_request.number || 'non-pr' }}
      WANDB_API_KEY: ${{ secrets.WANDB_API_KEY }}
    steps:
      - uses: actions/setup-python@v5
        with:
          python-version: '3.10'
      - run: |
          pip install torch --index-url https://download.pytorch.org/whl/cpu
          pip install pytest numpy
<% if config.get('extra_pip_deps') %>
          pip install << config.extra_pip_deps >>
<% endif %>
          pip install -e . --no-deps
      - run: |
          docker run --rm \\
            -v "$GITHUB_WORKSPACE:$GITHUB_WORKSPACE" \\
            -v /mnt/ci:/data/ci \\
            -v /mnt/ci/models:/root/models \\
            -v /mnt/ci/datasets:/root/datasets \\
            image bash -lc 'pip install -e . --no-deps --break-system-packages'
<% endfor %>

  e2e-test-changed:
    if: contains(github.event.pull_request.labels.*.name, 'run-ci-changed')
    runs-on: self-hosted
"""

CPU_TEST = """
    import sys
    import pytest
    from slime.utils.types import Sample
    NUM_GPUS = 0

    def test_sample_is_the_adopters():
        assert Sample.Status.DONE == "done"  # ours has no Status: this fails with our slime

    if __name__ == "__main__":
        raise SystemExit(pytest.main([__file__, "-q"]))
"""

E2E = """
    import os
    from slime.utils.external_utils import command_utils as U
    MODEL_NAME = "Tiny"
    NUM_GPUS = 4

    def execute():
        U.execute_train(train_args=f"--steps 1 {U.get_default_wandb_args(__file__)}", num_gpus_per_node=NUM_GPUS,
                        megatron_model_type=None)

    if __name__ == "__main__":
        for proxy_var in ("http_proxy", "https_proxy"):
            os.environ.pop(proxy_var, None)
        execute()
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(textwrap.dedent(text))


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True,
                   env={**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
                        "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"})


@pytest.fixture(scope="module")
def toolkit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    wheel = build_wheel(tmp_path_factory.mktemp("wheel"))
    deps = ("jinja2", "pytest", "nox", "GitPython", "sqlalchemy")  # sqlalchemy: the history extra
    return fresh_venv(tmp_path_factory.mktemp("venv") / "v", wheel, deps=deps)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, toolkit: Path) -> Path:
    root = tmp_path_factory.mktemp("slime-repo")
    _write(root, {
        "slime/__init__.py": "",
        "slime/utils/__init__.py": "",
        "slime/utils/types.py": "class Sample:\n    class Status:\n        DONE = 'done'\n",
        "slime/utils/external_utils/__init__.py": "",
        "slime/utils/external_utils/command_utils.py": "# the original helpers\n",
        "tests/ci/gpu_lock_exec.py": "print('lock')\n",
        "tests/test_sample.py": CPU_TEST,
        "tests/utils/test_math.py": CPU_TEST,
        "tests/test_agent/test_adapter.py": CPU_TEST,
        "tests/test_tiny_e2e.py": E2E,
        ".github/workflows/pr-test.yml.j2": TEMPLATE,
        ".github/workflows/pr-test.yml": "# auto-generated via generate_github_workflows.py\n",
        ".github/workflows/generate_github_workflows.py": "print('render')\n",
        ".gitignore": ".nox/\n",
    })
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "slime")
    add_to_path(toolkit, "__editable__.slime-0.0.1", root)  # their `pip install -e .`
    return root


def _run(toolkit: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": f"{toolkit.parent}:/usr/bin:/bin", "HOME": str(cwd), "SLIME_CI_TORCH_INDEX": ""}
    return subprocess.run(list(argv), cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
                          check=False)


@pytest.fixture(scope="module")
def adopted(toolkit: Path, repo: Path) -> subprocess.CompletedProcess[str]:
    return _run(toolkit, "slime-ci", "adopt", str(repo), "--toolkit-requirement", "slime-ci==0.1.0", cwd=repo)


def test_adopt_writes_everything_and_reports(adopted, repo: Path) -> None:
    assert adopted.returncode == 0, adopted.stderr
    out = adopted.stdout
    for rel in (".slime-ci/suites.py", "noxfile.py", ".github/workflows/pr-test.yml",
                "slime/utils/external_utils/command_utils.py", "slime/utils/external_utils/proc_utils.py"):
        assert f"adopt: wrote {rel}" in out, rel
    for name in U_FILES:  # all of U: its e2e scripts import the facade, which needs the rest
        assert f"adopt: wrote {U_DIR}/{name}" in out, name
    assert not (repo / "ci").exists()  # never a ci/ package in their tree
    assert not (repo / ".github/workflows/generate_github_workflows.py").exists()
    assert (repo / ".github/workflows/pr-test.yml.j2").read_text().startswith("{# Retired by")
    assert "report: secrets kept: WANDB_API_KEY" in out and "report: to do by hand:" in out
    registry = (repo / ".slime-ci/suites.py").read_text()
    assert "'cpu_unit': ('torch', 'pytest', 'numpy', 'transformers', 'wandb')" in registry
    assert "name='changed'" in registry and "dynamic=True" in registry
    # The CPU tier aims for a job time: split by durations once the repository commits some.
    assert registry.count("target_minutes=7") == sum("tier='cpu'" in x for x in registry.split("Suite(")) > 0
    assert "report: new: CPU suites aim for 7 minutes a job (target_minutes): cpu_unit 1 shard(s)" in out
    assert "'SLIME_CI_DATA_DIR': '/mnt/ci:/data/ci'" in registry
    workflow = (repo / ".github/workflows/pr-test.yml").read_text()
    assert workflow.count("\nname: PR Test\n") == 1 and "python-version: \"3.10\"" in workflow
    for job in ("cpu-unittest:", "e2e-test-megatron:", "e2e-test-changed:", "workflows-check:"):
        assert f"\n  {job}\n" in workflow, job
    assert "gpu_smoke" not in workflow and "\n  lint:" not in workflow
    assert "WANDB_API_KEY: \"${{ secrets.WANDB_API_KEY }}\"" in workflow
    assert "runs-on: [self-hosted]" in workflow
    # Every suite job ends by recording its run, as this repository's do; the monitor runs hourly.
    # CPU and GPU alike, each exports its runs for the ingest workflow.
    for session in ("megatron", "changed"):
        assert (f'run: "nox -s history -- record --suite {session} --status \\"$STATUS\\" '
                '--export .ci-cache/history-export"') in workflow, session
    # The CPU tier, sized by its target, is a matrix the plan job sizes (the committed count,
    # 1 here, where no plan ran); each leg runs its shard and keeps its own durations.
    jobs = yaml.safe_load(workflow)["jobs"]
    (cpu,) = [j for j in jobs.values() if any("nox -s cpu_unit -- --shard" in str(s.get("run", ""))
                                              for s in j.get("steps", ()))]
    assert "plan" in str(cpu["needs"]) and set(cpu["strategy"]["matrix"]) == {"shard", "of"}
    assert all("needs.plan.outputs.shards" in v and '"shard":[1],"of":[1]' in v
               for v in cpu["strategy"]["matrix"].values())
    assert ('run: "nox -s history -- record --suite cpu_unit --status \\"$STATUS\\" --keep-in '
            '\\".ci-cache/shards/$SHARD\\" --export .ci-cache/history-export"') in workflow
    assert "\n  monitor:\n" in workflow and "run: nox -s monitor\n" in workflow
    # Only the monitor holds the store's secret there; GPU jobs export their runs to the ingest.
    assert workflow.count("name: ci-history\n") == 1 and "adopt: wrote .github/workflows/history-ingest.yml" in out
    assert "\n  verdict:\n" in workflow and "nox -s verdict -- --pr" in workflow
    # Their .gitignore keeps its lines and gains the cache folder (history, durations, JUnit).
    assert "adopt: wrote .gitignore" in out
    assert (repo / ".gitignore").read_text().startswith(".nox/\n# slime-ci: ")
    assert (repo / ".gitignore").read_text().endswith("\n.ci-cache/\n")


def test_the_cache_folder_is_ignored_once(tmp_path: Path) -> None:
    from ci.adopt.switch import gitignore_with_cache

    path = tmp_path / ".gitignore"
    assert gitignore_with_cache(path) is not None and gitignore_with_cache(path).endswith(".ci-cache/\n")
    for present in (".ci-cache\n", "build/\n/.ci-cache/\n", "  .ci-cache/  \n"):
        path.write_text(present)
        assert gitignore_with_cache(path) is None, present
    path.write_text("build/")  # no newline at its end: the new lines start on their own
    assert gitignore_with_cache(path).startswith("build/\n# slime-ci: ")


def test_adopt_again_changes_nothing_and_bad_input_writes_nothing(adopted, toolkit: Path, repo: Path,
                                                                  tmp_path: Path) -> None:
    again = _run(toolkit, "slime-ci", "adopt", str(repo), "--toolkit-requirement", "slime-ci==0.1.0", cwd=repo)
    assert again.returncode == 0 and "adopt: everything is up to date" in again.stdout, again.stdout
    (tmp_path / "tests").mkdir()
    for case, expect in ((tmp_path, "is not a git repository"), (repo / "nope", "is not a directory")):
        bad = _run(toolkit, "slime-ci", "adopt", str(case), cwd=tmp_path)
        assert bad.returncode == 2 and expect in bad.stderr and bad.stderr.count("\n") == 1, bad.stderr
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    bad = _run(toolkit, "slime-ci", "adopt", str(tmp_path), cwd=tmp_path)
    assert bad.returncode == 2 and "has no .github/workflows/pr-test.yml.j2" in bad.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [".git", "tests"]


def test_a_file_adopt_did_not_write_is_kept_unless_forced(adopted, repo: Path, tmp_path: Path) -> None:
    from ci.adopt.switch import apply, decide

    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    (copy / "noxfile.py").write_text("# the maintainers' own noxfile\n")
    kept = decide(copy, "slime-ci==0.1.0", force=False)
    assert kept.kept == ("noxfile.py",) and "noxfile.py" not in kept.writes
    apply(copy, kept)
    assert (copy / "noxfile.py").read_text() == "# the maintainers' own noxfile\n"
    forced = decide(copy, "slime-ci==0.1.0", force=True)
    assert list(forced.writes) == ["noxfile.py"] and forced.kept == ()


def test_commands_work_from_the_adopters_root(adopted, toolkit: Path, repo: Path) -> None:
    listed = _run(toolkit, "python", "-m", "nox", "-l", cwd=repo)
    assert listed.returncode == 0, listed.stderr
    for session in ("cpu_unit", "agent_adapter", "megatron", "image", "changed", "workflows", "history",
                    "monitor", "verdict"):
        assert f"* {session} " in listed.stdout, session
    assert _run(toolkit, "slime-ci", "workflows", "--check", cwd=repo).returncode == 0
    audit = _run(toolkit, "slime-ci", "audit", cwd=repo)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    changed = _run(toolkit, "slime-ci", "changed", "--base", "HEAD", cwd=repo)
    assert changed.returncode == 0, changed.stderr
    # The CPU suite through its nox session, in the toolkit's venv, with their own slime.
    cpu = _run(toolkit, "python", "-m", "nox", "--no-venv", "--no-install", "-s", "cpu_unit", cwd=repo)
    assert cpu.returncode == 0, cpu.stdout[-2000:] + cpu.stderr[-2000:]
    assert "cpu_unit: 2 passed, 0 failed" in cpu.stdout + cpu.stderr
    dry = _run(toolkit, "python", "-m", "nox", "--no-venv", "--no-install", "-s", "megatron", "--", "--gpus", "8",
               "--dry-run", cwd=repo)
    text = dry.stdout + dry.stderr
    assert dry.returncode == 0, text[-2000:]
    for flag in ("--cap-add SYS_NICE", "--network host", "--ipc=host", "--shm-size=16g",
                 "-v /mnt/ci/models:/root/models", "-v /mnt/ci/datasets:/root/datasets", "-v /mnt/ci:/data/ci",
                 "-e SLIME_TEST_USE_DEEPEP=1", "--async-save"):
        assert flag in text, flag


def test_the_adopters_history_session_records_a_job_and_the_monitor_reads_it(
        adopted, toolkit: Path, repo: Path, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"  # the shared store, as the secret would name it
    (repo / ".ci-cache/history-journal").unlink(missing_ok=True)  # no session ran in this job
    nox = ("python", "-m", "nox", "--no-venv", "--no-install")
    record = _run(toolkit, *nox, "-s", "history", "--", "record", "--suite", "megatron", "--status",
                  "cancelled", "--history", url, cwd=repo)
    assert record.returncode == 0, record.stdout[-2000:] + record.stderr[-2000:]
    show = _run(toolkit, *nox, "-s", "history", "--", "show", "--json", "--history", url, cwd=repo)
    assert show.returncode == 0, show.stderr[-2000:]
    counts = json.loads(show.stdout.strip().splitlines()[-1])
    assert counts["runs"] == 1 and counts["attempts"] == 0  # the job, recorded without its session
    monitor = _run(toolkit, *nox, "-s", "monitor", "--", "--history", url, cwd=repo)
    assert monitor.returncode == 0, monitor.stdout[-2000:] + monitor.stderr[-2000:]
    assert "monitor: no entry failed 3 consecutive runs on main" in monitor.stdout
    assert (repo / ".ci-cache/monitor.md").is_file()


# The toolkit's own registry file, named where only the adopter's belongs.
TOOLKIT_REGISTRY = re.compile(r"ci/registry/repo_suites\.py")


def test_messages_name_the_adopters_registry(adopted, toolkit: Path, repo: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy"
    shutil.copytree(repo, copy, symlinks=True)
    (copy / "tests/utils/test_math.py").unlink()  # registered, gone
    _write(copy, {"tests/extra/test_new.py": CPU_TEST})  # in no suite
    said: list[str] = []
    for argv, code in ((("slime-ci", "audit"), 1),
                       (("slime-ci", "run", "--suite", "cpu_unit", "--dry-run"), 2),
                       (("slime-ci", "changed", "--help"), 0),
                       (("slime-ci", "workflows", "--help"), 0)):
        done = _run(toolkit, *argv, cwd=copy)
        said.append(done.stdout + done.stderr)
        assert done.returncode == code, (argv, done.stdout + done.stderr)
    assert "cpu_unit (.slime-ci/suites.py) but the file does not exist" in said[0], said[0]
    assert "add an Entry to a GPU suite" not in said[0] and "in .slime-ci/suites.py" in said[0], said[0]
    assert "(fix .slime-ci/suites.py, then run" in said[1], said[1]
    # A registry the workflow cannot be made from: plan and workflows --check say where to fix it.
    registry = copy / ".slime-ci/suites.py"
    registry.write_text(registry.read_text().replace("label='run-ci-megatron'", "label=None", 1))
    for argv in (("slime-ci", "workflows", "--check"), ("slime-ci", "plan", "--event", "pull_request")):
        done = _run(toolkit, *argv, cwd=copy)
        said.append(done.stdout + done.stderr)
        assert done.returncode == 2 and "to it in .slime-ci/suites.py" in done.stderr, (argv, done.stderr)
    for text in said:  # help names both candidates; nothing else names the toolkit's file
        flat = " ".join(text.split()).replace(".slime-ci/suites.py or ci/registry/repo_suites.py", "")
        assert not TOOLKIT_REGISTRY.search(flat), text


def test_its_e2e_script_imports_u_without_the_toolkit(adopted, toolkit: Path, repo: Path) -> None:
    code = "import sys; sys.modules['ci'] = None; import runpy; runpy.run_path(sys.argv[1], run_name='e2e')"
    for cwd in (repo, repo / "tests", repo / "tests" / "ci"):
        done = _run(toolkit, "python", "-c", code, str(repo / "tests" / "test_tiny_e2e.py"), cwd=cwd)
        assert done.returncode == 0, done.stderr


def test_what_it_wrote_passes_zizmor_and_the_schema(adopted, repo: Path) -> None:
    bindir = Path(sys.executable).parent
    if not (bindir / "zizmor").is_file() or not (bindir / "check-jsonschema").is_file():
        pytest.skip("zizmor and check-jsonschema are in the lint/dev profiles; not installed here")
    workflow = str(repo / ".github/workflows/pr-test.yml")
    for argv in ([str(bindir / "zizmor"), "--offline", "--persona", "pedantic", workflow],
                 [str(bindir / "check-jsonschema"), "--builtin-schema", "vendor.github-workflows", workflow]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
        assert done.returncode == 0, done.stdout + done.stderr


def test_session_installs_come_from_the_registry_and_the_spec(adopted, repo: Path) -> None:
    from ci.adopt.sessions import install_steps
    from ci.registry.loader import load_registry

    reg = load_registry(repo)
    cpu = install_steps(reg["cpu_unit"], reg, "git+https://example.invalid/slime-ci", (), {})
    # The history extra's own pins: the run plans from its history and records itself.
    assert cpu == [["torch"], ["pytest", "numpy", "transformers", "wandb", "sqlalchemy==2.0.58",
                               "psycopg[binary]==3.3.9"],
                   ["git+https://example.invalid/slime-ci"], ["-e", ".", "--no-deps"]]
    gpu = install_steps(reg["changed"], reg, "/src/slime-ci", (), {"SLIME_CI_TORCH_INDEX": "https://x"})
    # Docker: the image has the rest; the host records the run (the history extra's own pins).
    assert gpu == [["nvidia-ml-py", "sqlalchemy==2.0.58", "psycopg[binary]==3.3.9", "GitPython>=3.1.40"],
                   ["/src/slime-ci"]]


def test_the_toolkits_extras_have_one_source(toolkit: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pyproject.toml: read here from the checkout; in the wheel's venv from its metadata."""
    import importlib.metadata
    import json

    import tomllib

    from ci.adopt import sessions

    extras = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    here = {name: list(sessions.toolkit_extra(name)) for name in extras}
    assert here["gpu-host"][0] == "nvidia-ml-py" and "slime-ci[history]" not in here["gpu-host"]
    assert set(extras["history"]) <= set(here["gpu-host"])
    code = f"import json; from ci.adopt.sessions import toolkit_extra as t; print(json.dumps({{n: list(t(n)) " \
           f"for n in {sorted(extras)!r}}}))"
    done = _run(toolkit, "python", "-c", code, cwd=toolkit.parent)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == here
    # Requires-Dist as a build writes it, markers included; a name it lacks is one clear error.
    monkeypatch.setattr(sessions, "_checkout_pyproject", lambda: None)
    monkeypatch.setattr(importlib.metadata, "requires", lambda _name: [
        'GitPython>=3.1.40; extra == "git"', "tomli; python_version < '3.11' and extra == 'git'",
        'slime-ci[git]; extra == "all"', "plain"])
    assert sessions.toolkit_extra("all") == ("GitPython>=3.1.40", "tomli; python_version < '3.11'")
    with pytest.raises(sessions.UsageError, match="no extra 'nope'"):
        sessions.toolkit_extra("nope")


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
