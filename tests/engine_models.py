"""Shared tiny models and reference outputs for the engine tests, built once per session (seeded)."""

from __future__ import annotations

import functools
import math
import random

import torch

from specdec import SpeculativeDecoder
from specdec.models import agreeing_draft, tiny_model, unrelated_draft
from specdec.scheduling.control import Plan, SpeculationController

VOCAB = 256

# The speculative schedulers: every greedy and sampling guarantee is tested on both.
SPEC_SCHEDULERS = ("eqspec", "exspec")


# How a test decoder chooses its widths: "fixed" K every step (the mechanics under test run every step),
# "scripted" (a seeded mix of plain steps and every width: a draft model skips steps and catches up), or
# "adaptive" (the real controller, from measured costs: on these tiny models it mostly decodes plainly).
CONTROLS = ("fixed", "scripted", "adaptive")


class ScriptedController(SpeculationController):
    """Widths from a seeded script whatever the costs: about a third of the steps plain, the rest of every width
    up to K + 1. Exactness must not depend on which widths a controller picks."""

    def __init__(self, k: int, seed: int = 0, plain_share: float = 0.35):
        super().__init__(k)
        self.rng = random.Random(seed)
        self.plain_share = plain_share

    def plan(self, rows, keys, *, catch_up: int = 0, horizon: float = math.inf, remaining=None) -> Plan:
        offer = [min(len(k), self.k) for k in keys]
        width = 1 if self.rng.random() < self.plain_share else self.rng.randint(2, self.k + 1)
        width = min(width, max(offer, default=0) + 1)
        return self._finish(Plan(width, [min(n, width - 1) for n in offer], 0.0, 0.0), rows, keys)

    def keep_drafting(self, plan, drafted, keys, position_keys) -> bool:
        return drafted < plan.width - 1


def decoder(target_model, drafter, scheduler: str = "eqspec", window: int | None = None, control: str = "fixed",
            **kwargs):
    """A SpeculativeDecoder; for EXSPEC, `window` (default 32) is its pool size; control: see CONTROLS."""
    if scheduler == "exspec" and window is not None:
        kwargs["window"] = window
    if control == "scripted":
        kwargs["controller"] = ScriptedController(kwargs.get("num_draft_tokens", 4), seed=len(kwargs))
    kwargs.setdefault("adaptive", control == "adaptive")
    return SpeculativeDecoder(target_model, drafter, scheduler=scheduler, **kwargs)


@functools.lru_cache(maxsize=None)
def target(family: str) -> torch.nn.Module:
    return tiny_model(family, vocab_size=VOCAB, hidden_size=64, num_layers=2, seed=11)


@functools.lru_cache(maxsize=None)
def draft(family: str, kind: str) -> torch.nn.Module:
    """kind "agree": another family carrying the target's weights plus noise (a noisy GPT-2 for GPT-2, which
    has no twin); "unrelated": random weights of another family, same vocabulary."""
    t = target(family)
    if kind == "agree":
        return agreeing_draft(t, noise=0.02, seed=5)
    other = {"llama": "gpt2", "qwen2": "llama", "gpt2": "llama"}[family]
    return unrelated_draft(t, other, num_layers=1, seed=23)


def prompts(lengths, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=g).tolist() for n in lengths]


@functools.lru_cache(maxsize=None)
def _reference(family: str, prompt: tuple[int, ...], max_new: int, eos: int | None) -> tuple[int, ...]:
    model = target(family)
    extra = {"eos_token_id": eos, "pad_token_id": eos} if eos is not None else {}
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=max_new, **extra)
    return tuple(out[0, len(prompt):].tolist())


def reference(family: str, prompts_, max_new: int, eos: int | None = None) -> list[list[int]]:
    """target.generate on each prompt alone (greedy, float32 CPU): the ground truth for greedy equivalence."""
    return [list(_reference(family, tuple(p), max_new, eos)) for p in prompts_]
