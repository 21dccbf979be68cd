"""`U` helpers without a Ray head: commands, environment, ports, downloads, conversion, wandb."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

import slime.utils.external_utils.command_utils as U
from slime.utils.external_utils.ray_head import (
    PORT_BLOCK_SIZE,
    RayPorts,
    free_port_block,
    ports_from_env,
    private_head,
    ray_start_argv,
)

NUM_GPUS = 0


def test_get_bool_env_var(capsys):
    # slime's meaning: true/1 are true; anything else is false, an unknown word warned once.
    assert U.get_bool_env_var("X", env={"X": "1"}) is True
    assert U.get_bool_env_var("X", env={"X": " TRUE "}) is True
    assert U.get_bool_env_var("X", env={"X": "false"}) is False
    assert U.get_bool_env_var("X", env={"X": ""}) is False
    assert U.get_bool_env_var("X", env={}) is False
    assert U.get_bool_env_var("X", True, env={}) is True  # a bool default still works
    assert U.get_bool_env_var("X", "1", env={}) is True  # slime's string default
    assert capsys.readouterr().err == ""
    assert U.get_bool_env_var("X_WORD", env={"X_WORD": "maybe"}) is False
    assert U.get_bool_env_var("X_WORD", env={"X_WORD": "maybe"}) is False
    err = capsys.readouterr().err
    assert err.count("X_WORD='maybe'") == 1 and "counted as false" in err


def test_device_and_dirs_follow_the_runner_env(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a bare run's outputs go
    assert U.device({"SLIME_CI_DEVICE": "cpu"}) == "cpu"
    assert U.device({"SLIME_CI_DEVICE": "CUDA"}) == "cuda"
    with pytest.raises(ValueError, match="SLIME_CI_DEVICE"):
        U.device({"SLIME_CI_DEVICE": "tpu"})
    out = tmp_path / "entry-out"
    assert U.output_dir({"SLIME_CI_OUTPUT_DIR": str(out)}) == out and out.is_dir()
    bare = U.output_dir({})
    assert bare.is_dir() and bare.parent == tmp_path and str(os.getpid()) in bare.name
    assert U.models_dir({}) == Path("/root/models")
    assert U.datasets_dir({"SLIME_CI_DATASETS_DIR": "/d"}) == Path("/d")
    assert U.NUM_GPUS_OF_HARDWARE["H100"] == 8 and U.NUM_GPUS_OF_HARDWARE["GB200"] == 4


def test_exec_command_echoes_captures_and_keeps_arguments(capsys):
    out = U.exec_command(["printf", "%s|", "a b", "c"], capture_output=True)
    assert out == "a b|c|"
    assert "+ printf '%s|' 'a b' c" in capsys.readouterr().out
    assert U.exec_command("echo $((6 * 7))", capture_output=True).strip() == "42"


def test_exec_command_raises_with_code_and_tail():
    with pytest.raises(U.CommandFailed) as info:
        U.exec_command("echo first; echo boom >&2; exit 3", capture_output=True)
    assert info.value.returncode == 3
    assert "boom" in info.value.output_tail and "exited with 3" in str(info.value)


def test_exec_command_timeout_kills_the_whole_group(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    start = time.monotonic()
    with pytest.raises(U.CommandFailed, match="timed out"):
        U.exec_command(f"sleep 60 & echo $! > {pidfile}; wait", capture_output=True, timeout=2)
    assert time.monotonic() - start < 30
    pid = int(pidfile.read_text())
    deadline = time.monotonic() + 10
    while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, f"grandchild {pid} survived the timeout"
        time.sleep(0.1)


def test_nvlink_detection_reads_topology():
    topo = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    assert U.nvlink_present(topo)
    assert not U.nvlink_present("\tGPU0\tGPU1\nGPU0\t X \tPHB\nGPU1\tPHB\t X \n")


def test_train_env_vars_is_a_dict_with_the_runner_values():
    env = {"PYTHONPATH": "/extra", "no_proxy": "corp.example", "SLIME_CI_DEVICE": "cpu",
           "SLIME_CI_OUTPUT_DIR": "/o", "CUDA_VISIBLE_DEVICES": "", "UNRELATED": "x"}
    out = U.train_env_vars(env=env, nvlink=True, master_addr="10.0.0.5", master_port=29001,
                           extra={"EXTRA": "1"})
    assert out["PYTHONPATH"].split(os.pathsep) == [str(REPO), "/extra"]
    assert out["CUDA_DEVICE_MAX_CONNECTIONS"] == "1" and out["NCCL_NVLS_ENABLE"] == "1"
    assert out["no_proxy"].split(",") == ["corp.example", "127.0.0.1", "localhost", "10.0.0.5"]
    assert out["MASTER_ADDR"] == "10.0.0.5" and out["MASTER_PORT"] == "29001"
    assert out["SLIME_CI_DEVICE"] == "cpu" and out["CUDA_VISIBLE_DEVICES"] == ""
    assert out["EXTRA"] == "1" and "UNRELATED" not in out
    assert json.loads(json.dumps(out)) == out  # plain strings: a runtime env as a dict


def test_ports_come_from_the_reserved_block():
    ports = ports_from_env({"SLIME_CI_PORT_BASE": "21000"})
    assert ports == RayPorts.from_base(21000)
    named = [ports.gcs, ports.dashboard, ports.client_server, ports.node_manager,
             ports.object_manager, ports.dashboard_agent_listen, ports.dashboard_agent_grpc,
             ports.metrics_export, ports.runtime_env_agent, ports.master]
    assert len(set(named)) == len(named)
    assert all(21000 <= p < ports.min_worker for p in named)
    assert ports.max_worker == 21000 + PORT_BLOCK_SIZE - 1
    with pytest.raises(ValueError, match="not a port"):
        ports_from_env({"SLIME_CI_PORT_BASE": "abc"})
    with pytest.raises(ValueError, match="outside"):
        RayPorts.from_base(65500)


def test_free_port_block_is_free_and_used_when_unset():
    base = free_port_block(20)
    import socket

    for port in (base, base + 19):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
    assert 20000 <= ports_from_env({}).base < 32000


def test_a_busy_port_block_is_refused_before_anything_starts(tmp_path):
    import socket

    base = free_port_block()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        with pytest.raises(RuntimeError, match=f"ports {base + 1} of block {base}"), \
                private_head(num_gpus=0, env={"TMPDIR": str(tmp_path)}, ports=RayPorts.from_base(base),
                             busy_wait=0.5):
            pytest.fail("the head must not start on a taken block")
    assert list(tmp_path.iterdir()) == []  # not even a temp dir was made


def test_a_block_freed_while_waiting_counts_as_free():
    # The previous entry's head on these GPUs may close its last sockets a moment late.
    import socket
    import threading

    from slime.utils.external_utils.ray_head import _busy_ports

    base = free_port_block()
    taken = socket.socket()
    taken.bind(("127.0.0.1", base + 3))
    taken.listen()
    assert _busy_ports(RayPorts.from_base(base), wait=0) == [base + 3]
    closer = threading.Timer(1.0, taken.close)
    closer.start()
    try:
        assert _busy_ports(RayPorts.from_base(base), wait=20) == []
    finally:
        closer.cancel()
        taken.close()


def test_external_cluster_address_is_used_as_is():
    assert U._external_address({}) is None
    assert U._external_address({"SLIME_SCRIPT_EXTERNAL_RAY": "0"}) is None
    assert U._external_address({"SLIME_SCRIPT_EXTERNAL_RAY": "1"}) == "http://127.0.0.1:8265"
    assert U._external_address({"SLIME_SCRIPT_EXTERNAL_RAY": "10.1.2.3:8265"}) == "http://10.1.2.3:8265"
    assert U._external_address({"SLIME_SCRIPT_EXTERNAL_RAY": "https://ray.internal"}) == "https://ray.internal"


def test_ray_start_argv_uses_every_port_and_own_temp_dir():
    ports = RayPorts.from_base(22000)
    argv = ray_start_argv("ray", ports=ports, temp_dir="/tmp/ray-x", num_gpus=2)
    flags = dict(zip(argv[4::2], argv[5::2], strict=False))
    assert argv[:4] == ("ray", "start", "--head", "--block")
    assert flags["--port"] == "22000" and flags["--dashboard-port"] == "22001"
    assert flags["--node-ip-address"] == "127.0.0.2" and flags["--temp-dir"] == "/tmp/ray-x"
    assert flags["--min-worker-port"] == str(ports.min_worker)
    assert flags["--num-gpus"] == "2"
    assert "--disable-usage-stats" in argv


def test_wandb_args_only_with_a_key(capsys):
    assert U.get_default_wandb_args("tests/e2e/test_rl_grpo_colocated.py", env={}) == ""
    assert "WANDB_API_KEY is not set" in capsys.readouterr().out
    args = U.get_default_wandb_args("tests/e2e/test_rl_grpo_colocated.py", "ci", env={
        "WANDB_API_KEY": "secret", "GITHUB_COMMIT_NAME": "abc123"})
    assert args.endswith(" ")
    words = args.split()
    assert words[:3] == ["--use-wandb", "--wandb-project", "slime-test_rl_grpo_colocated"]
    group = words[words.index("--wandb-group") + 1]
    assert group.startswith("ci_") and group.endswith("_abc123")
    # As the original: the key is passed as a flag (quoted, so a shell does not expand it).
    assert words[words.index("--wandb-key") + 1] == "secret"
    assert words[-1] == "--disable-wandb-random-suffix"


def _fake_hub(cache: Path, repo_type: str, repo_id: str, files: dict[str, str]) -> None:
    # The layout huggingface_hub writes: blobs, a snapshot of symlinks, refs/main -> commit.
    folder = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True)
    (folder / "refs" / "main").write_text(commit)
    for i, (name, text) in enumerate(files.items()):
        blob = folder / "blobs" / f"blob{i}"
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_text(text)
        link = folder / "snapshots" / commit / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(blob, link.parent))


DOWNLOAD = textwrap.dedent("""
    import sys
    import slime.utils.external_utils.command_utils as U
    kind, name = sys.argv[1], sys.argv[2]
    fn = U.hf_download_dataset if kind == "dataset" else U.hf_download_model
    print(fn(name))
