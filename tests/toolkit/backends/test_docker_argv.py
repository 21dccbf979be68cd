"""The `docker run` argv of the GPU tier, checked piece by piece (pure: no engine needed)."""

import shlex
import sys
from pathlib import Path

import pytest

from ci.backends.docker_argv import (
    DEFAULT_PASSTHROUGH,
    DockerOptions,
    HostLimits,
    container_name,
    docker_kill_argv,
    docker_run_argv,
    fit_to_host,
    gpus_flag,
    host_settings,
    inner_script,
    parse_host_limits,
)

NUM_GPUS = 0
WS = Path("/work/checkout")
INNER = ("python", "tests/e2e/test_x.py", "--mode", "a b")


def _opts(**kw):
    base = dict(image="slimerl/slime:latest", workspace=WS)
    base.update(kw)
    return DockerOptions(**base)


def _pairs(argv, flag):
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_minimal_isolation_is_the_default_and_grants_no_host_namespace():
    argv = docker_run_argv(_opts(devices=(0, 1)), INNER)
    head = argv[: argv.index("slimerl/slime:latest")]
    for flag in ("--privileged", "--ipc=host", "--cap-add"):
        assert flag not in head
    assert "--network" not in head  # Docker's own bridge, not the host's loopback services
    assert _pairs(head, "--security-opt") == ["no-new-privileges"]
    assert "--shm-size=16g" in head and _pairs(head, "--gpus") == ['"device=0,1"']
    assert _pairs(head, "--ulimit") == ["memlock=-1", "stack=67108864"]
    with pytest.raises(ValueError, match="isolation"):
        docker_run_argv(_opts(isolation="root"), INNER)


def test_framework_isolation_keeps_the_original_flags_in_order_before_image():
    argv = docker_run_argv(_opts(devices=(0, 1), isolation="framework", privileged=True), INNER)
    assert argv[:4] == ("docker", "run", "--pull=always", "--rm")
    head = argv[: argv.index("slimerl/slime:latest")]
    for flag in ("--privileged", "--ipc=host", "--shm-size=16g", "--memory=0", "--memory-swap=0"):
        assert flag in head
    assert _pairs(head, "--cap-add") == ["SYS_NICE"]
    assert _pairs(head, "--security-opt") == ["seccomp=unconfined"]
    assert _pairs(head, "--network") == ["host"]
    assert _pairs(head, "--ulimit") == ["memlock=-1", "stack=67108864"]


def test_gpus_are_the_held_devices_quoted_for_docker_csv():
    argv = docker_run_argv(_opts(devices=(3, 5)), INNER)
    assert _pairs(argv, "--gpus") == ['"device=3,5"']
    assert gpus_flag(()) == ()
    assert "--gpus" not in docker_run_argv(_opts(), INNER)
    with pytest.raises(ValueError, match="distinct"):
        gpus_flag((1, 1))


def test_cdi_hand_off_names_each_held_gpu_and_no_other():
    # Rootless Podman: the lock's holder passes CDI names of the GPUs it holds (no GPU here:
    # the argv is checked, never run; the names are those `nvidia-ctk cdi generate` writes).
    for isolation in ("minimal", "framework"):
        argv = docker_run_argv(_opts(devices=(3, 5), gpu_devices="cdi", isolation=isolation), INNER)
        head = argv[: argv.index("slimerl/slime:latest")]
        assert _pairs(head, "--device") == ["nvidia.com/gpu=3", "nvidia.com/gpu=5"]
        assert "--gpus" not in head and not any(a.startswith("/dev/") for a in head)
    assert "--device" not in docker_run_argv(_opts(gpu_devices="cdi"), INNER)


def test_node_hand_off_passes_the_held_gpus_nodes_and_the_control_nodes():
    # These /dev/nvidia* paths are not real here (no GPU): the argv is checked, never run.
    argv = docker_run_argv(_opts(devices=(2,), gpu_devices="nodes"), INNER)
    assert _pairs(argv, "--device") == ["/dev/nvidia2", "/dev/nvidiactl", "/dev/nvidia-uvm",
                                        "/dev/nvidia-uvm-tools"]
    assert "/dev/nvidia0" not in argv and "--gpus" not in argv
    # The container numbers what it got from 0, whichever hand-off gave it.
    assert "CUDA_VISIBLE_DEVICES=0" in _pairs(argv, "-e")
    with pytest.raises(ValueError, match="GPU hand-off 'all'"):
        gpus_flag((0,), "all")  # type: ignore[arg-type]


