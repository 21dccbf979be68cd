"""The tiny model and data: built locally, loaded offline, and served from a hub cache the real way.

The round trip runs `U.hf_download_model` / `U.hf_download_dataset` in a fresh interpreter with
`HF_HUB_OFFLINE=1` and `HF_HUB_CACHE` set, because huggingface_hub reads both at import time.
"""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from slime.model.arith_data import read_jsonl, write_dataset
from slime.model.hub_cache import publish_to_hub_cache, repo_folder_name
from slime.model.tiny import build_tiny_model, build_tokenizer, vocabulary

NUM_GPUS = 0

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=0)


def test_loads_with_auto_classes_offline(model_dir, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads) == (2, 64, 4, 2)
    assert cfg.vocab_size == len(vocabulary()) == 17
    assert (model_dir / "model.safetensors").is_file() and (model_dir / "tokenizer.json").is_file()
    ids = tok("3+4=").input_ids
    assert ids == [1, 7, 14, 8, 16]  # <bos> 3 + 4 =
    assert tok.decode([*ids, 11, tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "3+4=7"
    assert tok("12", add_special_tokens=False).input_ids == [5, 6]
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2)
    # transformers 5 loads a qwen2 model's tokenizer as Qwen2Tokenizer (byte-level BPE over our
    # vocabulary); on the task's characters it must give exactly the ids of the tokenizer we built.
    built = build_tokenizer()
    for text in ["0123456789", "+-=", "9-9=0", "18+0="]:
        assert tok(text).input_ids == built(text).input_ids == [1, *(vocabulary()[c] for c in text)]


def test_build_is_deterministic_for_a_seed(model_dir, tmp_path):
    again = build_tiny_model(tmp_path / "again", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    weights = (model_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights


def test_dataset_files(tmp_path):
    out = write_dataset(tmp_path / "data", seed=0)
    train, evaluation = read_jsonl(out / "train.jsonl"), read_jsonl(out / "eval.jsonl")
    assert len(train) == 124 and len(evaluation) == 31
    assert all(set(r) == {"prompt", "label"} and r["prompt"].endswith("=") for r in train + evaluation)
    assert all(len(r["prompt"]) == 4 and 1 <= len(r["label"]) <= 2 for r in train + evaluation)


def test_cache_layout(model_dir, tmp_path):
    cache = tmp_path / "hub"
    snapshot = publish_to_hub_cache(model_dir, "slime-ci/tiny", repo_type="model", cache_dir=cache)
    repo = cache / "models--slime-ci--tiny"
    assert repo_folder_name("slime-ci/tiny", "dataset") == "datasets--slime-ci--tiny"
    assert (repo / "refs" / "main").read_text() == snapshot.name and len(snapshot.name) == 40
    for link in snapshot.iterdir():
        assert link.is_symlink() and not os.path.isabs(os.readlink(link))
        assert link.resolve().parent == repo / "blobs"
        assert link.read_bytes() == (model_dir / link.name).read_bytes()
    # Same files, same revision: publishing again changes nothing.
    assert publish_to_hub_cache(model_dir, "slime-ci/tiny", repo_type="model", cache_dir=cache) == snapshot
    with pytest.raises(ValueError, match="org/name"):
        publish_to_hub_cache(model_dir, "tiny", repo_type="model", cache_dir=cache)


DOWNLOAD = textwrap.dedent("""
    import json, sys
    import slime.utils.external_utils.command_utils as U
    kind, repo = sys.argv[1], sys.argv[2]
    fetch = U.hf_download_model if kind == "model" else U.hf_download_dataset
    print(json.dumps(str(fetch(repo))))
""")


def _download(kind, repo, tmp_path, cache):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "SLIME_CI_MODELS_DIR": str(tmp_path / "models"), "SLIME_CI_DATASETS_DIR": str(tmp_path / "datasets"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", DOWNLOAD, kind, repo], env=env, capture_output=True, text=True,
                          timeout=120)


def test_offline_download_returns_what_was_published(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cache = tmp_path / "hub"
    data = write_dataset(tmp_path / "data", seed=0)
    publish_to_hub_cache(model_dir, "slime-ci/tiny-arith-qwen2", repo_type="model", cache_dir=cache)
    publish_to_hub_cache(data, "slime-ci/tiny-arith", repo_type="dataset", cache_dir=cache)

    got = _download("model", "slime-ci/tiny-arith-qwen2", tmp_path, cache)
    assert got.returncode == 0, got.stderr[-2000:]
    path = Path(json.loads(got.stdout.strip().splitlines()[-1]))
    assert path == tmp_path / "models" / "tiny-arith-qwen2"
    assert sorted(p.name for p in path.iterdir()) == sorted(p.name for p in model_dir.iterdir())
    assert (path / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()
    assert AutoTokenizer.from_pretrained(path)("1+1=").input_ids == [1, 5, 14, 5, 16]
    assert type(AutoModelForCausalLM.from_pretrained(path)).__name__ == "Qwen2ForCausalLM"

    got = _download("dataset", "slime-ci/tiny-arith", tmp_path, cache)
    assert got.returncode == 0, got.stderr[-2000:]
    path = Path(json.loads(got.stdout.strip().splitlines()[-1]))
    assert path == tmp_path / "datasets" / "tiny-arith"
    assert read_jsonl(path / "train.jsonl") == read_jsonl(data / "train.jsonl")

    # Offline, a repository the cache does not hold is an error, not an empty directory.
    missing = _download("model", "slime-ci/not-published", tmp_path, cache)
    assert missing.returncode != 0
    assert "LocalEntryNotFoundError" in missing.stderr or "offline" in missing.stderr.lower()


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
