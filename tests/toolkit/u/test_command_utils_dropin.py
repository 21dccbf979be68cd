"""`U` as a drop-in for slime's own helpers: every public name, the same call shapes, the same meaning.

The last test runs an e2e script written the way slime's are (f-string arguments, a
zero-argument hook, `convert_checkpoint(..., dir_dst=...)`, `ExecuteTrainConfig`) through `U`
on a real Ray head on loopback. Its training script is the test's own: a few steps of real
torch least squares, so the test does not move when the framework's trainer does.
"""

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/toolkit: the shared helpers
from _ci import REPO

import slime.utils.external_utils.command_utils as U
from slime.utils.external_utils.ray_head import free_port_block

NUM_GPUS = 0


def test_every_public_name_of_slimes_helpers_is_here():
    names = ["ExecuteTrainConfig", "check_has_nvlink", "convert_checkpoint", "create_run_id",
             "dataclass_cli", "exec_command", "execute_train", "fp8_cast_bf16",
             "get_bool_env_var", "get_default_wandb_args", "get_env_enable_infinite_run",
             "hf_download_dataset", "repo_base_dir", "rsync_simple", "save_to_temp_file",
             "NUM_GPUS_OF_HARDWARE", "GENERATION_HARDWARE"]
    assert [n for n in names if not hasattr(U, n)] == []
    assert U.repo_base_dir == REPO and isinstance(U.repo_base_dir, Path)
    assert {k: U.NUM_GPUS_OF_HARDWARE[k] for k in ("H100", "GB200", "GB300")} == {
        "H100": 8, "GB200": 4, "GB300": 4}
    assert {k: U.GENERATION_HARDWARE[k] for k in ("H100", "GB200", "GB300")} == {
        "H100": "Hopper", "GB200": "Blackwell", "GB300": "Blackwell"}


def test_call_shapes_match_slimes():
    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD]

    assert params(U.convert_checkpoint)[:5] == [
        ("model_name", inspect.Parameter.empty), ("megatron_model_type", inspect.Parameter.empty),
        ("num_gpus_per_node", inspect.Parameter.empty), ("multinode", False), ("extra_args", "")]
    assert [n for n, _ in params(U.convert_checkpoint)][5:] == ["dir_dst", "hf_checkpoint"]
    assert [n for n, _ in params(U.execute_train)] == [
        "train_args", "num_gpus_per_node", "megatron_model_type", "train_script",
        "before_ray_job_submit", "extra_env_vars", "config"]
    assert params(U.get_default_wandb_args) == [
        ("test_file", inspect.Parameter.empty), ("run_name_prefix", None), ("run_id", None)]
    assert params(U.get_bool_env_var) == [("name", inspect.Parameter.empty), ("default", "false")]
    assert params(U.exec_command) == [("cmd", inspect.Parameter.empty), ("capture_output", False)]


def test_execute_train_config_reads_slurm_and_parses_env_text(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_NUM_NODES", "3")
    assert U.ExecuteTrainConfig().num_nodes == 3
    monkeypatch.delenv("SLURM_JOB_NUM_NODES")
    cfg = U.ExecuteTrainConfig(True, extra_env_vars="A=1 B=x=y")  # positional, as scripts may
    assert (cfg.cuda_core_dump, cfg.num_nodes) == (True, 1)

    @dataclasses.dataclass
    class ScriptConfig(U.ExecuteTrainConfig):  # scripts extend it with their own fields
        mode: str = "normal"

    assert ScriptConfig(mode="x").num_nodes == 1
    assert U.parse_extra_env_vars(cfg.extra_env_vars) == {"A": "1", "B": "x=y"}
    assert U.parse_extra_env_vars('{"A": 1, "B": "two"}') == {"A": "1", "B": "two"}
    assert U.parse_extra_env_vars("  ") == {}
    with pytest.raises(ValueError, match="write NAME=value"):
        U.parse_extra_env_vars("A=1 lonely")
    with pytest.raises(ValueError, match="not valid JSON"):
        U.parse_extra_env_vars('{"A": ')
    flags, env, dump = U._config_parts(cfg)
    assert (flags, env, dump) == ([], {"A": "1", "B": "x=y"}, True)
    assert U._config_parts({"lr": 0.1, "ci_test": True, "off": False}) == (
        ["--lr", "0.1", "--ci-test"], {}, False)
    with pytest.raises(TypeError, match="ExecuteTrainConfig or a mapping"):
        U._config_parts(["--lr", "1"])


def test_hooks_of_either_shape_are_adapted_and_others_refused():
    calls = []
    U._hook_caller(lambda: calls.append("zero"))("HEAD")
    U._hook_caller(calls.append)("HEAD")  # ours: the head
    U._hook_caller(lambda head=None: calls.append(("default", head)))("HEAD")
    assert calls == ["zero", "HEAD", ("default", "HEAD")]
    assert U._hook_caller(None) is None
    with pytest.raises(TypeError, match=r"\(a, b\): take no argument"):
        U._hook_caller(lambda a, b: None)
    with pytest.raises(TypeError, match="must be callable"):
        U._hook_caller("not a function")


def test_a_bad_hook_fails_before_any_head_starts(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path), "SLIME_CI_PORT_BASE": str(free_port_block())}
    with pytest.raises(TypeError, match="take no argument"):
        U.execute_train("--x 1", 0, None, train_script=str(tmp_path / "t.py"),
                        before_ray_job_submit=lambda a, b: None, env=env)
    assert list(tmp_path.iterdir()) == []  # no Ray temp dir: nothing was started


