"""The self-hosted runner set-up: what the workflow asks of it, and who can read the token.

runners/registrar.py registers each runner just in time. Two stand-ins, because this
machine has neither: a loopback HTTP server plays GitHub's REST API (generate-jitconfig and
the runner DELETE), and a `docker` script on PATH plays the docker CLI, recording the argv
and environment each runner container would get. Everything else is the real registrar,
run as a process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO as ROOT
from _ci import loopback_server

from ci.github.job_plan import GPU_RUNNER, table
from ci.gpu.allocator import DEFAULT_PATTERN

NUM_GPUS = 0

RUNNERS = ROOT / "runners"
TOKEN = "github_pat_" + "A1b2C3d4" * 4  # a fake admin token: what no runner may ever see


SLOT_1 = {"SLIME_CI_SLOT": "1", "SLIME_CI_SLOT_UID": "61001", "SLIME_CI_WORK_DIR": "/srv/slime-ci/work"}


def _interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}`, the forms docker-compose.yml
    uses (no compose CLI here): an unset or empty VAR takes the default, or is an error."""

    def one(match: re.Match[str]) -> str:
        name, op, arg = match.group(1), match.group(2) or "", match.group(3) or ""
        value = env.get(name, "")
        if value:
            return value
        if op == ":?":
            raise LookupError(f"{name}: {arg}")
        return arg

    return re.sub(r"\$\{(\w+)(?:(:-|:\?)([^}]*))?\}", one, text)


def _runner(env: dict[str, str] | None = None) -> dict[str, Any]:
    """The runner service as compose renders it for the docker CLI's environment `env`."""
    text = (RUNNERS / "docker-compose.yml").read_text()
    compose: dict[str, Any] = yaml.safe_load(_interpolate(text, SLOT_1 if env is None else env))
    assert list(compose["services"]) == ["runner"]
    service: dict[str, Any] = compose["services"]["runner"]
    return service


def test_the_runner_service_holds_no_credential_and_starts_only_when_named() -> None:
    service = _runner()
    assert "env_file" not in service and service["profiles"] == ["jit"]
    assert not [k for k in service["environment"] if re.search("TOKEN|ACCESS|REPO_URL", k)]
    assert "ACCESS_TOKEN" not in (RUNNERS / "docker-compose.yml").read_text()
    assert not (RUNNERS / ".env.example").exists()


def test_runners_share_dev_shm_and_same_path_mounts_caches_read_only() -> None:
    assert DEFAULT_PATTERN.startswith("/dev/shm/")  # what `ipc: host` shares
    service = _runner()
    assert service["ipc"] == "host" and "no-new-privileges:true" in service["security_opt"]
    assert service["cap_drop"] == ["ALL"] and "privileged" not in service and "cap_add" not in service
    for volume in service["volumes"]:
        host, inside = volume.split(":")[:2]
        assert host == inside, f"{volume} must mount at the same path"
    data = service["environment"]["SLIME_CI_DATA_DIR"]
    assert f"{data}:{data}:ro" in service["volumes"]


@pytest.fixture
def fake_github():
    """A loopback stand-in for GitHub's REST API: the two calls the registrar makes."""
    seen: list[dict[str, Any]] = []

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code: int, body: object | None) -> None:
            data = b"" if body is None else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append({"method": "POST", "path": self.path, "auth": self.headers["Authorization"],
                         "body": body})
            if self.headers["Authorization"] != f"Bearer {TOKEN}":
                self._answer(401, {"message": "Bad credentials"})
                return
            n = len([s for s in seen if s["method"] == "POST"])
            self._answer(201, {"runner": {"id": 100 + n, "name": body["name"]},
                               "encoded_jit_config": f"JIT-{n}-one-use"})

        def do_DELETE(self) -> None:
            seen.append({"method": "DELETE", "path": self.path, "auth": self.headers["Authorization"]})
            self._answer(204 if self.path.endswith("/101") else 404, None)

        def log_message(self, *args: object) -> None:
            pass

    with loopback_server(Handler) as url:
        yield url, seen


