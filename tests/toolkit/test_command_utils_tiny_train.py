"""The tiny trainer behind the GPU tier's smoke entry: data, loss check, DDP ranks, checkpoints."""

import itertools
import json
import math
import os
import subprocess
import sys

import pytest
import torch
from _ci import REPO

from slime.tiny_train import (
    MODEL_PRESETS,
    TinyLM,
    choose_device,
    loss_fell,
    main,
    make_sequences,
    read_dataset,
    write_dataset,
)

NUM_GPUS = 0
CFG = MODEL_PRESETS["tiny-gpt"]


def test_sequences_follow_the_rule_and_round_trip(tmp_path):
    seqs = make_sequences(8, CFG, seed=3)
    assert len(seqs) == 8 and all(len(s) == CFG.seq_len for s in seqs)
    assert all(b == (5 * a + 3) % CFG.vocab_size for s in seqs for a, b in itertools.pairwise(s))
    path = write_dataset(tmp_path / "d.jsonl", 8, "tiny-gpt", seed=3)
    assert read_dataset(path, CFG).tolist() == seqs
    (tmp_path / "bad.jsonl").write_text(json.dumps({"tokens": [1, 2, 3]}) + "\n")
    with pytest.raises(SystemExit, match="length"):
        read_dataset(tmp_path / "bad.jsonl", CFG)


def test_loss_fell():
    assert loss_fell([4.0, 3.9, 3.8, 3.0, 2.0, 1.5, 1.2])
    assert not loss_fell([4.0, 3.9, 3.8, 3.7, 3.6, 3.5])  # falling, but not by 30 %
    assert not loss_fell([4.0, 3.0, 2.0, 1.0, math.nan, 0.5])
    assert not loss_fell([4.0, 1.0])  # too few steps to say


def test_device_choice_is_strict():
    assert choose_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit, match="no CUDA"):
            choose_device("cuda")
        assert choose_device(None) == "cpu"


def test_training_lowers_loss_saves_and_resumes(tmp_path, capsys):
    data = write_dataset(tmp_path / "d.jsonl", 128, "tiny-gpt")
    common = ["--data", str(data), "--device", "cpu", "--world-size", "1"]
    assert main([*common, "--steps", "15", "--save", str(tmp_path / "ck"),
                 "--metrics", str(tmp_path / "m.json"), "--ci-test"]) == 0
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["device"] == "cpu" and metrics["world_size"] == 1 and metrics["loss_fell"]
    # A fresh model starts near ln(vocab): the first loss measures the start, not luck.
    assert abs(metrics["losses"][0] - math.log(CFG.vocab_size)) < 0.3
    from safetensors.torch import load_file

    model = TinyLM(CFG)
    model.load_state_dict(load_file(str(tmp_path / "ck" / "model.safetensors")))
    assert main([*common, "--steps", "6", "--load", str(tmp_path / "ck"),
                 "--metrics", str(tmp_path / "m2.json")]) == 0
    resumed = json.loads((tmp_path / "m2.json").read_text())["losses"]
    assert resumed[0] < metrics["losses"][0] - 0.5  # it starts from the trained weights
    assert "final loss" in capsys.readouterr().out


def test_ci_test_fails_when_the_loss_does_not_fall(tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", 32, "tiny-gpt")
    with pytest.raises(SystemExit, match="did not fall"):
        main(["--data", str(data), "--device", "cpu", "--world-size", "1", "--steps", "8",
              "--lr", "0", "--ci-test"])


def test_two_ranks_train_with_ddp_on_the_cpu(tmp_path):
    data = write_dataset(tmp_path / "d.jsonl", 128, "tiny-gpt")
    env = {**os.environ, "NUM_GPUS": "2", "SLIME_CI_DEVICE": "cpu", "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(REPO / "slime" / "tiny_train.py"), "--data", str(data), "--steps", "15",
         "--metrics", str(tmp_path / "m.json"), "--ci-test"],
        env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["world_size"] == 2 and metrics["device"] == "cpu" and metrics["loss_fell"]


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