def test_small_helpers(tmp_path, monkeypatch, capsys):
    assert re.fullmatch(r"\d{6}-\d{6}-\d{3}", U.create_run_id())
    assert U.get_env_enable_infinite_run({"SLIME_TEST_ENABLE_INFINITE_RUN": "true"}) is True
    assert U.get_env_enable_infinite_run({}) is False
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = U.save_to_temp_file("a: 1\n", "yaml")
    assert path.endswith(".yaml") and Path(path).parent == tmp_path
    assert Path(path).read_text() == "a: 1\n"
    assert U.save_to_temp_file("x", "yaml") != path
    assert isinstance(U.check_has_nvlink(), bool)
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("A")
    (src / "sub" / "b.txt").write_text("B")
    (src / "link").symlink_to("a.txt")
    dst = tmp_path / "deep" / "dst"
    U.rsync_simple(str(src), str(dst))
    U.rsync_simple(str(src), str(dst))  # again: contents merged, no error
    assert (dst / "a.txt").read_text() == "A" and (dst / "sub" / "b.txt").read_text() == "B"
    assert (dst / "link").is_symlink() and not (dst / "src").exists()
    with pytest.raises(FileNotFoundError, match="not a directory"):
        U.rsync_simple(str(tmp_path / "absent"), str(dst))


CAST = textwrap.dedent("""
    import argparse, pathlib
    p = argparse.ArgumentParser()
    p.add_argument("--input-fp8-hf-path"); p.add_argument("--output-bf16-hf-path")
    a = p.parse_args()
    out = pathlib.Path(a.output_bf16_hf_path); out.mkdir(parents=True)
    (out / "from.txt").write_text(a.input_fp8_hf_path)
""")


def test_fp8_cast_bf16_runs_the_tool_once(tmp_path, capsys):
    tool = tmp_path / "cast.py"
    tool.write_text(CAST)
    dst = tmp_path / "bf16"
    assert U.fp8_cast_bf16(str(tmp_path / "fp8"), str(dst), script=str(tool)) == dst
    assert (dst / "from.txt").read_text() == str(tmp_path / "fp8")
    (dst / "from.txt").unlink()
    U.fp8_cast_bf16(str(tmp_path / "fp8"), str(dst), script=str(tool))
    assert "skipped" in capsys.readouterr().out and not (dst / "from.txt").exists()


CONVERTER = textwrap.dedent("""
    import argparse, json, os, pathlib
    p = argparse.ArgumentParser()
    p.add_argument("--model-type"); p.add_argument("--hf-checkpoint"); p.add_argument("--save")
    p.add_argument("--note")
    a = p.parse_args()
    out = pathlib.Path(a.save); out.mkdir(parents=True, exist_ok=True)
    (out / "meta.json").write_text(json.dumps({"type": a.model_type, "hf": a.hf_checkpoint,
                                               "note": a.note, "world": os.environ["WORLD_SIZE"]}))
    (out / "latest_checkpointed_iteration.txt").write_text("release")
""")


