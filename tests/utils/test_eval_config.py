"""Evaluation config: YAML defaults and overrides, strict keys with suggestions."""

import sys
import textwrap

import pytest

from slime.utils.eval_config import EvalConfigError, EvalDataset, load_eval_config, parse_eval_config

NUM_GPUS = 0


def _write(tmp_path, text):
    p = tmp_path / "eval.yaml"
    p.write_text(textwrap.dedent(text))
    return p


def test_defaults_and_overrides(tmp_path):
    p = _write(tmp_path, """
        defaults:
          temperature: 0.6
          max_response_len: 4096
        datasets:
          - name: aime
            path: /data/aime.jsonl@[0:30]
            n_samples_per_prompt: 16
          - name: gpqa
            path: /data/gpqa.jsonl
            rm_type: gpqa
            temperature: 0.0
    """)
    aime, gpqa = load_eval_config(p)
    assert aime == EvalDataset(name="aime", path="/data/aime.jsonl@[0:30]", n_samples_per_prompt=16,
                               temperature=0.6, max_response_len=4096)
    assert (gpqa.rm_type, gpqa.temperature, gpqa.max_response_len, gpqa.n_samples_per_prompt) == ("gpqa", 0.0, 4096, 1)


def test_typo_gets_a_suggestion():
    with pytest.raises(EvalConfigError, match=r"datasets\[0\]: unknown key 'temprature'; did you mean 'temperature'"):
        parse_eval_config({"datasets": [{"name": "a", "path": "p", "temprature": 1.0}]})


def test_name_and_path_cannot_be_defaults():
    with pytest.raises(EvalConfigError, match="defaults: unknown key 'path'"):
        parse_eval_config({"defaults": {"path": "x"}, "datasets": [{"name": "a"}]})


@pytest.mark.parametrize(
    ("entry", "match"),
    [
        ({"name": "a"}, "'path' is required"),
        ({"path": "p"}, "'name' is required"),
        ({"name": "a", "path": "p", "rm_type": "exact"}, "rm_type 'exact' is unknown"),
        ({"name": "a", "path": "p", "n_samples_per_prompt": 0}, "n_samples_per_prompt"),
        ({"name": "a", "path": "p", "temperature": -1}, "temperature must be >= 0"),
        ({"name": "a", "path": "p", "top_p": 0}, "top_p"),
        ({"name": "a", "path": "p", "max_response_len": 1.5}, "max_response_len"),
    ],
)
def test_invalid_datasets(entry, match):
    with pytest.raises(EvalConfigError, match=match):
        parse_eval_config({"datasets": [entry]})


def test_duplicate_names_collide():
    with pytest.raises(EvalConfigError, match="used twice"):
        parse_eval_config({"datasets": [{"name": "a", "path": "p"}, {"name": "a", "path": "q"}]})


@pytest.mark.parametrize(
    ("data", "match"),
    [([1], "expected a mapping"), ({"datasets": []}, "non-empty list"), ({"dataset": []}, "did you mean 'datasets'"),
     ({"defaults": [1], "datasets": [{"name": "a", "path": "p"}]}, "'defaults' must be a mapping")],
)
def test_bad_top_level(data, match):
    with pytest.raises(EvalConfigError, match=match):
        parse_eval_config(data)


def test_file_errors(tmp_path):
    with pytest.raises(EvalConfigError, match="no such eval config"):
        load_eval_config(tmp_path / "missing.yaml")
    with pytest.raises(EvalConfigError, match="not valid YAML"):
        load_eval_config(_write(tmp_path, "datasets: [\n"))


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q", *sys.argv[1:]]))
