"""Execution backends: chosen once per run, preconditions checked before any entry starts.

This machine has a docker CLI but no Docker daemon, and no GPU. Where a test needs a
daemon's answer it puts a stand-in `docker` on PATH (a shell script that answers as the
real CLI does) and says so; nothing here needs a GPU.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO, run_ci, write

from ci.backends import BackendOptions, EntryEnv, select_backend
from ci.backends.docker import DockerBackend
from ci.backends.emulated import EmulatedBackend
from ci.backends.local import LocalBackend
from ci.errors import UsageError
from ci.registry.repo_suites import SUITES
from ci.results import reason
from ci.select.entries import ResolvedEntry

NUM_GPUS = 0

REGISTRY = """
    from ci.registry import Entry, Suite

    SUITES = (
        Suite(name="unit", tier="cpu", purpose="p", profile="cpu", include=("tests",),
              exclude=("tests/e2e",)),
        Suite(name="train", tier="gpu", purpose="p", profile="e2e", label="run-ci-train",
              image="example/train:1", entries=(Entry(path="tests/e2e/test_job.py"),)),
    )
"""

JOB = """
    import os
    NUM_GPUS = 1

    def execute():
        open(os.environ["MARKER"], "w").write("ran")

    if __name__ == "__main__":
        execute()
"""

NO_DAEMON = ("Cannot connect to the Docker daemon at unix:///var/run/docker.sock. "
             "Is the docker daemon running?")


def _fake_docker(folder: Path, *, daemon: bool) -> dict[str, str]:
    """A stand-in `docker` CLI: `version` answers as with or without a daemon; `run` fails
    as the real client does when the daemon goes away between the check and the run."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "docker"
    version = 'echo 27.0.0; exit 0' if daemon else f'echo "{NO_DAEMON}" >&2; exit 1'
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = version ]; then {version}; fi\n'
        f'if [ "$1" = run ]; then echo "docker: {NO_DAEMON}" >&2; '
        "echo \"Run 'docker run --help' for more information\" >&2; exit 125; fi\n"
        "exit 0\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


@pytest.fixture
def checkout(tmp_path):
    return write(tmp_path / "repo", {"ci/registry/repo_suites.py": REGISTRY, "tests/e2e/test_job.py": JOB})


def test_docker_without_daemon_is_one_line_exit_2_and_nothing_runs(checkout, tmp_path):
    marker = tmp_path / "marker"
    env = {**_fake_docker(tmp_path / "bin", daemon=False), "MARKER": str(marker)}
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--gpus", "8", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stdout == ""  # no "8 GPUs" announced, no entry started
    assert proc.stderr == (f"error: cannot reach the Docker daemon ({NO_DAEMON}): start it, or pass "
                           "--no-docker (this environment) or --emulate-gpus (no GPUs)\n")
    assert not marker.exists()
    assert not (checkout / ".ci-cache" / "runs").exists()