def test_convert_checkpoint_with_slimes_keywords(tmp_path):
    script = tmp_path / "convert.py"
    script.write_text(CONVERTER)
    env = {**os.environ, "SLIME_CI_MODELS_DIR": str(tmp_path / "models")}
    target = U.convert_checkpoint(model_name="M", megatron_model_type="tiny", num_gpus_per_node=1,
                                  extra_args="--note  'two words' ", dir_dst=str(tmp_path / "dst"),
                                  hf_checkpoint=str(tmp_path / "hf"), script=str(script), env=env)
    assert target == tmp_path / "dst" / "M_torch_dist"
    import json

    meta = json.loads((target / "meta.json").read_text())
    assert meta == {"type": "tiny", "hf": str(tmp_path / "hf"), "note": "two words", "world": "1"}
    with pytest.raises(ValueError, match="not both"):
        U.convert_checkpoint("M", "tiny", 1, dir_dst="/a", save_dir="/b", env=env)


def test_model_args_come_from_slimes_model_scripts_when_the_repository_has_them(tmp_path):
    models = tmp_path / "scripts" / "models"
    models.mkdir(parents=True)
    (models / "qwen-tiny.sh").write_text(textwrap.dedent("""
        NLAYERS="${NLAYERS:-2}"
        MODEL_ARGS=(
           --swiglu
           --num-layers ${NLAYERS}
           --normalization "RMS Norm"
        )
    """))
    (models / "broken.sh").write_text("exit 3\n")
    assert U.model_args("qwen-tiny", root=tmp_path, env={"NLAYERS": "4", "PATH": os.environ["PATH"]}) == [
        "--swiglu", "--num-layers", "4", "--normalization", "RMS Norm"]
    assert U.model_args("no-such-type", root=tmp_path) == ["--model-type", "no-such-type"]
    assert U.model_args("tiny-gpt") == ["--model-type", "tiny-gpt"]  # this repository: a preset
    with pytest.raises(U.CommandFailed, match=r"broken\.sh"):
        U.model_args("broken", root=tmp_path)


def test_multinode_conversion_reads_slurm():
    env = {"SLURM_JOB_HOSTNAMES": "node-a\nnode-b\n", "SLURM_NODEID": "1"}
    assert U._multinode_args(env) == ["--master-addr", "node-a", "--master-port", "23456",
                                      "--nnodes", "2", "--node-rank", "1"]
    with pytest.raises(ValueError, match="SLURM_JOB_HOSTNAMES"):
        U._multinode_args({})


def test_dataclass_cli_builds_the_dataclass_from_options_and_env(monkeypatch, capsys):
    @dataclasses.dataclass
    class Args:
        name: str
        count: int = 1
        fast: bool = False

    seen = []

    @U.dataclass_cli
    def main(args: Args):
        seen.append(args)
        return args.count

    assert list(inspect.signature(main).parameters) == ["name", "count", "fast"]
    assert main(name="a") == 1
    monkeypatch.setenv("SLIME_SCRIPT_COUNT", "4")
    monkeypatch.setenv("SLIME_SCRIPT_FAST", "true")
    assert main(name="b") == 4 and seen[-1] == Args(name="b", count=4, fast=True)
    assert main(name="c", count=2) == 2  # an option beats the environment
    assert "Args(name='a', count=1, fast=False)" in capsys.readouterr().out
    with pytest.raises(TypeError, match="unknown option"):
        main(name="d", colour="red")
    with pytest.raises(TypeError, match="annotated with a dataclass"):
        U.dataclass_cli(lambda x: x)


# A trainer of the test's own: least squares with real torch, a few steps; it proves what the
# job saw (hook ran first, env from ExecuteTrainConfig, argv from the f-string) in a report.
TRAINER = textwrap.dedent("""
    import argparse, json, os, pathlib, torch
    p = argparse.ArgumentParser()
    p.add_argument("--model-type", required=True)
    p.add_argument("--load", required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--lr", type=float, required=True)
    p.add_argument("--save-pattern", required=True)
    p.add_argument("--report", required=True)
    p.add_argument("--ci-test", action="store_true")
    a = p.parse_args()
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
    w = torch.zeros(4, requires_grad=True)
    losses = []
    for _ in range(a.steps):
        loss = ((x @ w - y) ** 2).mean()
        loss.backward()
        with torch.no_grad():
            w -= a.lr * w.grad
            w.grad = None
        losses.append(loss.item())
    if a.ci_test:
        assert losses[-1] < 0.1 * losses[0], losses
    pathlib.Path(a.report).write_text(json.dumps({
        "model_type": a.model_type, "load_meta": json.loads((pathlib.Path(a.load) / "meta.json").read_text()),
        "losses": losses, "save_pattern": a.save_pattern,
        "hook": pathlib.Path(os.environ["HOOK_MARKER"]).read_text(),
        "mode": os.environ.get("TRAIN_MODE"), "cuda_coredump": os.environ.get("CUDA_ENABLE_COREDUMP_ON_EXCEPTION")}))
""")