def test_the_hand_off_comes_from_slime_ci_gpu_devices():
    assert host_settings({}).gpu_devices == "gpus"
    assert host_settings({"SLIME_CI_GPU_DEVICES": "cdi"}).gpu_devices == "cdi"
    with pytest.raises(ValueError, match="SLIME_CI_GPU_DEVICES='cuda': use one of gpus, cdi, nodes"):
        host_settings({"SLIME_CI_GPU_DEVICES": "cuda"})


def test_the_docker_backend_hands_its_granted_gpus_over_as_configured(monkeypatch, tmp_path):
    from ci.backends.docker import DockerBackend
    from ci.backends.launch import EntryEnv
    from ci.select.entries import ResolvedEntry

    monkeypatch.setenv("SLIME_CI_GPU_DEVICES", "cdi")
    backend = DockerBackend(gpus=8, image="img:1", pull="never", root=str(tmp_path),
                            lock_path_pattern=None, note=lambda _: None)
    entry = ResolvedEntry(id="tests/e2e/test_x.py", path="tests/e2e/test_x.py", timeout=60, num_gpus=2,
                          kind="pytest")
    launch = backend.launch(entry, ("python", "tests/e2e/test_x.py"), EntryEnv(inherited={}, own={}),
                            devices=(6, 1))
    assert _pairs(launch.argv, "--device") == ["nvidia.com/gpu=6", "nvidia.com/gpu=1"]


def test_cuda_visible_devices_is_renumbered_inside_the_container():
    env = {"CUDA_VISIBLE_DEVICES": "3,5", "NUM_GPUS": "2", "SLIME_CI_GPUS": "3,5"}
    argv = docker_run_argv(_opts(devices=(3, 5), env=env), INNER)
    values = _pairs(argv, "-e")
    assert "CUDA_VISIBLE_DEVICES=0,1" in values
    assert "SLIME_CI_GPUS=3,5" in values  # what the host holds stays visible for reports
    assert "NUM_GPUS=2" in values
    zero = _pairs(docker_run_argv(_opts(env={"NUM_GPUS": "0"}), INNER), "-e")
    assert "CUDA_VISIBLE_DEVICES=" in zero


def test_env_values_set_and_passthrough_by_name_only():
    argv = docker_run_argv(_opts(env={"TEST_FILE": "tests/e2e/test_x.py", "WANDB_API_KEY": "x"},
                                 passthrough=("WANDB_API_KEY", "http_proxy")), INNER)
    values = _pairs(argv, "-e")
    assert "TEST_FILE=tests/e2e/test_x.py" in values
    assert "http_proxy" in values  # docker reads the value itself: no secret in argv
    # An explicit value wins over pass-through, and is not given twice.
    assert values.count("WANDB_API_KEY=x") == 1 and "WANDB_API_KEY" not in values
    assert "WANDB_API_KEY" in DEFAULT_PASSTHROUGH and "GITHUB_COMMIT_NAME" in DEFAULT_PASSTHROUGH


def test_workspace_mounted_at_same_path_and_caches():
    caches = {"/data/models": "/root/models", "/data/datasets": "/root/datasets"}
    argv = docker_run_argv(_opts(caches=caches), INNER)
    mounts = _pairs(argv, "-v")
    assert mounts[0] == f"{WS}:{WS}"
    # Read-only: a test cannot poison the models the next job loads.
    assert set(mounts[1:]) == {"/data/models:/root/models:ro", "/data/datasets:/root/datasets:ro"}
    writer = _pairs(docker_run_argv(_opts(caches=caches, writable_caches=True), INNER), "-v")
    assert set(writer[1:]) == {"/data/models:/root/models", "/data/datasets:/root/datasets"}
    assert _pairs(argv, "-w") == [str(WS)]
    inside = _pairs(docker_run_argv(_opts(caches=caches, env={"SLIME_CI_MODELS_DIR": "/data/models"}),
                                    INNER), "-e")
    assert "SLIME_CI_MODELS_DIR=/root/models" in inside  # where U finds the cache in the container
    with pytest.raises(ValueError, match="absolute"):
        docker_run_argv(_opts(workspace=Path("rel")), INNER)


