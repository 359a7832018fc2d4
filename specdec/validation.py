"""Argument checks for SpeculativeDecoder. Everything is checked before anything is decoded."""

from __future__ import annotations

import numbers
from typing import Sequence

import torch

from .models import max_positions


def _device(model) -> torch.device:
    return next(model.parameters()).device


def output_vocab(model) -> int:
    return model.get_output_embeddings().weight.shape[0]


def check_models(target, draft) -> None:
    td, dd = _device(target), _device(draft)
    if td != dd:
        raise ValueError(f"the target is on {td} but the draft is on {dd}; put both on one device")
    tv, dv = output_vocab(target), output_vocab(draft)
    if tv != dv:
        raise ValueError(f"the draft's vocabulary size ({dv}) differs from the target's ({tv}); speculative "
                         "decoding needs one shared vocabulary")
    for name, model in (("target", target), ("draft", draft)):
        types = getattr(model.config, "layer_types", None) or []
        if any(t != "full_attention" for t in types):
            raise ValueError(f"the {name} has non-full attention layers ({sorted(set(types))}); the engine builds "
                             "full causal masks only")


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
    if eos_token_id is None:
        eos_token_id = getattr(getattr(target, "generation_config", None), "eos_token_id", None)
    if eos_token_id is None:
        return []
    ids = [eos_token_id] if _is_int(eos_token_id) else list(eos_token_id)
    if not all(_is_int(t) and 0 <= int(t) < vocab for t in ids):
        raise ValueError(f"eos_token_id must be an id or ids in [0, {vocab}), got {eos_token_id!r}")
    return [int(t) for t in ids]