# Written exactly as slime's e2e scripts are: module constants, prepare/execute, f-string
# arguments, `dir_dst=`, a zero-argument hook, an ExecuteTrainConfig, proxies dropped in __main__.
ORIGINAL_STYLE = textwrap.dedent('''
    import os

    import slime.utils.external_utils.command_utils as U

    MODEL_NAME = "Tiny-LS"
    MODEL_TYPE = "tiny-ls"
    NUM_GPUS = 1
    OUT = os.environ["SCRIPT_OUT"]


    def prepare():
        U.exec_command(f"mkdir -p {OUT}/models/{MODEL_NAME}")
        U.convert_checkpoint(
            model_name=MODEL_NAME,
            megatron_model_type=MODEL_TYPE,
            num_gpus_per_node=NUM_GPUS,
            dir_dst=OUT,
            hf_checkpoint=f"{OUT}/models/{MODEL_NAME}",
            extra_args="--note converted",
        )


    def launch_side_service():
        with open(os.environ["HOOK_MARKER"], "w") as f:
            f.write("hook ran before submit")


    def execute():
        ckpt_args = f"--load {OUT}/{MODEL_NAME}_torch_dist "
        train_args = (
            f"{ckpt_args} "
            "--steps 40 "
            "--lr 0.1 "
            f"--save-pattern {OUT}/rollout_{{rollout_id}}.pt "
            f"--report {OUT}/report.json "
            "--ci-test "
            f"{U.get_default_wandb_args(__file__)}"
        )
        U.execute_train(
            train_args=train_args,
            num_gpus_per_node=NUM_GPUS,
            megatron_model_type=MODEL_TYPE,
            train_script=os.environ["TRAIN_SCRIPT"],
            before_ray_job_submit=launch_side_service,
            config=U.ExecuteTrainConfig(extra_env_vars="TRAIN_MODE=orig", cuda_core_dump=True),
        )


    if __name__ == "__main__":
        prepare()
        for proxy_var in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY"):
            os.environ.pop(proxy_var, None)
        execute()
''')


@pytest.mark.timeout(600)
def test_an_e2e_script_in_slimes_style_runs_through_u(tmp_path):
    import json

    work = tmp_path / "checkout"
    (work / "tools").mkdir(parents=True)
    # Where slime's scripts find it: relative to the directory they run in.
    (work / "tools" / "convert_hf_to_torch_dist.py").write_text(CONVERTER)
    (work / "trainer.py").write_text(TRAINER)
    script = work / "test_tiny_ls_style.py"
    script.write_text(ORIGINAL_STYLE)
    out = tmp_path / "out"
    out.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCRIPT_OUT": str(out),
           "TRAIN_SCRIPT": str(work / "trainer.py"), "HOOK_MARKER": str(out / "hook.txt"),
           "SLIME_CI_PORT_BASE": str(free_port_block()), "SLIME_CI_OUTPUT_DIR": str(out),
           "SLIME_CI_DEVICE": "cpu", "TMPDIR": str(tmp_path), "http_proxy": "http://127.0.0.1:9"}
    env.pop("WANDB_API_KEY", None)
    before = {p.pid for p in psutil.process_iter()}
    proc = subprocess.run([sys.executable, str(script)], cwd=work, env=env, capture_output=True,
                          text=True, timeout=540, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["model_type"] == "tiny-ls"
    assert report["load_meta"] == {"type": "tiny-ls", "hf": f"{out}/models/Tiny-LS",
                                   "note": "converted", "world": "1"}
    assert report["save_pattern"] == f"{out}/rollout_{{rollout_id}}.pt"  # the f-string's {{ }}
    assert report["hook"] == "hook ran before submit"
    assert report["mode"] == "orig" and report["cuda_coredump"] == "1"
    assert report["losses"][-1] < 0.1 * report["losses"][0]
    assert "wandb off" in proc.stdout
    # The private head is gone with the script: nothing it started is left.
    left = [p for p in psutil.process_iter(["pid", "cmdline"]) if p.pid not in before
            and any("ray" in part for part in (p.info["cmdline"] or [])[:3])
            and str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert left == []


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