def test_inner_is_one_bash_string_install_then_exec_entry():
    argv = docker_run_argv(_opts(), INNER)
    assert argv[-4:-1] == ("slimerl/slime:latest", "bash", "-c")
    words = shlex.split(argv[-1])
    split = words.index("&&")
    assert words[:split] == ["pip", "install", "-e", ".", "--no-deps", "--break-system-packages"]
    assert words[split + 1:] == ["exec", *INNER]  # "a b" stays one argument
    assert shlex.split(inner_script(INNER, install=False)) == ["exec", *INNER]
    with pytest.raises(ValueError, match="no command"):
        inner_script((), install=True)


def test_pull_policy_and_name():
    argv = docker_run_argv(_opts(pull="never", name="slime-ci-x-1"), INNER)
    assert argv[2] == "--pull=never"
    assert _pairs(argv, "--name") == ["slime-ci-x-1"]
    with pytest.raises(ValueError, match="pull policy"):
        docker_run_argv(_opts(pull="sometimes"), INNER)


def test_container_name_is_valid_and_kill_argv():
    name = container_name("tests/e2e/test_x.py --save-optimizer gpu", "ab12")
    assert name.startswith("slime-ci-tests-e2e-test_x.py-save-optimizer-gpu")
    assert name.endswith("-ab12")
    assert all(c.isalnum() or c in "_.-" for c in name)
    assert docker_kill_argv(name) == ("docker", "kill", name)


def test_host_settings_reads_cache_dirs_and_pull():
    s = host_settings({"SLIME_CI_MODELS_DIR": "/m", "SLIME_CI_DATA_DIR": "/ci-data",
                       "SLIME_CI_DOCKER_PULL": "missing"})
    assert s.caches == {"/m": "/root/models", "/root/datasets": "/root/datasets",
                        "/ci-data": "/ci-data"}
    assert s.pull == "missing" and s.cache_writer is False
    assert host_settings({}).pull is None
    assert host_settings({"SLIME_CI_CACHE_WRITER": "1"}).cache_writer is True
    with pytest.raises(ValueError, match="SLIME_CI_CACHE_WRITER"):
        host_settings({"SLIME_CI_CACHE_WRITER": "maybe"})
    with pytest.raises(ValueError, match="SLIME_CI_DOCKER_PULL"):
        host_settings({"SLIME_CI_DOCKER_PULL": "yes"})


FULL = "CapBnd:\t000001ffffffffff\n"
NO_SYS_RESOURCE = "CapBnd:\t000001fffeffffff\n"  # bit 24 missing, as in a sandboxed VM


def test_host_limits_parse():
    assert parse_host_limits(FULL, 40, 8 << 20) == HostLimits(full_capabilities=True, memlock_max=-1)
    limited = parse_host_limits(NO_SYS_RESOURCE, 40, 8 << 20)
    assert limited == HostLimits(full_capabilities=False, memlock_max=8 << 20)
    assert parse_host_limits(NO_SYS_RESOURCE, 40, -1).memlock_max == -1


def test_fit_to_host_lowers_only_what_a_restricted_host_cannot_grant():
    opts = _opts(isolation="framework", privileged=True)
    same, notes = fit_to_host(opts, HostLimits(full_capabilities=True, memlock_max=-1))
    assert same == opts and notes == ()
    fitted, notes = fit_to_host(opts, HostLimits(full_capabilities=False, memlock_max=4096))
    argv = docker_run_argv(fitted, INNER)
    assert "--privileged" not in argv
    assert _pairs(argv, "--ulimit") == ["memlock=4096", "stack=67108864"]
    assert len(notes) == 2 and "privileged" in notes[0]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
