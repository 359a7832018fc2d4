"""Argument checks for SpeculativeDecoder and which models the engine supports. Everything is checked before
anything is decoded."""

from __future__ import annotations

import numbers
from typing import Sequence

import torch

from .kv.geometry import (SUPPORTED_LAYER_TYPES, attention_windows, max_positions, model_device, output_vocab,
                          text_config)


# Attention implementations that apply the engine's explicit 4-D mask (padding, holes, causality per row) as given.
# flash_attention_* take only a 2-D padding mask and assume contiguous rows; flex_attention adds a tensor mask to
# the scores (a boolean one as 0/1, transformers.integrations.flex_attention) rather than masking with it; the
# paged and kernel variants build their own masks: none of them would honour the engine's holes and offsets.
MASKED_ATTENTION = ("sdpa", "eager")


def _window_binds(window, limit) -> bool:
    """Whether a sliding window changes attention: it does unless it covers every position the model can hold."""
    if window is None:
        return False
    if isinstance(window, numbers.Integral) and not isinstance(window, bool) and limit is not None:
        return int(window) < limit
    return True  # no position limit, or a value we cannot read: assume it slides


def attention_support(model) -> str | None:
    """Why the engine cannot decode `model` exactly, or None when it can.

    The engine builds every forward's masks itself: each query sees every real column of its row up to itself
    (padding and realignment holes masked), and on sliding-window layers only the last `window` positions
    (specdec.kv.geometry.attention_windows). That is the model's own attention only if
      - every layer is full or sliding-window attention in a form the engine builds: `layer_types` of
        "full_attention" and "sliding_attention" with one `sliding_window` (Qwen2 derives them from
        use_sliding_window and max_window_layers; Qwen3, Gemma 2/3, gpt-oss list them), or a `sliding_window`
        the model applies to every layer (Mistral, Phi-3, Starcoder2; `use_sliding_window=False` switches it
        off). Refused: other layer types (chunked attention...), per-layer windows of other sizes (a list, or
        attention modules carrying another `sliding_window`), GPT-Neo's "local" `attention_layers`;
      - the attention implementation applies a custom 4-D mask: sdpa or eager (MASKED_ATTENTION).
    """
    config = getattr(model, "config", None)
    if config is None:
        return None
    text = text_config(model.config)
    limit = max_positions(model)
    missing = []
    impl = getattr(text, "_attn_implementation", None) or getattr(config, "_attn_implementation", None)
    if impl is not None and impl not in MASKED_ATTENTION:
        missing.append(f"its attention implementation {impl!r} does not apply the custom 4-D attention mask the "
                       f"engine passes every forward (only {' and '.join(MASKED_ATTENTION)} do); load it with "
                       f"attn_implementation='sdpa' (or 'eager')")
    mode, supported_window = attention_windows(model)
    types = getattr(text, "layer_types", None)
    if types is not None:
        other = [t for t in types if t not in SUPPORTED_LAYER_TYPES]
        if other:
            missing.append(f"{len(other)} of {len(types)} layers are neither full nor sliding-window attention "
                           f"(layer_types: {', '.join(sorted(set(map(str, other))))})")
    local = [t for t in (getattr(text, "attention_layers", None) or []) if t == "local"]
    if local:
        missing.append(f"{len(local)} layers attend locally (attention_layers 'local', window_size="
                       f"{getattr(text, 'window_size', None)})")
    window = getattr(text, "sliding_window", None)
    # attention modules that carry their own window: the model sets it per layer (from layer_types)
    per_layer = {name: getattr(m, "sliding_window") for name, m in model.named_modules()
                 if m is not model and hasattr(m, "sliding_window")}
    if isinstance(window, (list, tuple)):
        if any(_window_binds(w, limit) for w in window):
            missing.append(f"per-layer sliding windows (sliding_window={list(window)})")
    elif (mode is None and _window_binds(window, limit) and getattr(text, "use_sliding_window", True) is not False
          and not (types is not None and per_layer)):
        # Where layer_types exist and the layers carry their own windows, layer_types decide (checked above;
        # Qwen2 derives them from max_window_layers). Without layer_types, a Qwen2-style max_window_layers says
        # which layers slide (those from it on); else the window applies to every layer (Mistral-style).
        first = getattr(text, "max_window_layers", None)
        layers = getattr(text, "num_hidden_layers", None)
        below = f", below the position limit of {limit}" if limit is not None else ""
        if types is None and isinstance(first, int) and isinstance(layers, int):
            if first < layers:
                missing.append(f"{layers - max(first, 0)} of {layers} layers attend to a sliding window "
                               f"(use_sliding_window, sliding_window={window}{below}, max_window_layers={first})")
        else:
            missing.append(f"every layer attends to a sliding window (sliding_window={window}{below})")
    # attention modules that carry the supported window are the layers the engine's windowed mask serves
    binding = sorted({w for w in per_layer.values() if _window_binds(w, limit) and w != supported_window}, key=str)
    if binding and not any("sliding" in m for m in missing):
        layers = [name for name, w in per_layer.items() if _window_binds(w, limit)]
        missing.append(f"{len(layers)} attention layers have their own sliding_window="
                       f"{', '.join(map(str, binding))} ({layers[0]}{', ...' if len(layers) > 1 else ''})")
    if not missing:
        return None
    model_type = getattr(config, "model_type", None) or type(model).__name__
    sliding = any("sliding" in m or "full attention" in m or "locally" in m for m in missing)
    return (f"the engine cannot decode this {model_type} model exactly: {'; '.join(missing)}. It builds full "
            "causal attention masks over all of a row's cached tokens only"
            + ("; of sliding windows it builds one window size, as layer_types or an every-layer sliding_window "
               "sets it" if sliding else ""))


