"""The self-hosted runner set-up matches what the generated workflow asks of it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from _ci import REPO as ROOT

from ci.event_plan import GPU_RUNNER, table
from ci.gpu_lock import DEFAULT_PATTERN

NUM_GPUS = 0

RUNNERS = ROOT / "runners"


def _defaults(text: str) -> str:
    """Resolve `${VAR:-default}` as compose does when VAR is unset."""
    return re.sub(r"\$\{\w+:-([^}]*)\}", r"\1", text)


def _compose() -> dict[str, Any]:
    text = _defaults((RUNNERS / "docker-compose.yml").read_text())
    loaded: dict[str, Any] = yaml.safe_load(text)
    return loaded


def _runners() -> dict[str, dict[str, Any]]:
    services: dict[str, dict[str, Any]] = _compose()["services"]
    assert services
    return services


def test_runners_carry_exactly_the_labels_gpu_jobs_ask_for() -> None:
    wanted = {x for j in table() if j.self_hosted for x in j.runs_on} - {"self-hosted"}
    assert wanted == set(GPU_RUNNER) - {"self-hosted"}
    for service in _runners().values():
        assert set(service["environment"]["LABELS"].split(",")) == wanted


def test_runners_share_docker_dev_shm_and_same_path_mounts() -> None:
    assert DEFAULT_PATTERN.startswith("/dev/shm/")  # what `ipc: host` shares
    for name, service in _runners().items():
        assert service["ipc"] == "host", name
        assert service["env_file"] == ".env"
        assert "/var/run/docker.sock:/var/run/docker.sock" in service["volumes"]
        for volume in service["volumes"]:
            host, inside = volume.split(":")[:2]
            assert host == inside, f"{name}: {volume} must mount at the same path"
        env = service["environment"]
        assert env["EPHEMERAL"] == "true"
        assert env["DISABLE_AUTO_UPDATE"] == "true"
        mounted = [v.split(":")[0] for v in service["volumes"]]
        assert any(env["RUNNER_WORKDIR"].startswith(m + "/") for m in mounted), name


def test_each_runner_has_its_own_work_dir_and_name() -> None:
    services = _runners()
    workdirs = [s["environment"]["RUNNER_WORKDIR"] for s in services.values()]
    prefixes = [s["environment"]["RUNNER_NAME_PREFIX"] for s in services.values()]
    assert len(set(workdirs)) == len(services) >= 2
    assert len(set(prefixes)) == len(services)


def test_registration_token_file_is_ignored_and_the_example_holds_no_token() -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", "runners/.env"], cwd=ROOT,
                             capture_output=True, timeout=30, check=False)
    assert ignored.returncode == 0, "runners/.env must be ignored by git"
    example = (RUNNERS / ".env.example").read_text()
    assert not re.search(r"gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}", example)
    assigned = dict(line.split("=", 1) for line in example.splitlines()
                    if line and not line.startswith("#"))
    assert assigned["ACCESS_TOKEN"] == "replace-me"
    assert "OWNER/REPO" in assigned["REPO_URL"]


def test_guide_covers_setup_ephemeral_runners_and_lock_status() -> None:
    guide = (RUNNERS / "README.md").read_text()
    for needle in ("cp .env.example .env", "docker compose up -d", "EPHEMERAL=true",
                   "python -m ci gpu-status", "/dev/shm", "ipc: host", "never from forks"):
        assert needle in guide, needle
    # Every job it names exists in the workflow (the original's docs named jobs long gone).
    gpu_jobs = {j.id for j in table() if j.self_hosted and not j.scheduled_only}
    intro = re.search(r"\(([^)]*)\)", guide.split("\n\n")[1])
    assert intro is not None
    named = set(re.findall(r"`(\w+)`", intro.group(1)))
    assert named == gpu_jobs


@pytest.mark.skipif(not (Path(sys.executable).parent / "check-jsonschema").exists(),
                    reason="check-jsonschema not installed (lint profile)")
def test_compose_file_validates_against_the_compose_spec() -> None:
    tool = Path(sys.executable).parent / "check-jsonschema"
    run = subprocess.run([str(tool), "--builtin-schema", "vendor.compose-spec",
                          str(RUNNERS / "docker-compose.yml")], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode == 0, run.stdout + run.stderr


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