def test_the_real_cli_without_a_daemon_is_refused_the_same_way(checkout):
    problem = subprocess.run(["docker", "version"], capture_output=True, text=True,
                             check=False).returncode if _has_docker() else None
    if problem is None or problem == 0:
        pytest.skip("needs the docker CLI and no running daemon (this machine's state)")
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--gpus", "8")
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot reach the Docker daemon (")
    assert proc.stderr.rstrip().endswith("or --emulate-gpus (no GPUs)")


def _has_docker() -> bool:
    return any((Path(d) / "docker").exists() for d in os.environ["PATH"].split(os.pathsep))


def test_an_entry_fails_with_its_most_telling_line(checkout, tmp_path):
    # The daemon answers the check, then the run fails: the reason shown is the error,
    # not docker's closing usage hint.
    env = {**_fake_docker(tmp_path / "bin", daemon=True), "MARKER": str(tmp_path / "m")}
    proc = run_ci("run", "--suite", "train", "--root", str(checkout), "--gpus", "1",
                  "--lock-path-pattern", str(tmp_path / "locks" / "gpu_{gpu_id}.lock"), env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"FAILED tests/e2e/test_job.py: failed: docker: {NO_DAEMON}" in proc.stdout.splitlines()


@pytest.mark.parametrize(("output", "expected"), [
    ("collected 1 item\nE   ValueError: bad shape\n= 1 failed =", "ValueError: bad shape"),
    ("Traceback (most recent call last):\n  File \"x.py\", line 1\nKeyError: 'lr'\nbye",
     "KeyError: 'lr'"),
    (f"docker: {NO_DAEMON}\nRun 'docker run --help' for more information", f"docker: {NO_DAEMON}"),
    ("bash: line 1: torchrun: command not found\n", "bash: line 1: torchrun: command not found"),
    ("step 1\nstep 2\n", "step 2"),
    ("", ""),
])
def test_reason_prefers_the_line_that_says_what_failed(output, expected):
    assert reason(output) == expected


def test_more_gpus_than_nvml_sees_are_refused_unless_emulated(monkeypatch):
    # NVML is the machine's; here it is a stand-in that reports 2 GPUs.
    monkeypatch.setattr("ci.backends.local.nvml_gpu_count", lambda: 2)
    with pytest.raises(UsageError, match=r"--gpus 8: NVML sees 2 GPU\(s\) on this machine"):
        LocalBackend(gpus=8).check()
    LocalBackend(gpus=2).check()
    EmulatedBackend(gpus=8).check()
    monkeypatch.setattr("ci.backends.local.nvml_gpu_count", lambda: None)
    LocalBackend(gpus=8).check()  # NVML sees nothing: --gpus N is the only word there is


def test_selection_and_what_each_backend_owns(tmp_path):
    by_name = {s.name: s for s in SUITES}
    pick = {"emulate_gpus": False, "no_docker": False, "lock_path_pattern": None, "image": None,
            "pull": "never", "root": str(tmp_path), "note": lambda _: None}
    assert isinstance(select_backend(by_name["cpu_unit"], BackendOptions(gpus=0, **pick)), LocalBackend)
    docker = select_backend(by_name["megatron"], BackendOptions(gpus=8, **pick))
    assert isinstance(docker, DockerBackend)
    assert isinstance(select_backend(by_name["megatron"], BackendOptions(gpus=8, **{**pick, "no_docker": True})),
                      LocalBackend)
    emulated = select_backend(by_name["megatron"], BackendOptions(gpus=4, **{**pick, "emulate_gpus": True}))
    assert isinstance(emulated, EmulatedBackend)

    entry = ResolvedEntry(id="tests/e2e/t.py --x 1", path="tests/e2e/t.py", test_args=("--x", "1"),
                         timeout=10, num_gpus=2, kind="script")
    env = EntryEnv(inherited={"HOME": "/home/u", "SECRET": "s"}, own={"SLIME_CI_GPUS": "3,5"},
                   host={"TMPDIR": "/tmp/e1"})
    argv = (sys.executable, "tests/e2e/t.py", "--x", "1")
    local = LocalBackend(gpus=8).launch(entry, argv, env, (3, 5))
    assert local.argv == argv
    assert (local.env["CUDA_VISIBLE_DEVICES"], local.env["TMPDIR"], local.env["HOME"]) == ("3,5", "/tmp/e1", "/home/u")
    # The container sees the entry's own variables and nothing the runner merely inherited;
    # PYTHONPATH (the checkout's root, ci/backends/checkout.py) is one of the entry's own.
    inner = docker.launch(entry, argv, env, (3, 5)).argv
    assert "SLIME_CI_GPUS=3,5" in inner and not any(a.startswith(("SECRET=", "PYTHONPATH=")) for a in inner)
    rooted = EntryEnv(inherited=env.inherited, own={**env.own, "PYTHONPATH": str(REPO)}, host=env.host)
    assert f"PYTHONPATH={REPO}" in docker.launch(entry, argv, rooted, (3, 5)).argv
    fake = emulated.launch(entry, argv, env, (3, 5))
    assert (fake.env["CUDA_VISIBLE_DEVICES"], fake.env["SLIME_CI_DEVICE"]) == ("", "cpu")
    pattern = emulated.lock_pattern
    assert pattern.endswith("gpu_{gpu_id}.lock") and os.path.isdir(os.path.dirname(pattern))
    emulated.close()
    assert not os.path.exists(os.path.dirname(pattern))
    inside = docker.launch(entry, argv, env, (3, 5))
    assert inside.argv[:2] == ("docker", "run") and inside.handle in inside.argv
    text = " ".join(inside.argv)
    # Only the entry's own variables enter the container; the runner's stay outside.
    assert "SLIME_CI_GPUS=3,5" in text and "SECRET" not in text and "/tmp/e1" not in text
    assert "HOME=" not in text
    assert docker.describe() == "docker slimerl/slime:latest"
    assert docker.lock_pattern == "/dev/shm/custom_gpu_lock_{gpu_id}.lock"


def test_the_tier_is_compared_only_in_the_registry_and_the_backend_selection():
    found = subprocess.run("grep -n '\"gpu\"' ci/*.py ci/*/*.py", shell=True, cwd=REPO,
                           capture_output=True, text=True, check=False).stdout
    files = {line.split(":", 1)[0] for line in found.splitlines()}
    assert files == {"ci/registry/model.py", "ci/registry/repo_suites.py", "ci/backends/__init__.py"}, found
    lines = (REPO / "ci" / "backends" / "__init__.py").read_text().splitlines()
    start = next(i for i, line in enumerate(lines, 1) if line.startswith("def select_backend("))
    used = [int(line.split(":")[1]) for line in found.splitlines() if line.startswith("ci/backends/")]
    assert used and all(n > start for n in used), "the tier is read outside select_backend"


def test_root_means_the_checkouts_registry_for_every_command(checkout):
    plan = run_ci("plan", "--event", "pull_request", "--labels", "run-ci-train", "--root", str(checkout))
    assert plan.returncode == 0, plan.stderr
    assert "train" in plan.stdout and "megatron" not in plan.stdout
    wf = run_ci("workflows", "--check", "--root", str(checkout))
    assert wf.returncode == 1  # its registry has no workflow generated yet
    assert "run-ci-train" in wf.stdout and "run-ci-megatron" not in wf.stdout
    audit = run_ci("audit", "--root", str(checkout))
    assert audit.returncode == 0, audit.stdout
    run = run_ci("run", "--suite", "train", "--root", str(checkout), "--dry-run", "--gpus", "1")
    assert run.returncode == 0 and "example/train:1" in run.stdout


def test_port_blocks_are_one_size_for_the_runner_and_the_ray_head(tmp_path):
    from ci.backends.launch import entry_env
    from ci.gpu.ports import PORT_BLOCK
    from ci.run.runner import RunConfig
    from slime.utils.external_utils.ray_head import PORT_BLOCK_SIZE, RayPorts

    assert PORT_BLOCK_SIZE == PORT_BLOCK
    cfg = RunConfig(root=tmp_path, work_dir=tmp_path, jobs=2, base_env={})
    entry = ResolvedEntry(id="t", path="t", timeout=1, num_gpus=1, kind="script")
    bases = [int(entry_env(entry, cfg, devices=(g,), out_dir=tmp_path, tmp_dir=tmp_path)
                 .own["SLIME_CI_PORT_BASE"]) for g in (0, 1)]
    first, second = (RayPorts.from_base(b) for b in bases)
    assert first.max_worker < second.base  # neighbouring GPUs' heads never share a port


def test_planning_is_pure():
    text = (REPO / "ci" / "select" / "entries.py").read_text()
    assert "sys.modules" not in text and "import sys" not in text


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
