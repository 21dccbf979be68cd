"""Build the tiny character-level tokenizer and 2-layer Qwen2 model, saved in Hugging Face format.

Loading note: transformers 5 loads the tokenizer of a `qwen2` model as `Qwen2Tokenizer`
(byte-level BPE over the saved vocabulary) whatever `tokenizer_config.json` says. On the task's
characters (digits, `+`, `-`, `=`) that gives the same ids as the tokenizer built here; other
characters (a space, letters) are dropped rather than mapped to `<unk>`. Load it the one way
everywhere (`AutoTokenizer.from_pretrained`) and keep task text to those characters.
"""

from __future__ import annotations

from pathlib import Path

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARS = "0123456789+-="


def vocabulary() -> dict[str, int]:
    """Token -> id: the four special tokens first (pad is 0), then one id per character."""
    return {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *CHARS))}


def build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    """A `PreTrainedTokenizerFast` that splits text into characters and prepends `<bos>`."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = vocabulary()
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # One token per character; Fuse joins them back without the spaces WordLevel would add.
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token=BOS, eos_token=EOS, pad_token=PAD, unk_token=UNK,
        padding_side="left",
    )


def build_config(*, hidden_size: int = 64, intermediate_size: int = 128, num_layers: int = 2,
                 num_heads: int = 4, num_kv_heads: int = 2, max_positions: int = 64):  # -> Qwen2Config
    """The Qwen2 config of the tiny model (untied embeddings: simpler to shard and to refit)."""
    from transformers import Qwen2Config

    vocab = vocabulary()
    return Qwen2Config(
        vocab_size=len(vocab), hidden_size=hidden_size, intermediate_size=intermediate_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=vocab[BOS], eos_token_id=vocab[EOS], pad_token_id=vocab[PAD],
    )


def build_tiny_model(out_dir: str | Path, *, seed: int = 0, hidden_size: int = 64,
                     intermediate_size: int = 128, num_layers: int = 2, num_heads: int = 4,
                     num_kv_heads: int = 2, max_positions: int = 64) -> Path:
    """Write tokenizer + randomly initialised `Qwen2ForCausalLM` (safetensors) to `out_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(hidden_size=hidden_size, intermediate_size=intermediate_size,
                          num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
                          max_positions=max_positions)
    # Initialisation draws from the global generator; fork it so the caller's stream is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out, safe_serialization=True)
    build_tokenizer().save_pretrained(out)
    return out
