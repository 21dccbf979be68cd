"""The tiny model and data set the training path runs on, built locally and served as a real model is.

Everything here is offline and deterministic for a seed:

- `slime.model.tiny.build_tiny_model(out_dir, *, seed=0, ...) -> Path` writes a Hugging Face
  model directory: a character-level tokenizer (built with `tokenizers`, saved as a
  `PreTrainedTokenizerFast`: `tokenizer.json`, `tokenizer_config.json`) and a 2-layer
  `Qwen2ForCausalLM` (`config.json`, `model.safetensors`, untied embeddings). Both load with
  `AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained`. Vocabulary:
  `<pad>`=0, `<bos>`=1, `<eos>`=2, `<unk>`=3, then `0`..`9`, `+`, `-`, `=`. The tokenizer
  prepends `<bos>`; `decode(..., skip_special_tokens=True)` gives the bare characters.
- `slime.model.arith_data`: the verifiable task, one-digit `a+b=` and `a-b=` (a >= b);
  `make_records(seed)` / `write_dataset(out_dir, *, seed=0, eval_fraction=0.2)` write
  `train.jsonl` and `eval.jsonl` with `{"prompt": "3+4=", "label": "7"}` records. The reward
  is `slime.rollout.rm_hub.grade("arith", response_text, label)`: 1.0 when the response text
  equals the label exactly, else 0.0.
- `slime.model.warmup.warm_up(model_dir, data, *, steps, seed, ...)` trains the answer tokens
  (+ `<eos>`) with cross entropy for a few CPU steps and saves the model in place, so that the
  policy's reward starts strictly between 0 and 1; `measure_reward(...)` samples and grades.
- `slime.model.hub_cache.publish_to_hub_cache(src_dir, repo_id, *, repo_type, cache_dir)`
  lays a directory out as the Hugging Face hub cache does
  (`models--org--name/{blobs,snapshots/<rev>,refs/main}`, `datasets--org--name/…`), so that
  `U.hf_download_model` / `U.hf_download_dataset` with `HF_HUB_OFFLINE=1` and `HF_HUB_CACHE`
  pointing there return it, the path a real model takes.
- `slime.model.prepare.prepare_tiny_assets(cache_dir, *, seed=0, ...)` does all of the above
  in one call (what an e2e entry's `prepare()` runs) and returns the repo ids.
"""