def check_attention(model, name: str) -> None:
    """ValueError unless the engine supports `model`'s attention (see attention_support); name: "target" or
    "draft"."""
    reason = attention_support(model)
    if reason is not None:
        raise ValueError(f"the {name} is not supported: {reason}")


def check_models(target, draft) -> None:
    """A draft model for `target`: one device, one vocabulary, and attention the engine supports."""
    td, dd = model_device(target), model_device(draft)
    if td != dd:
        raise ValueError(f"the target is on {td} but the draft is on {dd}; put both on one device")
    tv, dv = output_vocab(target), output_vocab(draft)
    if tv != dv:
        raise ValueError(f"the draft's vocabulary size ({dv}) differs from the target's ({tv}); speculative "
                         "decoding needs one shared vocabulary")
    check_attention(draft, "draft")


def _is_int(x) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool) or (isinstance(x, torch.Tensor) and x.ndim == 0
                                                              and not x.is_floating_point() and x.dtype != torch.bool)


def encode_prompts(prompts, tokenizer, target, max_new_tokens, batch_size) -> list[list[int]]:
    if isinstance(prompts, (str, torch.Tensor)) or not isinstance(prompts, Sequence):
        raise ValueError(f"prompts must be a list of prompts (token-id lists or strings), got {type(prompts).__name__}")
    if not _is_int(max_new_tokens) or int(max_new_tokens) < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not _is_int(batch_size) or int(batch_size) < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    max_new_tokens = int(max_new_tokens)
    vocab = target.get_input_embeddings().weight.shape[0]
    limit = max_positions(target)
    out = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise ValueError(f"prompt {i} is a string but no tokenizer was given")
            p = tokenizer(p)["input_ids"]
        if isinstance(p, torch.Tensor):
            if p.ndim != 1 or p.is_floating_point():
                raise ValueError(f"prompt {i} must be a 1-D integer tensor, got {tuple(p.shape)} {p.dtype}")
            p = p.tolist()
        if not isinstance(p, Sequence) or not all(_is_int(t) for t in p):
            raise ValueError(f"prompt {i} must be a sequence of int token ids, got {p!r:.80}")
        p = [int(t) for t in p]
        if not p:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        bad = [t for t in p if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab}): {bad[:5]}")
        if limit is not None and len(p) + max_new_tokens > limit:
            raise ValueError(f"prompt {i} has {len(p)} tokens; with max_new_tokens={max_new_tokens} that is "
                             f"{len(p) + max_new_tokens}, beyond the target's position limit of {limit}")
        out.append(p)
    return out


def eos_ids(eos_token_id, target, vocab: int) -> list[int]:
    """An id, a sequence of ids (a list, a tuple, a 1-D integer tensor), [] for none, or None for the target's
    generation_config.eos_token_id."""
    source = "eos_token_id"
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
        source = "the target's generation_config.eos_token_id"
    if eos_token_id is None:
        return []
    if _is_int(eos_token_id):
        ids = [eos_token_id]
    elif isinstance(eos_token_id, torch.Tensor) and eos_token_id.ndim == 1:
        ids = list(eos_token_id)
    elif isinstance(eos_token_id, Sequence) and not isinstance(eos_token_id, (str, bytes)):
        ids = list(eos_token_id)
    else:
        ids = None
    if ids is None or not all(_is_int(t) and 0 <= int(t) < vocab for t in ids):
        raise ValueError(f"{source} must be an int token id or a list of them, each in [0, {vocab}) ([] for no "
                         f"EOS), got {eos_token_id!r}")
    return [int(t) for t in ids]


# torch.Generator.manual_seed takes what fits in 64 bits, signed or unsigned
SEED_RANGE = (-(2 ** 63), 2 ** 64 - 1)


def check_seed(seed) -> int | None:
    if seed is None:
        return None
    if not _is_int(seed) or not SEED_RANGE[0] <= int(seed) <= SEED_RANGE[1]:
        raise ValueError(f"seed must be None or an int in [-2**63, 2**64 - 1], got {seed!r}")
    return int(seed)


def check_progress(progress) -> None:
    if progress is not None and not callable(progress):
        raise ValueError(f"progress must be None or a callable taking a prompt index, got {progress!r}")
