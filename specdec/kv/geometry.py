"""What the engine needs to know about a model's shape: layers, KV heads, head size, vocabulary, position limit,
device. One place for these lookups, so every layer of the engine reads a config the same way."""

from __future__ import annotations

import torch


def text_config(config):
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def kv_geometry(config) -> tuple[int, int, int]:
    """(num_layers, kv_heads, head_dim) of a decoder config (Llama/Qwen-style or GPT-2-style names)."""
    config = text_config(config)
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer")
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head")
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd")
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return layers, kv_heads, head_dim


def max_positions(model) -> int | None:
    """The longest sequence the model's position embeddings allow, or None when the config sets no limit."""
    config = text_config(model.config)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def output_vocab(model) -> int:
    """Rows of the output embedding: the size of the distributions the model's logits describe."""
    return model.get_output_embeddings().weight.shape[0]


def input_vocab(model) -> int:
    """Rows of the input embedding: the ids a prompt may hold."""
    return model.get_input_embeddings().weight.shape[0]


def model_device(model) -> torch.device:
    return next(model.parameters()).device


def model_dtype(model) -> torch.dtype:
    return next(model.parameters()).dtype


def parameter_count(model) -> int:
    return sum(p.numel() for p in model.parameters())
