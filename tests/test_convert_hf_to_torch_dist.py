"""HF directory -> the trainer's DCP checkpoint (torchrun, 2 gloo ranks via `U.convert_checkpoint`) -> HF: exact.

Real processes: torchrun launches the converter on two CPU ranks that each write
their own shards; the reverse runs on one rank, so DCP reshards on the way back.
"""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import slime.utils.external_utils.command_utils as U
from slime.backends.fsdp import checkpoint as ck

NUM_GPUS = 0
ROOT = Path(__file__).resolve().parents[1]
TOOL = ROOT / "tools" / "convert_hf_to_torch_dist.py"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _weights(directory):
    out = {}
    for f in sorted(Path(directory).glob("*.safetensors")):
        out.update(load_file(f))
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from _tiny_qwen import tiny_qwen2

    base = tmp_path_factory.mktemp("convert")
    hf = base / "hf"
    # bf16 on disk: the round trip must not cast anything.
    tiny_qwen2(seed=3).to(torch.bfloat16).save_pretrained(hf, safe_serialization=True)
    (hf / "tokenizer.json").write_text('{"version": "1.0", "model": {"type": "WordLevel"}}')
    env = {"PET_MASTER_PORT": str(_free_port()), "PET_MASTER_ADDR": "127.0.0.1",
           "SLIME_CI_MODELS_DIR": str(base)}
    target = U.convert_checkpoint("tiny", "qwen2-tiny", 2, hf_dir=hf, save_dir=base / "dist", env=env)
    back = base / "back"
    subprocess.run([sys.executable, str(TOOL), "--reverse", "--load", str(target), "--hf-checkpoint", str(hf),
                    "--save", str(back)], check=True, timeout=300, env={"PATH": "/usr/bin:/bin"})
    return hf, target, back, env


def test_every_rank_wrote_its_shards_and_the_marker_last(converted):
    _, target, _, _ = converted
    step0 = ck.step_dir(target, 0)
    names = {p.name for p in step0.iterdir()}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "converted.json"} <= names
    assert ck.latest_step(target) == 0
    meta = json.loads((step0 / "converted.json").read_text())
    assert (meta["model_type"], meta["ranks"]) == ("qwen2-tiny", 2)


def test_round_trip_is_exact(converted):
    hf, _, back, _ = converted
    a, b = _weights(hf), _weights(back)
    assert a.keys() == b.keys() and len(a) > 10
    for k in a:
        assert a[k].dtype == b[k].dtype == torch.bfloat16, k
        assert torch.equal(a[k], b[k]), k
    assert (back / "tokenizer.json").read_text() == (hf / "tokenizer.json").read_text()
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (hf, back))
    assert {k: v for k, v in ca.items() if k != "transformers_version"} == \
        {k: v for k, v in cb.items() if k != "transformers_version"}


def test_conversion_is_skipped_once_done(converted, capfd):
    hf, target, _, env = converted
    assert U.convert_checkpoint("tiny", "qwen2-tiny", 2, hf_dir=hf, save_dir=target, env=env) == target
    assert "conversion skipped" in capfd.readouterr().out


def _tool():
    import importlib.util

    spec = importlib.util.spec_from_file_location("convert_tool", TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reverse_of_an_empty_root_or_step_is_one_line(tmp_path, converted):
    hf, target, _, _ = converted
    tool = _tool()
    with pytest.raises(SystemExit, match=r"^error: .*none holds no complete checkpoint; convert or train"):
        tool.main(["--reverse", "--load", str(tmp_path / "none"), "--hf-checkpoint", str(hf), "--save", "o"])
    with pytest.raises(SystemExit, match=r"^error: step 5 has no complete checkpoint .* complete steps: "
                       r"iter_0000000$"):
        tool.main(["--reverse", "--load", str(target), "--ckpt-step", "5", "--hf-checkpoint", str(hf),
                   "--save", "o"])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", *sys.argv[1:]]))
