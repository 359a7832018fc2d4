"""Models for the apps: a local Hugging Face target folder (or the embedded demo pair) and the drafter a command
line asks for (a draft folder, a cheap dtype copy of the target, or prompt-lookup n-grams), plus the cheap checks
of such flags that run before any model is loaded."""

from __future__ import annotations

import os

import torch

from ..drafting.early_exit import EarlyExitDrafter
from ..drafting.ngram import NgramDrafter
from ..kv.geometry import kv_geometry
from ..models.hf import cheap_copy, check_tokenizers_match, load_causal_lm

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def folder_name(path) -> str:
    return os.path.basename(os.path.normpath(str(path)))


def check_model_folder(path: str | None, flag: str) -> None:
    """What load_causal_lm would refuse first, without loading anything: a missing path, a file, no config.json."""
    if path is None:
        return
    folder = os.path.expanduser(str(path))
    if not os.path.exists(folder):
        raise ValueError(f"{flag} {path!r}: model folder does not exist (no model hub is used: give a local "
                         f"Hugging Face folder with config.json, weights and tokenizer files)")
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path!r} is a file, not a Hugging Face model folder")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(f"{flag} {path!r} has no config.json: not a Hugging Face model folder")


def check_drafter_flags(target: str | None, draft: str | None, drafter: str, draft_dtype: str | None,
                        exit_layer: int | None = None) -> None:
    """One drafter per command line: --draft DIR, --draft-dtype D, --drafter ngram or --drafter early-exit, never
    two of them; --exit-layer only with --drafter early-exit."""
    if draft and not target:
        raise ValueError("--draft needs --target (the embedded pair brings its own draft)")
    if drafter == "ngram" and (draft or draft_dtype):
        given = "--draft" if draft else "--draft-dtype"
        raise ValueError(f"--drafter ngram drafts without a model: drop {given} (or drop --drafter ngram)")
    if drafter == "early-exit" and (draft or draft_dtype):
        given = "--draft" if draft else "--draft-dtype"
        raise ValueError(f"--drafter early-exit drafts with the target's own layers: drop {given}")
    if exit_layer is not None and drafter != "early-exit":
        raise ValueError("--exit-layer is the depth of --drafter early-exit: add --drafter early-exit or drop it")
    if exit_layer is not None and exit_layer < 1:
        raise ValueError(f"--exit-layer must be >= 1, got {exit_layer}")
    if draft and draft_dtype:
        raise ValueError("--draft DIR and --draft-dtype are two draft models: give one")
    check_model_folder(target, "--target")
    check_model_folder(draft, "--draft")


def early_exit_drafter(target, layers: int | None = None):
    """(EarlyExitDrafter over the target's first `layers` layers, description); None: a quarter of its layers.
    A bad count is a ValueError naming --exit-layer."""
    layers = layers or max(1, kv_geometry(target.config)[0] // 4)
    try:
        return EarlyExitDrafter(target, layers), f"its first {layers} layers as early exit (its own cache)"
    except ValueError as e:
        raise ValueError(f"--exit-layer {layers}: {e}") from None


def load_draft(target, tokenizer, *, draft: str | None = None, drafter: str = "model",
               draft_dtype: str | None = "float16", device="cpu", exit_layer: int | None = None):
    """(draft model or drafter, description) for a target loaded from a folder: the --draft folder, the n-gram
    drafter, the target's own first exit_layer layers (default: a quarter of them), or a copy of the target's
    weights in draft_dtype."""
    if drafter == "ngram":
        return NgramDrafter(), "n-gram drafter"
    if drafter == "early-exit":
        return early_exit_drafter(target, exit_layer)
    if draft:
        model, draft_tokenizer = load_causal_lm(draft, device=device)
        check_tokenizers_match(tokenizer, draft_tokenizer)
        return model, folder_name(draft)
    if draft_dtype:
        return cheap_copy(target, DTYPES[draft_dtype]), f"{draft_dtype} copy"
    raise ValueError("--target needs a drafter: --draft DIR, --draft-dtype float16, or --drafter ngram")