""")


def _download(tmp_path: Path, kind: str, name: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub"),
           "HF_HOME": str(tmp_path / "hf-home"), "SLIME_CI_DATASETS_DIR": str(tmp_path / "datasets"),
           "SLIME_CI_MODELS_DIR": str(tmp_path / "models"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    return subprocess.run([sys.executable, "-c", DOWNLOAD, kind, name], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)


def test_downloads_work_offline_from_a_local_hub_cache(tmp_path):
    _fake_hub(tmp_path / "hub", "dataset", "org/tiny-data",
              {"train.jsonl": '{"tokens": [1, 2]}\n', "sub/dev.jsonl": "{}\n"})
    _fake_hub(tmp_path / "hub", "model", "org/tiny-model", {"config.json": '{"d": 4}'})
    first = _download(tmp_path, "dataset", "org/tiny-data")
    assert first.returncode == 0, first.stderr
    target = tmp_path / "datasets" / "tiny-data"
    assert Path(first.stdout.strip().splitlines()[-1]) == target
    assert (target / "train.jsonl").read_text() == '{"tokens": [1, 2]}\n'
    assert (target / "sub" / "dev.jsonl").is_file() and not (target / "train.jsonl").is_symlink()
    again = _download(tmp_path, "dataset", "org/tiny-data")  # already there: served as is
    assert again.returncode == 0, again.stderr
    model = _download(tmp_path, "model", "org/tiny-model")
    assert model.returncode == 0, model.stderr
    assert json.loads((tmp_path / "models" / "tiny-model" / "config.json").read_text()) == {"d": 4}
    missing = _download(tmp_path, "dataset", "org/absent")
    assert missing.returncode != 0 and "LocalEntryNotFoundError" in missing.stderr


CONVERTER = textwrap.dedent("""
    import argparse, os, pathlib
    p = argparse.ArgumentParser()
    p.add_argument("--model-type"); p.add_argument("--hf-checkpoint"); p.add_argument("--save")
    a = p.parse_args()
    out = pathlib.Path(a.save); out.mkdir(parents=True, exist_ok=True)
    (out / "rank0.txt").write_text(f"{a.model_type} {a.hf_checkpoint} {os.environ['WORLD_SIZE']}")
    (out / "latest_checkpointed_iteration.txt").write_text("release")
""")


def test_convert_checkpoint_runs_torchrun_then_skips(tmp_path, capsys):
    script = tmp_path / "convert.py"
    script.write_text(CONVERTER)
    env = {**os.environ, "SLIME_CI_MODELS_DIR": str(tmp_path / "models")}
    target = U.convert_checkpoint("Tiny-1B", "tiny-gpt", 1, script=str(script), env=env)
    # Beside the models dir, as slime's /root/<name>_torch_dist is beside /root/models.
    assert target == tmp_path / "Tiny-1B_torch_dist"
    assert (target / "rank0.txt").read_text() == f"tiny-gpt {tmp_path / 'models' / 'Tiny-1B'} 1"
    (target / "rank0.txt").unlink()
    assert U.convert_checkpoint("Tiny-1B", "tiny-gpt", 1, script=str(script), env=env) == target
    assert "conversion skipped" in capsys.readouterr().out
    assert not (target / "rank0.txt").exists()  # skipped: the converter did not run again


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