def _registrar(tmp_path: Path, api: str, *args: str, token_mode: int = 0o600,
               env_extra: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], list[Any]]:
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    record = tmp_path / "docker-calls.jsonl"
    (bindir / "docker").write_text(  # stand-in for the docker CLI: record, then "run one job"
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"open({str(record)!r}, 'a').write(json.dumps({{'argv': sys.argv[1:], 'env': dict(os.environ)}}) + '\\n')\n")
    (bindir / "docker").chmod(0o755)
    token_file = tmp_path / "admin.token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(token_mode)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": str(tmp_path), **(env_extra or {})}
    done = subprocess.run([sys.executable, str(RUNNERS / "registrar.py"), "--repo", "acme/slime",
                           "--token-file", str(token_file), "--api-url", api, *args],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    calls = [json.loads(x) for x in record.read_text().splitlines()] if record.exists() else []
    return done, calls


def test_each_runner_gets_only_its_one_use_config_never_the_token(tmp_path: Path, fake_github) -> None:
    api, seen = fake_github
    done, calls = _registrar(tmp_path, api, "--runners", "2", "--once",
                             env_extra={"GH_TOKEN": TOKEN, "WANDB_API_KEY": "w"})
    assert done.returncode == 0, done.stderr
    posts = [s for s in seen if s["method"] == "POST"]
    assert len(posts) == 2 and {p["path"] for p in posts} == {
        "/repos/acme/slime/actions/runners/generate-jitconfig"}
    assert all(p["auth"] == f"Bearer {TOKEN}" for p in posts)
    # The labels registered by default are exactly those the workflow's GPU jobs ask for.
    wanted = {x for j in table() if j.self_hosted for x in j.runs_on} - {"self-hosted"}
    assert wanted == set(GPU_RUNNER) - {"self-hosted"}
    assert [set(p["body"]["labels"]) for p in posts] == [wanted, wanted]
    assert sorted(p["body"]["work_folder"] for p in posts) == ["/srv/slime-ci/work/1", "/srv/slime-ci/work/2"]
    # Every registration is removed after its container exits (404: it unregistered itself).
    assert sorted(s["path"].rsplit("/", 1)[1] for s in seen if s["method"] == "DELETE") == ["101", "102"]
    assert len(calls) == 2
    configs = set()
    for call in calls:
        argv = call["argv"]
        assert argv[:2] == ["compose", "-f"] and argv[3:5] == ["run", "--rm"]
        assert argv[-3:-1] == ["/home/runner/run.sh", "--jitconfig"]
        configs.add(argv[-1])
        assert TOKEN not in json.dumps(call), "the admin token reached the docker CLI"
        assert "WANDB_API_KEY" not in call["env"] and "GH_TOKEN" not in call["env"]
    assert configs == {"JIT-1-one-use", "JIT-2-one-use"}
    assert TOKEN not in done.stdout + done.stderr


def test_bad_input_and_github_refusals_are_one_line(tmp_path: Path, fake_github) -> None:
    api, seen = fake_github
    done, calls = _registrar(tmp_path, api, "--once", token_mode=0o644)
    assert done.returncode == 2 and "readable by others" in done.stderr and done.stderr.count("\n") == 1
    assert not seen and not calls
    for args, expect in ((("--runners", "0"), "give 1 to 64"), (("--labels", "self-hosted"), "besides"),
                         (("--work-dir", "rel"), "absolute path")):
        done, _ = _registrar(tmp_path, api, *args)
        assert done.returncode == 2 and expect in done.stderr and done.stderr.count("\n") == 1, done.stderr
    token_file = tmp_path / "admin.token"
    token_file.write_text("wrong-token\n")
    token_file.chmod(0o600)
    done = subprocess.run([sys.executable, str(RUNNERS / "registrar.py"), "--repo", "acme/slime", "--once",
                           "--runners", "1", "--token-file", str(token_file), "--api-url", api],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 1 and "GitHub answered 401" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr and "wrong-token" not in done.stderr


def test_guide_covers_jit_registration_and_lock_status() -> None:
    guide = (RUNNERS / "README.md").read_text()
    for needle in ("registrar.py", "generate-jitconfig", "python -m ci gpu-status", "/dev/shm",
                   "ipc: host", "never from forks", "control machine"):
        assert needle in guide, needle
    # Every job it names exists in the workflow (the original's docs named jobs long gone).
    gpu_jobs = {j.id for j in table() if j.self_hosted and not j.scheduled_only}
    intro = re.search(r"\(([^)]*)\)", guide.split("\n\n")[1])
    assert intro is not None
    named = set(re.findall(r"`(\w+)`", intro.group(1)))
    assert named == gpu_jobs
    ignored = subprocess.run(["git", "check-ignore", "-q", "runners/admin.token"], cwd=ROOT,
                             capture_output=True, timeout=30, check=False)
    assert ignored.returncode == 0, "a token file dropped in runners/ must be ignored by git"


# Long-lived secrets a control machine's environment may hold: none may reach a runner.
SECRETS = {"WANDB_API_KEY": "wandb-long-lived", "GH_TOKEN": "gho_long_lived", "GITHUB_TOKEN": "ghs_job",
           "AWS_SECRET_ACCESS_KEY": "aws-long-lived", "HF_TOKEN": "hf_long_lived",
           "SLIME_CI_HISTORY_URL": "postgresql://ci:pw@db/ci", "SLIME_CI_SLOT_UID": "0"}


def test_each_runner_runs_as_its_slot_with_its_slot_socket_and_no_secret(tmp_path: Path, fake_github) -> None:
    # The registrar's real code path (a loopback GitHub, a recording docker CLI); each recorded
    # call's environment is what compose interpolates docker-compose.yml with.
    api, _ = fake_github
    done, calls = _registrar(tmp_path, api, "--runners", "2", "--once", "--slot-uid-base", "62000",
                             env_extra={**SECRETS, "DOCKER_HOST": "ssh://ci@gpu-host", "LC_ALL": "C.UTF-8"})
    assert done.returncode == 0, done.stderr
    assert len(calls) == 2
    seen_uids = set()
    for call in calls:
        env, argv = call["env"], call["argv"]
        slot = env["SLIME_CI_SLOT"]
        uid = env["SLIME_CI_SLOT_UID"]
        assert uid == str(62000 + int(slot)), "the caller's SLIME_CI_SLOT_UID must not win"
        assert argv[argv.index("--name") + 1] == f"slime-ci-gpu-{slot}"
        assert env["DOCKER_HOST"] == "ssh://ci@gpu-host" and env["LC_ALL"] == "C.UTF-8"
        for name, value in SECRETS.items():
            if name != "SLIME_CI_SLOT_UID":
                assert name not in env and value not in json.dumps(call), name
        service = _runner(env)
        assert service["user"] == f"{uid}:{uid}"
        sock = f"/run/user/{uid}/podman/podman.sock"
        assert service["environment"]["DOCKER_HOST"] == f"unix://{sock}"
        mounts = [v.split(":")[0] for v in service["volumes"]]
        # The slot's own socket, its own work folder, the caches; no other socket or folder.
        assert sorted(mounts) == sorted([sock, f"/srv/slime-ci/work/{slot}", "/srv/slime-ci/data"])
        assert not [m for m in mounts if m.endswith("docker.sock") or m in ("/", "/run", "/var/run")]
        assert "/srv/slime-ci/data:/srv/slime-ci/data:ro" in service["volumes"]
        assert service["environment"]["SLIME_CI_GPU_DEVICES"] == "cdi"
        assert not [k for k in service["environment"] if re.search("TOKEN|KEY|SECRET|PASSWORD|URL", k)]
        assert service["tmpfs"] == [f"/home/runner/_diag:uid={uid},gid={uid},mode=0700"]
        seen_uids.add(uid)
    assert seen_uids == {"62001", "62002"}


def test_the_runner_service_refuses_to_start_without_a_slot() -> None:
    # `docker compose run runner` by hand, without the registrar's slot: compose stops at the
    # `:?` before it starts anything, instead of running the runner as the image's user.
    for missing in ("SLIME_CI_SLOT_UID", "SLIME_CI_SLOT"):
        env = {k: v for k, v in SLOT_1.items() if k != missing}
        with pytest.raises(LookupError, match=f"{missing}: .*runners/registrar.py"):
            _runner(env)


def test_the_registrar_dry_run_names_each_slot_and_registers_nothing(tmp_path: Path, fake_github) -> None:
    api, seen = fake_github
    done, calls = _registrar(tmp_path, api, "--runners", "2", "--dry-run")
    assert done.returncode == 0 and not seen and not calls, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) == 2
    for slot, line in enumerate(lines, start=1):
        assert line.startswith(f"SLIME_CI_SLOT={slot} SLIME_CI_SLOT_UID={61000 + slot} "
                               "SLIME_CI_WORK_DIR=/srv/slime-ci/work docker compose -f ")
        assert line.endswith("'<one-use JIT config>'")
    bad, _ = _registrar(tmp_path, api, "--slot-uid-base", "0", "--dry-run")
    assert bad.returncode == 2 and "--slot-uid-base 0" in bad.stderr and bad.stderr.count("\n") == 1


def _reset_script(tmp_path: Path, code: int) -> Path:
    """A stand-in for `ssh gpu-host sudo setup_slots.py reset --slot N`: it logs, then exits `code`."""
    script = tmp_path / "reset.py"
    calls = tmp_path / "docker-calls.jsonl"  # what the docker stand-in has recorded so far
    script.write_text(f"import json, os, sys\ncalls = {str(calls)!r}\n"
                      "ran = [json.loads(x)['env'].get('SLIME_CI_SLOT') for x in open(calls)] "
                      "if os.path.exists(calls) else []\n"
                      f"open({str(tmp_path / 'order.log')!r}, 'a').write(json.dumps("
                      "{'reset': sys.argv[1], 'env': sorted(os.environ), 'ran_before': ran.count(sys.argv[1])})"
                      " + '\\n')\n"
                      f"raise SystemExit({code})\n")
    return script


def test_each_slot_is_reset_before_its_runner_is_registered(tmp_path: Path, fake_github) -> None:
    api, seen = fake_github
    script = _reset_script(tmp_path, 0)
    done, calls = _registrar(tmp_path, api, "--runners", "2", "--once",
                             "--reset-command", f"{sys.executable} {script} {{slot}}", env_extra=SECRETS)
    assert done.returncode == 0, done.stderr
    resets = [json.loads(x) for x in (tmp_path / "order.log").read_text().splitlines()]
    assert sorted(r["reset"] for r in resets) == ["1", "2"]
    assert [r["ran_before"] for r in resets] == [0, 0]  # before its slot's runner started
    assert not [r for r in resets if set(r["env"]) & (set(SECRETS) - {"SLIME_CI_SLOT_UID"})]
    assert len(calls) == 2 and len([s for s in seen if s["method"] == "POST"]) == 2


def test_a_slot_whose_reset_fails_gets_no_runner(tmp_path: Path, fake_github) -> None:
    api, seen = fake_github
    script = _reset_script(tmp_path, 3)
    done, calls = _registrar(tmp_path, api, "--runners", "1", "--once",
                             "--reset-command", f"{sys.executable} {script} {{slot}}")
    assert done.returncode == 1 and "slot 1: the reset command exited 3; no runner registered" in done.stderr
    assert not seen and not calls  # nothing registered, nothing started
    bad, _ = _registrar(tmp_path, api, "--once", "--reset-command", "setup_slots.py reset")
    assert bad.returncode == 2 and "{slot}" in bad.stderr and bad.stderr.count("\n") == 1


def test_the_registrar_and_compose_name_the_paths_setup_slots_makes() -> None:
    # Three files agree on one slot: its uid, its engine socket, its work folder.
    sys.path.insert(0, str(RUNNERS))
    try:
        import registrar
        import setup_slots
    finally:
        sys.path.remove(str(RUNNERS))
    plan = setup_slots.slot_plan(Path("/srv/slime-ci"), 2, prefix="slime-ci-slot",
                                 uid_base=setup_slots._parser().get_default("uid_base"), subid_base=10**9)
    cfg, _ = registrar.parse(["--repo", "acme/slime", "--token-file", "/nonexistent", "--runners", "2"])
    for made in plan:
        env = registrar.slot_env(cfg, made.index)
        assert env["SLIME_CI_SLOT_UID"] == str(made.uid)
        service = _runner(env)
        assert f"{made.socket}:{made.socket}" in service["volumes"]
        assert f"{made.work}:{made.work}" in service["volumes"]
        assert f"{cfg.work_dir}/{made.index}" == str(made.work)  # the JIT work_folder


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
