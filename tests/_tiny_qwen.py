"""A tiny Qwen2 causal LM (transformers) and a deterministic token batch source for trainer tests."""

from __future__ import annotations

import random

import numpy as np
import torch

VOCAB = 96


def tiny_qwen2(seed: int = 0) -> torch.nn.Module:
    """2 layers, hidden 64, 4 query heads over 2 KV heads: small enough for CPU ranks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        tie_word_embeddings=False, attention_dropout=0.0,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.config._attn_implementation = "eager"  # same math on every layout
    return model


def random_batch(rows: int, max_len: int = 12) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and a loss mask of ragged lengths, drawn from all three RNGs a trainer uses.

    Drawing from torch, numpy and python `random` makes a resume that restores any
    one of them wrongly produce different data, and so different losses.
    """
    lengths = np.random.randint(4, max_len + 1, size=rows)
    ids = torch.randint(0, VOCAB, (rows, max_len))
    mask = torch.zeros(rows, max_len)
    for r, n in enumerate(lengths):
        start = random.randint(1, 3)  # prompt tokens carry no loss
        mask[r, start:int(n)] = 1.0
    return ids, mask


def token_losses(model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token cross-entropy per position and the mask aligned with it."""
    logits = model(input_ids=ids).logits[:, :-1].float()
    targets = ids[:, 1:]
    loss = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view(targets.shape)
    return loss, mask[:, 1:]


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


# What trainer-test ranks import: loaded once in the forkserver, not once per rank.
RANK_MODULES = (
    "transformers.models.qwen2.modeling_qwen2",
    "torch.distributed.checkpoint",
    "torch.distributed.fsdp",
    "torch.distributed.tensor.parallel",
    "numpy",
)
