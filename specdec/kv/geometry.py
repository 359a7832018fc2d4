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


# Layer types whose masks the engine builds itself; a model with any other kind of layer is refused.
SUPPORTED_LAYER_TYPES = ("full_attention", "sliding_attention")


def attention_windows(model) -> tuple[str | None, int | None]:
    """How the model's layers attend, as (mode, window):
        (None, None)           every layer attends to the whole causal prefix;
        ("mapping", w)         layer_types mixes "full_attention" and "sliding_attention" layers of window w, and
                               the model takes a mapping from layer type to mask (Qwen2, Qwen3, Gemma 2/3, gpt-oss);
        ("all", w)             every layer slides over w (Mistral-style: sliding_window on a model without
                               layer_types), so the model takes one mask.
    A window of w lets a query at position p see keys at positions p - w + 1 .. p, as transformers' masks do;
    positions count real tokens, so padding and holes in the engine's cache never use up a window."""
    config = text_config(model.config)
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None)
    if types is not None:
        if "sliding_attention" in types and isinstance(window, int):
            return "mapping", window
        return None, None
    # Every layer slides only where the model's own config declares the window (Mistral, Phi-3, Starcoder2) and
    # no layer_types or max_window_layers says which layers do: a window set on another architecture's config is
    # not read by its model.
    native = "sliding_window" in getattr(type(config), "__annotations__", {}) or hasattr(type(config), "sliding_window")
    limit = max_positions(model)
    if (native and isinstance(window, int) and not isinstance(window, bool)
            and getattr(config, "max_window_layers", None) is None
            and getattr(config, "use_sliding_window", True) is not False and (limit is None or window < limit)):
        return "all", window
    return None, None
